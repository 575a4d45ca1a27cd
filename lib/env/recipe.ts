/**
 * What an environment is made of. A recipe is plain data so it can be stored
 * with the env (for provenance) and validated before anything runs.
 */
import { existsSync, statSync } from 'node:fs';
import path from 'node:path';
import { EnvError } from './errors.js';

/** One install step, run in order inside the build sandbox. */
export type EnvStep =
  /** A local package directory on the host: `pip install --no-index --no-build-isolation --no-deps`. */
  | { package: string }
  /** An editable install of a directory of the repo ('.' is the repo itself). */
  | { editable: string }
  /** Wheels from a host directory: the named requirements, or every *.whl in it. */
  | { wheels: string; packages?: string[] }
  /** A shell command (bash -c) with the venv activated, in the repo if there is one. */
  | { run: string };

export interface RepoSource {
  /** A local git repository path or a URL. */
  source: string;
  /** Commit (sha, tag or branch) to check out. */
  commit: string;
}

export interface EnvRecipe {
  /** Free-form label kept in the manifest. */
  name?: string;
  /** Base interpreter: an absolute path, or a version like '3.11'. */
  python: string;
  /** Where the venv lives in every sandbox, and so where it is built (default /opt/venv). */
  venvPath?: string;
  /** The repository, checked out at `repoPath` during the build and packed after it. */
  repo?: RepoSource;
  /** Where the repo lives in every sandbox (default /testbed). */
  repoPath?: string;
  steps?: EnvStep[];
  /** Extra variables for every build step. */
  env?: Record<string, string>;
  /** Per-step limit (default 10 minutes). */
  stepTimeoutMs?: number;
  /**
   * The venv sees the base interpreter's packages (`venv
   * --system-site-packages`). Offline, that is how a test runner installed
   * in the base (pytest) reaches the venv. A base that has pip lends it too:
   * no ensurepip (3.7 s and 26 MB per venv); `pip`/`pip3` in the venv run
   * `python -m pip`, which installs into the venv. Default false.
   */
  systemSitePackages?: boolean;
  /** Network during the build: 'none' (default; PIP_NO_INDEX=1) or 'host' (e.g. to reach a package index). */
  network?: 'none' | 'host';
}

export const DEFAULT_VENV_PATH = '/opt/venv';
export const DEFAULT_REPO_PATH = '/testbed';

/** An absolute, normalised path that will exist inside sandboxes. */
export function checkEnvPath(what: string, p: unknown): string {
  if (typeof p !== 'string' || !p.startsWith('/') || p.includes('\0') || p.split('/').includes('..'))
    throw new EnvError(`${what}: ${JSON.stringify(p)} must be an absolute path without '..'`);
  const norm = path.posix.normalize(p).replace(/\/+$/, '');
  if (norm === '' || norm === '/') throw new EnvError(`${what}: must not be the root directory`);
  // These are where the sandbox's own mounts live; an env there would hide them.
  for (const reserved of ['/proc', '/dev', '/tmp', '/work', '/usr', '/etc', '/bin', '/sbin', '/lib', '/lib64'])
    if (norm === reserved || norm.startsWith(`${reserved}/`)) throw new EnvError(`${what}: ${norm} is inside ${reserved}, which the sandbox itself provides`);
  return norm;
}

function hostDir(what: string, p: unknown): string {
  if (typeof p !== 'string' || !path.isAbsolute(p)) throw new EnvError(`${what}: ${JSON.stringify(p)} must be an absolute host path`);
  if (!existsSync(p) || !statSync(p).isDirectory()) throw new EnvError(`${what}: ${p} is not a directory`);
  return path.resolve(p);
}

export interface CheckedRecipe {
  name?: string;
  python: string;
  venvPath: string;
  repo?: RepoSource;
  repoPath?: string;
  steps: EnvStep[];
  env: Record<string, string>;
  stepTimeoutMs: number;
  systemSitePackages: boolean;
  network: 'none' | 'host';
}

/** Validates a recipe up front, so a typo never costs a half-built venv. */
export function checkRecipe(recipe: EnvRecipe): CheckedRecipe {
  if (typeof recipe !== 'object' || recipe === null) throw new EnvError('recipe: must be an object');
  if (typeof recipe.python !== 'string' || recipe.python === '') throw new EnvError('recipe.python: needs an interpreter path or a version like "3.11"');
  const venvPath = checkEnvPath('recipe.venvPath', recipe.venvPath ?? DEFAULT_VENV_PATH);
  const repoPath = recipe.repo ? checkEnvPath('recipe.repoPath', recipe.repoPath ?? DEFAULT_REPO_PATH) : undefined;
  if (repoPath && (repoPath === venvPath || repoPath.startsWith(`${venvPath}/`) || venvPath.startsWith(`${repoPath}/`)))
    throw new EnvError(`recipe: venvPath ${venvPath} and repoPath ${repoPath} must not contain each other`);
  if (recipe.repo && (typeof recipe.repo.source !== 'string' || typeof recipe.repo.commit !== 'string'))
    throw new EnvError('recipe.repo: needs { source, commit }');
  const steps = recipe.steps ?? [];
  if (!Array.isArray(steps)) throw new EnvError('recipe.steps: must be an array');
  const checked = steps.map((s, i): EnvStep => {
    const at = `recipe.steps[${i}]`;
    const keys = typeof s === 'object' && s !== null ? Object.keys(s) : [];
    if ('package' in s && keys.length === 1) return { package: hostDir(`${at}.package`, s.package) };
    if ('editable' in s && keys.length === 1) {
      if (!recipe.repo) throw new EnvError(`${at}: an editable install needs recipe.repo`);
      const rel = path.posix.normalize(String(s.editable));
      if (path.posix.isAbsolute(rel) || rel.split('/').includes('..')) throw new EnvError(`${at}.editable: ${s.editable} must be a path inside the repo`);
      return { editable: rel };
    }
    if ('wheels' in s && keys.every((k) => k === 'wheels' || k === 'packages')) {
      const dir = hostDir(`${at}.wheels`, s.wheels);
      if (s.packages !== undefined && (!Array.isArray(s.packages) || !s.packages.every((p) => typeof p === 'string' && p !== '')))
        throw new EnvError(`${at}.packages: must be a list of requirement names`);
      return s.packages ? { wheels: dir, packages: s.packages } : { wheels: dir };
    }
    if ('run' in s && keys.length === 1 && typeof s.run === 'string' && s.run.trim() !== '') return { run: s.run };
    throw new EnvError(`${at}: ${JSON.stringify(s)} is not one of { package }, { editable }, { wheels, packages? }, { run }`);
  });
  for (const [k, v] of Object.entries(recipe.env ?? {}))
    if (typeof v !== 'string' || k === '' || k.includes('=')) throw new EnvError(`recipe.env.${k}: must be a name with a string value`);
  const stepTimeoutMs = recipe.stepTimeoutMs ?? 10 * 60_000;
  if (typeof stepTimeoutMs !== 'number' || !(stepTimeoutMs > 0)) throw new EnvError(`recipe.stepTimeoutMs: ${JSON.stringify(recipe.stepTimeoutMs)} must be a positive number of milliseconds`);
  if (recipe.systemSitePackages !== undefined && typeof recipe.systemSitePackages !== 'boolean')
    throw new EnvError(`recipe.systemSitePackages: ${JSON.stringify(recipe.systemSitePackages)} must be true or false`);
  const network = recipe.network ?? 'none';
  if (network !== 'none' && network !== 'host') throw new EnvError(`recipe.network: ${JSON.stringify(recipe.network)} must be 'none' or 'host'`);
  return {
    ...(recipe.name !== undefined ? { name: recipe.name } : {}),
    python: recipe.python,
    venvPath,
    ...(recipe.repo ? { repo: recipe.repo, repoPath } : {}),
    steps: checked,
    env: { ...(recipe.env ?? {}) },
    stepTimeoutMs,
    systemSitePackages: recipe.systemSitePackages ?? false,
    network,
  };
}
