/**
 * The recipe index: which env a recipe already became, so that building the
 * same recipe twice (`env build`, `prepare`, the API) returns the env built
 * the first time instead of building and storing it again. An env's id is
 * derived from its layers' digests, known only after a build; this index
 * maps what is known before one (the recipe) to that id.
 *
 * A recipe's key is everything that decides what a build produces:
 * - the base interpreter's identity: its path, version and the binary it
 *   resolves to (device, inode, size, mtime), so a reinstalled Python at the
 *   same path is a new key;
 * - the venv and repo paths, the steps in order, the variables, the network
 *   and whether the base's packages are visible;
 * - the inputs' digests: each `package` and `wheels` directory's content
 *   (digestDirectory), and the repo's commit resolved to a full sha;
 * - whether the build keeps the repo layer, and its own times.
 * Not in the key: the env's name (a label), the step timeout, where the
 * build runs. A recipe whose repo is a URL at a branch or tag (not a full
 * sha) has no key: the branch may move, and resolving it needs the network,
 * so such a build always runs.
 *
 * Layout: <store>/envs/recipes/<key>.json -> { envId, ... }, and
 * <store>/envs/recipes/locks/<key>.lock (build-once across processes). An
 * entry whose env was removed (removeEnv) or whose layers are gone is
 * ignored and rebuilt over.
 */
import { execFile } from 'node:child_process';
import { mkdirSync, promises as fsp, statSync } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { sha256Hex } from '../files/hash.js';
import { acquireLock, type FileLock } from '../files/lock.js';
import { digestDirectory, type LayerStore } from '../layers/index.js';
import { EnvError } from './errors.js';
import { isRepoUrl } from './gitRepo.js';
import { envsDir, loadEnv, type Env } from './manifest.js';
import type { BasePython } from './python.js';
import type { CheckedRecipe, EnvStep } from './recipe.js';

/** Bumped when what a recipe builds changes, so entries of older builds are not reused. */
const RECIPE_INDEX_VERSION = 1;

export interface RecipeIndexEntry {
  envId: string;
  key: string;
  created: string;
  /** The recipe's name when it was built, for people reading the store. */
  name?: string;
}

function recipesDir(store: LayerStore): string {
  return path.join(envsDir(store.root), 'recipes');
}

/** The commit a local repository's `commit` names now; undefined for a URL at a movable name. */
async function resolvedCommit(source: string, commit: string): Promise<string | undefined> {
  if (/^[0-9a-f]{40}$/i.test(commit)) return commit.toLowerCase();
  if (isRepoUrl(source)) return undefined;
  try {
    const { stdout } = await promisify(execFile)('git', ['-C', path.resolve(source), 'rev-parse', '--verify', '--quiet', `${commit}^{commit}`]);
    return stdout.trim();
  } catch {
    // The build itself says why the commit cannot be found.
    return undefined;
  }
}

function interpreterIdentity(python: BasePython): unknown {
  const st = statSync(python.path); // follows pyenv's symlinks to the real binary
  return { path: python.path, version: python.version, prefix: python.prefix, binary: [st.dev, st.ino, st.size, st.mtimeMs] };
}

async function stepIdentity(step: EnvStep): Promise<unknown> {
  if ('package' in step) return { package: step.package, digest: (await digestDirectory(step.package)).digest };
  if ('wheels' in step) return { ...step, digest: (await digestDirectory(step.wheels)).digest };
  return step;
}

/**
 * The recipe's key, or undefined when the recipe cannot be keyed (see the
 * file comment). Reads every input directory: as costly as hashing them.
 */
export async function recipeKey(r: CheckedRecipe, python: BasePython, opts: { keepRepo: boolean; normalizeTimes: boolean }): Promise<string | undefined> {
  let repo: unknown = null;
  if (r.repo) {
    const sha = await resolvedCommit(r.repo.source, r.repo.commit);
    if (!sha) return undefined;
    repo = { source: isRepoUrl(r.repo.source) ? r.repo.source : path.resolve(r.repo.source), commit: sha, keep: opts.keepRepo };
  }
  const steps = [];
  for (const s of r.steps) steps.push(await stepIdentity(s));
  return sha256Hex(
    JSON.stringify({
      version: RECIPE_INDEX_VERSION,
      python: interpreterIdentity(python),
      venvPath: r.venvPath,
      repoPath: r.repoPath ?? null,
      repo,
      steps,
      env: Object.entries(r.env).sort(([a], [b]) => (a < b ? -1 : 1)),
      systemSitePackages: r.systemSitePackages,
      network: r.network,
      ...(opts.normalizeTimes ? {} : { buildTimes: true }),
    }),
  );
}

/** The env the recipe with this key became, if it is still whole in the store. */
export async function findIndexedEnv(store: LayerStore, key: string): Promise<Env | undefined> {
  let entry: RecipeIndexEntry;
  try {
    entry = JSON.parse(await fsp.readFile(path.join(recipesDir(store), `${key}.json`), 'utf8')) as RecipeIndexEntry;
  } catch {
    return undefined; // never built, or a torn entry: build
  }
  if (typeof entry.envId !== 'string') return undefined;
  return loadEnv(entry.envId, { store }).catch(() => undefined); // removed since: build again
}

export async function recordIndexedEnv(store: LayerStore, key: string, env: Env): Promise<void> {
  const dir = recipesDir(store);
  await fsp.mkdir(dir, { recursive: true });
  const entry: RecipeIndexEntry = { envId: env.id, key, created: new Date().toISOString(), ...(env.name !== undefined ? { name: env.name } : {}) };
  // Written then renamed: a reader never sees half an entry.
  const tmp = path.join(dir, `.${key}.${process.pid}.tmp`);
  await fsp.writeFile(tmp, `${JSON.stringify(entry, null, 2)}\n`);
  await fsp.rename(tmp, path.join(dir, `${key}.json`));
}

/** Build-once across processes: a second build of the same recipe waits for the first, then reuses it. */
export function lockRecipe(store: LayerStore, key: string, signal?: AbortSignal): Promise<FileLock> {
  const dir = path.join(recipesDir(store), 'locks');
  try {
    mkdirSync(dir, { recursive: true });
  } catch (err) {
    throw new EnvError(`recipe index ${dir}: ${(err as Error).message}`, { cause: err });
  }
  return acquireLock(path.join(dir, `${key}.lock`), { what: `recipe ${key.slice(0, 12)}`, ...(signal ? { signal } : {}) });
}
