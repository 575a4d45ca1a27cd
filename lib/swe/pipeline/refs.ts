/**
 * Names for layers: "repo R at commit C" maps to a layer digest. Layer digests are content hashes known only after a
 * build, so without this index every run would rebuild to find out.
 *
 * Layout: <store root>/refs/swe/<kind>/<key>.json, next to (never inside)
 * the store's own directories. A ref is a name, not a use: what keeps its
 * layer from gc is the store's pin (the env's for a venv, `swe repo <key>`
 * for a repo). A ref whose layer was removed from the store is ignored (and
 * rebuilt).
 */
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { sha256Hex } from '../../files/hash.js';
import { acquireLock, type FileLock } from '../../files/lock.js';
import type { Layer, LayerStore } from '../../layers/store.js';

/** Venvs are indexed by lib/env's recipe index; repos of a task by source and base commit here. */
export type RefKind = 'repo';

export interface LayerRef {
  digest: string;
  /** What it is, for people looking at the store. */
  description: string;
  created: string;
  [extra: string]: unknown;
}

export function hashKey(parts: unknown): string {
  return sha256Hex(JSON.stringify(parts));
}

function refDir(store: LayerStore, kind: RefKind): string {
  return join(store.root, 'refs', 'swe', kind);
}

/** The referenced layer if the ref and its layer both exist. */
export async function readRef(store: LayerStore, kind: RefKind, key: string): Promise<{ ref: LayerRef; layer: Layer } | undefined> {
  let ref: LayerRef;
  try {
    ref = JSON.parse(readFileSync(join(refDir(store, kind), `${key}.json`), 'utf8')) as LayerRef;
  } catch {
    return undefined; // missing or torn: rebuild
  }
  const layer = typeof ref.digest === 'string' ? await store.get(ref.digest).catch(() => undefined) : undefined;
  return layer ? { ref, layer } : undefined;
}

export function writeRef(store: LayerStore, kind: RefKind, key: string, ref: LayerRef): void {
  const dir = refDir(store, kind);
  mkdirSync(dir, { recursive: true });
  // Write then rename: a reader never sees half a ref.
  const tmp = join(dir, `.${key}.${process.pid}.tmp`);
  writeFileSync(tmp, `${JSON.stringify(ref, null, 2)}\n`);
  renameSync(tmp, join(dir, `${key}.json`));
}

/** Build-once across processes: two `prepare` runs never build the same venv twice at once. */
export function lockRef(store: LayerStore, kind: RefKind, key: string, signal?: AbortSignal): Promise<FileLock> {
  const dir = join(refDir(store, kind), 'locks');
  mkdirSync(dir, { recursive: true });
  return acquireLock(join(dir, `${key}.lock`), { what: `${kind} ${key.slice(0, 12)}`, ...(signal ? { signal } : {}) });
}
