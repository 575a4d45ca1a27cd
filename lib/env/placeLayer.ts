/**
 * Putting one layer at its path in a sandbox, three ways:
 *
 * - overlay: the store's read-only tree as lower, a private upper (the
 *   common, zero-copy case; the upper/work dirs are made by Sandbox.create in
 *   the sandbox's own private dir);
 * - overlay + relocation: as above, but the few files that embed the build
 *   path (from the manifest) are copied into a pre-made upper and rewritten
 *   there, so the merged view works at the new path while the store stays
 *   untouched;
 * - extract (the per-instance extraction baseline, extractBaseline.ts): the
 *   layer's archive, checked against the layer's digest, unpacked into a
 *   private tree (under the store's I/O budget), rewritten in place if
 *   relocated, and bound read-write.
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { extractArchive } from '../files/extract.js';
import { run } from '../files/proc.js';
import { relocateTree, type IoBudget, type Layer, type PrefixFile } from '../layers/index.js';
import type { Mount } from '../sandbox/index.js';
import { EnvError } from './errors.js';

/** A rewrite of `files` from one prefix to another. */
export interface Rewrite {
  from: string;
  to: string;
  files: readonly PrefixFile[];
}

export interface Placement {
  /** Sandbox.create `overlays` entry (plain overlay), or a full mount. */
  overlay?: { target: string; lower: string[] };
  mount?: Mount;
  rewritten: string[];
}

function neededRewrites(rewrites: Rewrite[]): Rewrite[] {
  return rewrites.filter((r) => r.from !== r.to && r.files.length > 0);
}

/** Copy one lower entry into the upper dir (parents made as plain dirs, which overlay merges). */
async function copyUp(lower: string, upper: string, rel: string): Promise<boolean> {
  const src = path.join(lower, rel);
  const dst = path.join(upper, rel);
  let st;
  try {
    st = await fsp.lstat(src);
  } catch {
    return false; // listed but absent: nothing to rewrite
  }
  await fsp.mkdir(path.dirname(dst), { recursive: true });
  if (st.isSymbolicLink()) await fsp.symlink(await fsp.readlink(src), dst);
  else if (st.isFile()) {
    await fsp.copyFile(src, dst);
    await fsp.chmod(dst, st.mode & 0o7777);
  } else return false;
  return true;
}

export async function placeOverlay(layer: Layer, target: string, rewrites: Rewrite[], scratch: () => Promise<string>): Promise<Placement> {
  const todo = neededRewrites(rewrites);
  if (todo.length === 0) return { overlay: { target, lower: [layer.path] }, rewritten: [] };
  const dir = await scratch();
  const upper = path.join(dir, 'upper');
  const work = path.join(dir, 'work');
  await fsp.mkdir(upper, { recursive: true });
  await fsp.mkdir(work);
  const copied = new Set<string>();
  for (const r of todo) for (const f of r.files) if (!copied.has(f.path) && (await copyUp(layer.path, upper, f.path))) copied.add(f.path);
  const rewritten: string[] = [];
  for (const r of todo) {
    const files = r.files.filter((f) => copied.has(f.path));
    // A rewritten .py gets a new mtime, so the lower's cached .pyc is seen
    // as stale and never used (it cannot be deleted from the read-only lower).
    rewritten.push(...(await relocateTree(upper, { from: r.from, to: r.to, files })).rewritten);
  }
  return { mount: { type: 'overlay', target, lower: [layer.path], upper, work }, rewritten };
}

export async function placeExtracted(
  layer: Layer,
  archive: string | undefined,
  target: string,
  rewrites: Rewrite[],
  dest: string,
  budget: IoBudget | undefined,
): Promise<Placement> {
  await fsp.mkdir(dest, { recursive: true });
  const bytes = archive ? (await fsp.stat(archive)).size : layer.manifest.size;
  const ticket = await budget?.acquire(bytes, { label: `extract ${layer.digest.slice(0, 12)}` });
  try {
    // The layer's digest is its archive's sha256: an archive changed on disk
    // since (corrupted, or swapped for other content) is refused before
    // anything of it is unpacked.
    if (archive) await extractArchive(archive, dest, { expectDigest: layer.digest, onProgress: (done) => ticket?.progress(done) });
    else {
      // No archive kept: copy the tree, giving back the write bits the store removed.
      await run('cp', ['-a', '--no-preserve=ownership', `${layer.path}/.`, dest], { what: `extract layer ${layer.digest}` });
      await run('chmod', ['-R', 'u+w', dest], { what: `extract layer ${layer.digest}` });
    }
  } catch (err) {
    throw new EnvError(`extract layer ${layer.digest} (${layer.manifest.source}) into ${dest}: ${(err as Error).message}`, { cause: err });
  } finally {
    await ticket?.release();
  }
  const rewritten: string[] = [];
  for (const r of neededRewrites(rewrites)) rewritten.push(...(await relocateTree(dest, r)).rewritten);
  return { mount: { type: 'bind', source: dest, target }, rewritten };
}
