/**
 * Env manifests: the small JSON record that ties an env's layers together
 * (venv, repo, base interpreter, mount paths) so `loadEnv(id)` works in a
 * later process. They live next to the layer store, in `<store>/envs/`:
 *
 *   envs/<id>.json                    the manifest
 *   envs/archives/<digest>.tar.zst    the layer's archive (the shippable form,
 *                                     and the extraction baseline's source)
 *   envs/build/<random>/              builds in progress (removed after)
 */
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import type { Layer, LayerStore, PrefixFile } from '../layers/index.js';
import { codeOf } from '../errors.js';
import { sha256Hex } from '../files/hash.js';
import { EnvError } from './errors.js';
import type { BasePython } from './python.js';
import type { EnvStep } from './recipe.js';

export interface EnvLayerRecord {
  /** Layer digest in the store (sha256 of the archive). */
  digest: string;
  /** Archive file, relative to the envs directory; absent if it was not kept. */
  archive?: string;
  archiveBytes?: number;
}

export interface EnvManifest {
  version: 1;
  id: string;
  name?: string;
  created: string;
  python: BasePython;
  venvPath: string;
  venv: EnvLayerRecord & {
    /** Venv files embedding repoPath (editable .pth, finders, direct_url.json): rewritten when the repo moves. */
    repoPrefixFiles: PrefixFile[];
  };
  /** Where the repo is in sandboxes; set without `repo` when the env was built with keepRepo: false. */
  repoPath?: string;
  repo?: EnvLayerRecord & { source: string; commit: string };
  steps: EnvStep[];
  /** Built with recipe.systemSitePackages: the venv sees the base's packages. */
  systemSitePackages?: true;
}

/** A built environment, with its layers resolved in the store. */
export interface Env {
  id: string;
  name?: string;
  venv: Layer;
  repo?: Layer;
  python: BasePython;
  venvPath: string;
  repoPath?: string;
  /** The store the layers (and archives) live in. */
  storeRoot: string;
  /** Absolute archive paths, when kept. */
  archives: { venv?: string; repo?: string };
  manifest: EnvManifest;
  /** Set by buildEnv when the recipe had been built already and this is that env. */
  reused?: boolean;
}

const ENV_ID = /^env-[0-9a-f]{24}$/;

export function envsDir(storeRoot: string): string {
  return path.join(storeRoot, 'envs');
}

export function archiveFileFor(storeRoot: string, digest: string): string {
  return path.join(envsDir(storeRoot), 'archives', `${digest}.tar.zst`);
}

/** Content-derived: the same layers at the same paths on the same interpreter are the same env. */
export function envIdOf(m: Omit<EnvManifest, 'id' | 'created' | 'version' | 'name' | 'steps'>): string {
  const key = JSON.stringify([m.venv.digest, m.repo?.digest ?? null, m.venvPath, m.repoPath ?? null, m.python.path, m.python.version]);
  return `env-${sha256Hex(key).slice(0, 24)}`;
}

export async function saveEnvManifest(storeRoot: string, manifest: EnvManifest): Promise<string> {
  const dir = envsDir(storeRoot);
  await fsp.mkdir(dir, { recursive: true });
  const file = path.join(dir, `${manifest.id}.json`);
  // Write then rename: a reader never sees half a manifest.
  const tmp = `${file}.tmp-${process.pid}`;
  await fsp.writeFile(tmp, `${JSON.stringify(manifest, null, 2)}\n`);
  await fsp.rename(tmp, file);
  return file;
}

/** The env `id` of `store`, with its layers; throws if a layer is gone (e.g. after gc). */
export async function loadEnv(id: string, opts: { store: LayerStore }): Promise<Env> {
  if (!ENV_ID.test(id)) throw new EnvError(`env ${JSON.stringify(id)}: not an env id (env-<24 hex>)`);
  const file = path.join(envsDir(opts.store.root), `${id}.json`);
  let manifest: EnvManifest;
  try {
    manifest = JSON.parse(await fsp.readFile(file, 'utf8')) as EnvManifest;
  } catch (err) {
    throw new EnvError(`env ${id}: cannot read ${file}: ${(err as Error).message}`, { cause: err });
  }
  return envFromManifest(manifest, opts.store);
}

export async function envFromManifest(manifest: EnvManifest, store: LayerStore): Promise<Env> {
  const venv = await store.get(manifest.venv.digest);
  if (!venv) throw new EnvError(`env ${manifest.id}: venv layer ${manifest.venv.digest} is not in the store ${store.root}`);
  const repo = manifest.repo ? await store.get(manifest.repo.digest) : undefined;
  if (manifest.repo && !repo) throw new EnvError(`env ${manifest.id}: repo layer ${manifest.repo.digest} is not in the store ${store.root}`);
  const abs = (rel: string | undefined) => (rel ? path.join(envsDir(store.root), rel) : undefined);
  const archives: Env['archives'] = {};
  const venvArchive = abs(manifest.venv.archive);
  const repoArchive = abs(manifest.repo?.archive);
  if (venvArchive) archives.venv = venvArchive;
  if (repoArchive) archives.repo = repoArchive;
  return {
    id: manifest.id,
    ...(manifest.name !== undefined ? { name: manifest.name } : {}),
    venv,
    ...(repo ? { repo } : {}),
    python: manifest.python,
    venvPath: manifest.venvPath,
    ...(manifest.repoPath ? { repoPath: manifest.repoPath } : {}),
    storeRoot: store.root,
    archives,
    manifest,
  };
}

/** Every env recorded in the store (manifests whose layers are missing are skipped). */
export async function listEnvs(opts: { store: LayerStore }): Promise<Env[]> {
  let names: string[];
  try {
    names = await fsp.readdir(envsDir(opts.store.root));
  } catch {
    return [];
  }
  const out: Env[] = [];
  for (const n of names.sort()) {
    if (!n.endsWith('.json') || !ENV_ID.test(n.slice(0, -5))) continue;
    try {
      out.push(await loadEnv(n.slice(0, -5), opts));
    } catch {
      // layers collected: not usable, not listed
    }
  }
  return out;
}

/** The owner of an env's pin in the store: what keeps its layers from gc. */
export function envPinOwner(id: string): string {
  return `env ${id}`;
}

export function envPinLabel(m: Pick<EnvManifest, 'id' | 'name'>): string {
  return `env ${m.id}${m.name ? ` (${m.name})` : ''}`;
}

/**
 * Forgets the env `id`: its record goes, and its pin, so that its layers
 * go at the store's next gc unless something else uses them (another env,
 * prepared tasks). Sandboxes running on it keep their mounts. Throws if the
 * store has no such env (nor a pin of one whose build was cut short).
 */
export async function removeEnv(id: string, opts: { store: LayerStore }): Promise<void> {
  if (!ENV_ID.test(id)) throw new EnvError(`env ${JSON.stringify(id)}: not an env id (env-<24 hex>)`);
  const file = path.join(envsDir(opts.store.root), `${id}.json`);
  // The record first: nothing may find the env once its layers can go.
  const recorded = await fsp.rm(file).then(
    () => true,
    (err: unknown) => {
      if (codeOf(err) === 'ENOENT') return false;
      throw new EnvError(`env ${id}: cannot remove ${file}: ${(err as Error).message}`, { cause: err });
    },
  );
  const pinned = await opts.store.unpin(envPinOwner(id));
  if (!recorded && !pinned) throw new EnvError(`env ${id}: no such env in the store ${opts.store.root}`);
}
