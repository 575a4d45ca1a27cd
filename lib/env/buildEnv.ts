/**
 * Building an env: a venv made from a base interpreter and filled by the
 * recipe's steps, plus optionally the repo, each packed as a store layer.
 *
 * The build runs inside a Sandbox, for two reasons. Isolation: install
 * commands (setup.py, arbitrary `run` steps) see only the base interpreter
 * (read-only), the venv, the repo and the inputs (read-only), with no
 * network. Location: the venv is bound at `venvPath` and the repo at
 * `repoPath`, the very paths every later sandbox mounts them at, so shebangs,
 * `.pth` files and `pyvenv.cfg` are right without any relocation.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { removeTree } from '../files/fsTree.js';
import { sha256Hex } from '../files/hash.js';
import { normalizeTimes, scanForPrefix, type Layer, type LayerStore, type PinOptions, type PinRequest } from '../layers/index.js';
import { pinRequest } from '../layers/pins.js';
import { Sandbox, type BindMount } from '../sandbox/index.js';
import { shQuote } from '../shell/text.js';
import { EnvError } from './errors.js';
import { isRepoUrl, packRepoLayer } from './gitRepo.js';
import { basePythonMounts, venvVariables } from './layout.js';
import { envFromManifest, envIdOf, envPinLabel, envPinOwner, envsDir, saveEnvManifest, type Env, type EnvManifest } from './manifest.js';
import { packAsLayer, type PackedLayer } from './pack.js';
import { resolvePython, type BasePython } from './python.js';
import { findIndexedEnv, lockRecipe, recipeKey, recordIndexedEnv } from './recipeIndex.js';
import { DEFAULT_REPO_PATH, checkEnvPath, checkRecipe, type CheckedRecipe, type EnvRecipe, type EnvStep } from './recipe.js';

export interface BuildEnvOptions {
  store: LayerStore;
  /** Scratch space for the build (default <store>/envs/build); a fresh subdirectory is used and removed. */
  workRoot?: string;
  /** Keep the .tar.zst archives in <store>/envs/archives (default true): the shippable form of the env's layers. */
  keepArchives?: boolean;
  /** Output of every build command, as it is produced. */
  onOutput?: (step: string, text: string) => void;
  /** Where the build sandbox keeps its private dir (Sandbox.create's stateDir). */
  stateDir?: string;
  /**
   * Store the repo, as the build left it, as the env's repo layer (default
   * true). false: the repo only serves the build (editable installs point at
   * repoPath) and sandboxes mount a repo layer of their own there
   * (buildRepo, then createEnvSandbox's `repo`): one env, many commits.
   */
  keepRepo?: boolean;
  /**
   * Build even when the recipe index says this recipe was built already
   * (default false: the env built then is returned, `reused: true`). The new
   * env takes the recipe's place in the index.
   */
  rebuild?: boolean;
  /**
   * Set every time in the venv to LAYER_EPOCH before it is stored (default
   * true), .pyc files kept valid: identical files of two builds are then
   * stored once (lib/layers/times.ts). false keeps the build's own times.
   */
  normalizeTimes?: boolean;
  /**
   * Variables for every build step that are not part of the recipe: not in
   * its key (an env built with other values is reused) and not recorded with
   * the env. For where to fetch from, never what to install: e.g.
   * PIP_INDEX_URL of a package index served on a port that changes from one
   * run to the next. A name the recipe's `env` sets too is an error.
   */
  stepVariables?: Record<string, string>;
  signal?: AbortSignal;
}

/** Where build inputs are shown read-only inside the build sandbox. */
const INPUTS = '/msbx-build';
const PIP = ['-m', 'pip', 'install', '--no-index', '--no-build-isolation', '--no-deps', '--disable-pip-version-check', '--no-input'];

function describeStep(step: EnvStep): string {
  if ('package' in step) return `package ${step.package}`;
  if ('editable' in step) return `editable ${step.editable}`;
  if ('wheels' in step) return `wheels ${step.wheels}${step.packages ? ` (${step.packages.join(', ')})` : ''}`;
  return `run ${JSON.stringify(step.run)}`;
}

/** The command a step runs in the build sandbox, and the input mount it needs. */
function stepCommand(step: EnvStep, i: number, venvPath: string, repoPath: string | undefined): { argv: string[]; mount?: BindMount } {
  const py = `${venvPath}/bin/python`;
  if ('package' in step) {
    // pip builds in the source tree (setuptools writes build/ and *.egg-info
    // there), and the input is read-only: install from a private copy.
    const input = `${INPUTS}/${i}`;
    const copy = `/tmp/src/${i}-${path.basename(step.package)}`;
    const script = `mkdir -p /tmp/src && cp -a ${shQuote(input)} ${shQuote(copy)} && exec ${shQuote(py)} ${PIP.join(' ')} ${shQuote(copy)}`;
    return { argv: ['/bin/sh', '-c', script], mount: { type: 'bind', source: step.package, target: input, readOnly: true } };
  }
  if ('editable' in step) {
    const dir = step.editable === '.' ? repoPath! : path.posix.join(repoPath!, step.editable);
    return { argv: [py, ...PIP, '-e', dir] };
  }
  if ('wheels' in step) {
    const input = `${INPUTS}/${i}`;
    const mount: BindMount = { type: 'bind', source: step.wheels, target: input, readOnly: true };
    if (step.packages) return { argv: [py, ...PIP, '--find-links', input, ...step.packages], mount };
    const script = `set -- ${shQuote(input)}/*.whl; [ -e "$1" ] || { echo "no *.whl files in ${step.wheels}" >&2; exit 1; }; exec ${shQuote(py)} ${PIP.join(' ')} "$@"`;
    return { argv: ['/bin/sh', '-c', script], mount };
  }
  // bash, not sh: install commands (SWE-bench's among them) are written for it.
  return { argv: ['/bin/bash', '-c', step.run] };
}

function tail(text: string, lines = 25): string {
  return text.trim().split('\n').slice(-lines).join('\n');
}

/**
 * Build the env described by `recipe` into `opts.store` and record it
 * (`loadEnv(env.id)` finds it later), unless the recipe index has it
 * already (recipeIndex.ts): then the env built before comes back with
 * `reused: true`, at once. Throws EnvError naming the failing step with the
 * end of its output.
 */
export async function buildEnv(recipe: EnvRecipe, opts: BuildEnvOptions): Promise<Env> {
  const r = checkRecipe(recipe);
  for (const [k, v] of Object.entries(opts.stepVariables ?? {})) {
    if (typeof v !== 'string' || k === '' || k.includes('=') || k.includes('\0')) throw new EnvError(`stepVariables.${k}: must be a name with a string value`);
    if (k in r.env) throw new EnvError(`stepVariables.${k}: recipe.env sets it too; give it in one (recipe.env is part of the recipe's key, stepVariables not)`);
  }
  const python = resolvePython(r.python);
  const key = await recipeKey(r, python, { keepRepo: opts.keepRepo !== false, normalizeTimes: opts.normalizeTimes !== false });
  if (key === undefined) return build(r, python, opts);
  if (!opts.rebuild) {
    const found = await findIndexedEnv(opts.store, key);
    if (found) return { ...found, reused: true };
  }
  const lock = await lockRecipe(opts.store, key, opts.signal);
  try {
    if (!opts.rebuild) {
      const again = await findIndexedEnv(opts.store, key); // built by another process while we waited
      if (again) return { ...again, reused: true };
    }
    const env = await build(r, python, opts);
    await recordIndexedEnv(opts.store, key, env);
    return env;
  } finally {
    await lock.release();
  }
}

async function build(r: CheckedRecipe, python: BasePython, opts: BuildEnvOptions): Promise<Env> {
  const label = `env${r.name ? ` ${r.name}` : ''}`;
  const workRoot = path.resolve(opts.workRoot ?? path.join(envsDir(opts.store.root), 'build'));
  const signal = opts.signal ? { signal: opts.signal } : {};
  await fsp.mkdir(workRoot, { recursive: true });
  const work = await fsp.mkdtemp(path.join(workRoot, `${randomBytes(3).toString('hex')}-`));
  // The env's id comes from its layers' digests: until it is known, the
  // layers are pinned for this build, as long as this process lives.
  const building = `${label} build ${path.basename(work)}`;
  try {
    const venvDir = path.join(work, 'venv');
    const repoDir = path.join(work, 'repo');
    await fsp.mkdir(venvDir);
    let commit: string | undefined;
    if (r.repo) commit = (await packRepoLayer(r.repo.source, r.repo.commit, { dest: repoDir })).commit;

    const commands = r.steps.map((s, i) => stepCommand(s, i, r.venvPath, r.repoPath));
    const mounts: BindMount[] = [
      ...basePythonMounts(python),
      { type: 'bind', source: venvDir, target: r.venvPath },
      ...(r.repoPath ? [{ type: 'bind' as const, source: repoDir, target: r.repoPath }] : []),
      ...commands.flatMap((c) => (c.mount ? [c.mount] : [])),
    ];
    const sandbox = await Sandbox.create({
      mounts,
      env: {
        ...venvVariables(r.venvPath),
        PIP_NO_CACHE_DIR: '1',
        PIP_DISABLE_PIP_VERSION_CHECK: '1',
        ...(r.network === 'none' ? { PIP_NO_INDEX: '1' } : {}),
        ...opts.stepVariables,
        ...r.env,
      },
      cwd: r.repoPath ?? '/tmp',
      network: r.network,
      ...(opts.stateDir ? { stateDir: opts.stateDir } : {}),
    });
    try {
      const runStep = async (what: string, argv: string[]): Promise<void> => {
        const res = await sandbox.exec(argv, { timeout: r.stepTimeoutMs, ...signal });
        opts.onOutput?.(what, res.stdout + res.stderr);
        if (res.exitCode !== 0)
          throw new EnvError(`${label}: ${what} failed (${res.signal ? `signal ${res.signal}` : `exit ${res.exitCode}`}${res.timedOut ? `, timed out after ${r.stepTimeoutMs / 1000} s` : ''}):\n${tail(res.stderr || res.stdout)}`);
      };
      // The venv is made where it will be used: no path in it needs rewriting.
      const basePip = r.systemSitePackages && python.hasPip === true;
      const venvArgs = [...(r.systemSitePackages ? ['--system-site-packages'] : []), ...(basePip ? ['--without-pip'] : [])];
      await runStep(`creating the venv at ${r.venvPath} with ${python.path}`, [python.path, '-m', 'venv', ...venvArgs, r.venvPath]);
      if (basePip) await writePipCommands(venvDir, r.venvPath);
      for (const [i, c] of commands.entries()) await runStep(`step ${i} (${describeStep(r.steps[i]!)})`, c.argv);
      await runStep('checking the venv', [`${r.venvPath}/bin/python`, '-c', `import sys; assert sys.prefix == ${JSON.stringify(r.venvPath)}, sys.prefix`]);
    } finally {
      await sandbox.close();
    }

    if (opts.normalizeTimes !== false) await normalizeTimes(venvDir);
    // Editable installs write repoPath into the venv; recorded so a moved repo can be followed.
    const repoPrefixFiles = r.repoPath ? await scanForPrefix(venvDir, r.repoPath) : [];
    const keep = opts.keepArchives ?? true;
    const buildPin = { owner: building, label: `${label} (being built by process ${process.pid})`, whileAlive: true };
    const venv = await packAsLayer(venvDir, opts.store, { name: `${label} venv ${r.venvPath}`, prefix: r.venvPath, keepArchive: keep, pin: buildPin, ...signal });
    const repo =
      r.repo && opts.keepRepo !== false
        ? await packAsLayer(repoDir, opts.store, { name: `${label} repo ${r.repo.source}@${commit}`, prefix: r.repoPath!, keepArchive: keep, pin: building, ...signal })
        : undefined;
    const record = (p: PackedLayer) => ({ digest: p.layer.digest, ...withArchive({ ...p, archive: p.archive && path.relative(envsDir(opts.store.root), p.archive) }) });
    const body: Omit<EnvManifest, 'id' | 'created' | 'version' | 'name' | 'steps'> = {
      python,
      venvPath: r.venvPath,
      venv: { ...record(venv), repoPrefixFiles },
      ...(r.repoPath ? { repoPath: r.repoPath } : {}),
      ...(repo && r.repo ? { repo: { ...record(repo), source: r.repo.source, commit: commit! } } : {}),
    };
    const manifest: EnvManifest = {
      version: 1,
      id: envIdOf(body),
      ...(r.name !== undefined ? { name: r.name } : {}),
      created: new Date().toISOString(),
      ...body,
      steps: r.steps,
      ...(r.systemSitePackages ? { systemSitePackages: true } : {}),
    };
    // Pinned before it is recorded: a crash in between leaves a pin that
    // removeEnv(id) drops, never a recorded env whose layers gc may take.
    await opts.store.pin(envPinOwner(manifest.id), [venv.layer.digest, ...(repo ? [repo.layer.digest] : [])], { label: envPinLabel(manifest) });
    await saveEnvManifest(opts.store.root, manifest);
    return envFromManifest(manifest, opts.store);
  } finally {
    await opts.store.unpin(building).catch(() => undefined);
    await removeTree(work).catch(() => undefined);
  }
}

/**
 * `pip` and `pip3` for a venv made --without-pip that borrows the base's
 * pip: install commands that say `pip install` must reach the venv's
 * interpreter (the base's own `pip` script would install into the base).
 */
async function writePipCommands(venvDir: string, venvPath: string): Promise<void> {
  for (const name of ['pip', 'pip3']) {
    await fsp.writeFile(path.join(venvDir, 'bin', name), `#!/bin/sh\nexec ${shQuote(`${venvPath}/bin/python`)} -m pip "$@"\n`, { mode: 0o755 });
  }
}

export interface BuildRepoOptions {
  store: LayerStore;
  /** Path the repo will have in sandboxes, recorded as the layer's prefix (default /testbed). */
  repoPath?: string;
  workRoot?: string;
  /** Keep the .tar.zst archive (default true). false adds the checkout as a directory, with no archive made. */
  keepArchive?: boolean;
  /** Add the layer, built or reused, to this pin (see LayerStore.pin): what keeps it from gc. */
  pin?: PinRequest;
  signal?: AbortSignal;
}

export interface RepoLayer {
  layer: Layer;
  commit: string;
  archive?: string;
  /** Size of the archive, when one was made. */
  archiveBytes?: number;
}

function withArchive(p: { archive?: string | undefined; archiveBytes?: number | undefined }): Pick<RepoLayer, 'archive' | 'archiveBytes'> {
  return { ...(p.archive ? { archive: p.archive } : {}), ...(p.archiveBytes !== undefined ? { archiveBytes: p.archiveBytes } : {}) };
}

/** Where buildRepo remembers which layer a (source, full commit sha, repoPath) became. */
function repoCacheFile(storeRoot: string, source: string, commit: string, repoPath: string): string {
  return path.join(envsDir(storeRoot), 'repos', `${sha256Hex(JSON.stringify([source, commit.toLowerCase(), repoPath]))}.json`);
}

/** Pins a layer buildRepo remembered; false if a gc took it meanwhile (pin() refuses a missing layer): then it is built again. */
async function pinFound(store: LayerStore, pin: { owner: string } & PinOptions, digest: string): Promise<boolean> {
  try {
    await store.pin(pin.owner, [digest], pin);
    return true;
  } catch (err) {
    if (await store.get(digest)) throw err;
    return false;
  }
}

/**
 * Pack `repo` (a path or URL) at `commit` as a store layer (a
 * self-contained, clean checkout). A clone's .git is not byte-reproducible
 * (reflogs and the index hold times), so the same commit packed twice would
 * be two layers: for a full 40-hex sha the layer is remembered and reused.
 */
export async function buildRepo(repo: string, commit: string, opts: BuildRepoOptions): Promise<RepoLayer> {
  const repoPath = checkEnvPath('repoPath', opts.repoPath ?? DEFAULT_REPO_PATH);
  const source = isRepoUrl(repo) ? repo : path.resolve(repo);
  const cacheable = /^[0-9a-f]{40}$/i.test(commit);
  const cacheFile = repoCacheFile(opts.store.root, source, commit, repoPath);
  const pin = opts.pin === undefined ? undefined : pinRequest(opts.pin);
  if (cacheable) {
    const cached = await fsp
      .readFile(cacheFile, 'utf8')
      .then((text) => JSON.parse(text) as Omit<RepoLayer, 'layer'> & { digest: string })
      .catch(() => undefined); // not built yet, or unreadable: build it
    const layer = cached && typeof cached.digest === 'string' ? await opts.store.get(cached.digest).catch(() => undefined) : undefined;
    if (layer && (!pin || (await pinFound(opts.store, pin, layer.digest)))) return { layer, commit: cached!.commit, ...withArchive(cached!) };
  }
  const workRoot = path.resolve(opts.workRoot ?? path.join(envsDir(opts.store.root), 'build'));
  await fsp.mkdir(workRoot, { recursive: true });
  const work = await fsp.mkdtemp(path.join(workRoot, 'repo-'));
  try {
    const info = await packRepoLayer(source, commit, { dest: path.join(work, 'repo') });
    const packed = await packAsLayer(info.dir, opts.store, {
      name: `repo ${source}@${info.commit}`,
      prefix: repoPath,
      keepArchive: opts.keepArchive ?? true,
      ...(pin ? { pin } : {}),
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    const result: RepoLayer = { layer: packed.layer, commit: info.commit, ...withArchive(packed) };
    if (cacheable) {
      await fsp.mkdir(path.dirname(cacheFile), { recursive: true });
      const tmp = `${cacheFile}.tmp-${process.pid}`;
      await fsp.writeFile(tmp, JSON.stringify({ digest: packed.layer.digest, commit: info.commit, ...withArchive(packed) }));
      await fsp.rename(tmp, cacheFile);
    }
    return result;
  } finally {
    await removeTree(work).catch(() => undefined);
  }
}
