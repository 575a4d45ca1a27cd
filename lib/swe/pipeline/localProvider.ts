/**
 * Environments from lib/layers + lib/sandbox alone:
 * - one venv layer per recipe group (repo, version, python, install, setup
 *   commit), built inside a sandbox at the path it will have in every later
 *   sandbox (/opt/venvs/<key>), so nothing needs relocating;
 * - one repository layer per task: a self-contained checkout at base_commit.
 *   Measured on the demo set (docs/swe.md): a per-task layer costs ~0.1 s and,
 *   thanks to the store's dedup, little disk, while the alternative (one shared
 *   repo layer plus `git checkout` at every evaluation) would add the checkout
 *   and its copy-up to every one of thousands of evaluations.
 * Each evaluation stacks the two by overlay with a private writable layer.
 */
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { packRepoLayer } from '../../layers/gitRepo.js';
import type { Layer, LayerStore } from '../../layers/store.js';
import type { Mount } from '../../sandbox/options.js';
import { FILE_CAPABILITIES } from '../../sandbox/policy.js';
import { Sandbox } from '../../sandbox/sandbox.js';
import type { Task } from '../tasks.js';
import { needsBind, resolveBasePython, type BasePython } from './basePython.js';
import { envIdentity, hashKey, lockRef, readRef, writeRef } from './refs.js';
import { TESTBED, type EnvProvider, type PreparedTask, type SandboxRequest, type StepOutcome } from './types.js';

/** Bumped when the way venvs are built changes, so old refs are not reused. */
const VENV_RECIPE_VERSION = 1;

/**
 * What evaluation commands need to write into read-only layer files (copied
 * up on write): the sandbox's file capabilities, and CAP_FSETID so that
 * writing keeps a file's setgid bit as it would for root in a container.
 */
export const EVAL_CAPABILITIES = [...FILE_CAPABILITIES, 'CAP_FSETID'];

const SYSTEM_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

export interface LocalProviderOptions {
  store: LayerStore;
  /** Network while installing: 'none' (default, offline) or 'host' (e.g. to reach a package index). */
  installNetwork?: 'none' | 'host';
  /** Per install command (default 15 minutes). */
  installTimeoutMs?: number;
  /** Where sandboxes' private dirs go during builds (default: the sandbox default). */
  stateDir?: string;
}

interface VenvEnv {
  layer: Layer;
  python: BasePython;
  venvPath: string;
  key: string;
}

/** Error naming the step, with the tail of the command's output. */
export class EnvBuildError extends Error {
  override name = 'EnvBuildError';
}

function tail(text: string, lines = 15): string {
  return text.trim().split('\n').slice(-lines).join('\n');
}

function repoSource(task: Task): string {
  const source = task.repo_path ?? task.repo_url;
  if (!source) throw new EnvBuildError(`task ${task.instance_id}: no repo_path or repo_url`);
  return source;
}

function pythonOf(task: Task): BasePython {
  const python = resolveBasePython(task);
  if (typeof python === 'string') throw new EnvBuildError(python);
  return python;
}

/** Host bind of the base interpreter at its own path, when the root does not show it already. */
function pythonMounts(python: BasePython): Mount[] {
  return needsBind(python.prefix) ? [{ type: 'bind', source: python.prefix, target: python.prefix, readOnly: true }] : [];
}

function venvEnvironment(venvPath: string): Record<string, string> {
  return {
    PATH: `${venvPath}/bin:${SYSTEM_PATH}`,
    VIRTUAL_ENV: venvPath,
    HOME: '/root',
    LANG: 'C.UTF-8',
    PIP_DISABLE_PIP_VERSION_CHECK: '1',
    PIP_NO_CACHE_DIR: '1',
  };
}

export class LocalEnvProvider implements EnvProvider {
  readonly name = 'local';
  readonly #opts: LocalProviderOptions;

  constructor(opts: LocalProviderOptions) {
    this.#opts = opts;
  }

  get store(): LayerStore {
    return this.#opts.store;
  }

  envKey(task: Task): string {
    return hashKey({ recipe: VENV_RECIPE_VERSION, ...envIdentity(task), network: this.#opts.installNetwork ?? 'none' });
  }

  async prepareEnv(task: Task, opts: { signal?: AbortSignal } = {}): Promise<StepOutcome<VenvEnv>> {
    const python = pythonOf(task);
    const key = this.envKey(task);
    const venvPath = `/opt/venvs/${key.slice(0, 16)}`;
    const store = this.#opts.store;
    const found = await readRef(store, 'venv', key);
    if (found) return { value: { layer: found.layer, python, venvPath, key }, reused: true };
    const lock = await lockRef(store, 'venv', key, opts.signal);
    try {
      const again = await readRef(store, 'venv', key); // built by another process while we waited
      if (again) return { value: { layer: again.layer, python, venvPath, key }, reused: true };
      const layer = await this.#buildVenv(task, python, venvPath, opts.signal);
      writeRef(store, 'venv', key, {
        digest: layer.digest,
        description: `venv ${task.repo}@${task.version} (Python ${python.version})`,
        created: new Date().toISOString(),
        venvPath,
        python: python.path,
      });
      return { value: { layer, python, venvPath, key }, reused: false };
    } finally {
      await lock.release();
    }
  }

  async #buildVenv(task: Task, python: BasePython, venvPath: string, signal?: AbortSignal): Promise<Layer> {
    const what = `venv ${task.repo}@${task.version}`;
    const work = mkdtempSync(join(tmpdir(), 'msbx-venv-'));
    try {
      const setupCommit = task.environment_setup_commit ?? task.base_commit;
      // The install runs against the repo at environment_setup_commit, at
      // /testbed, so editable installs point where every task's repo will be.
      const repoDir = join(work, 'repo');
      await packRepoLayer(repoSource(task), setupCommit, { dest: repoDir });
      const venvDir = join(work, 'venv');
      mkdirSync(venvDir);
      const sb = await Sandbox.create({
        mounts: [
          ...pythonMounts(python),
          { type: 'bind', source: venvDir, target: venvPath },
          { type: 'bind', source: repoDir, target: TESTBED },
        ],
        env: { ...venvEnvironment(venvPath), ...(this.#opts.installNetwork === 'host' ? {} : { PIP_NO_INDEX: '1' }) },
        cwd: TESTBED,
        network: this.#opts.installNetwork ?? 'none',
        ...(this.#opts.stateDir ? { stateDir: this.#opts.stateDir } : {}),
      });
      try {
        const timeout = this.#opts.installTimeoutMs ?? 15 * 60_000;
        // --system-site-packages: offline, the test runner (pytest) can only
        // come from the base interpreter. --without-pip when the base has pip
        // (reachable the same way): ensurepip would add 3.7 s and 26 MB per venv.
        const venvArgs = [python.path, '-m', 'venv', '--system-site-packages', ...(python.hasPip ? ['--without-pip'] : []), venvPath];
        const steps: Array<[string, string[]]> = [
          ['create venv', venvArgs],
          ...task.install.map((cmd, i): [string, string[]] => [`install[${i}] ${JSON.stringify(cmd)}`, ['/bin/bash', '-c', cmd]]),
        ];
        for (const [step, argv] of steps) {
          const r = await sb.exec(argv, { timeout, ...(signal ? { signal } : {}) });
          if (r.timedOut) throw new EnvBuildError(`${what}: ${step} timed out after ${timeout / 1000} s`);
          if (r.exitCode !== 0) {
            throw new EnvBuildError(`${what}: ${step} failed (exit ${r.exitCode ?? r.signal}):\n${tail(r.stdout + r.stderr)}`);
          }
        }
      } finally {
        await sb.close();
      }
      return await this.#opts.store.addDirectory(venvDir, { name: what, prefix: venvPath, ...(signal ? { signal } : {}) });
    } finally {
      rmSync(work, { recursive: true, force: true });
    }
  }

  async prepareRepo(task: Task, opts: { signal?: AbortSignal } = {}): Promise<StepOutcome<Layer>> {
    const source = repoSource(task);
    const key = hashKey({ source, commit: task.base_commit });
    const store = this.#opts.store;
    const found = await readRef(store, 'repo', key);
    if (found) return { value: found.layer, reused: true };
    const lock = await lockRef(store, 'repo', key, opts.signal);
    try {
      const again = await readRef(store, 'repo', key);
      if (again) return { value: again.layer, reused: true };
      const work = mkdtempSync(join(tmpdir(), 'msbx-repo-'));
      try {
        const info = await packRepoLayer(source, task.base_commit, { dest: join(work, 'repo') });
        const layer = await store.addDirectory(join(work, 'repo'), {
          name: `repo ${task.repo}@${info.commit.slice(0, 12)}`,
          ...(opts.signal ? { signal: opts.signal } : {}),
        });
        writeRef(store, 'repo', key, { digest: layer.digest, description: `repo ${task.repo}@${info.commit}`, created: new Date().toISOString(), commit: info.commit });
        return { value: layer, reused: false };
      } finally {
        rmSync(work, { recursive: true, force: true });
      }
    } finally {
      await lock.release();
    }
  }

  finish(task: Task, env: unknown, repo: unknown): PreparedTask {
    const venv = env as VenvEnv;
    const repoLayer = repo as Layer;
    return {
      instance_id: task.instance_id,
      env: {
        provider: this.name,
        envKey: venv.key,
        venvDigest: venv.layer.digest,
        repoDigest: repoLayer.digest,
        venvPath: venv.venvPath,
        python: { path: venv.python.path, version: venv.python.version, prefix: venv.python.prefix },
      },
      createSandbox: (request: SandboxRequest = {}) =>
        Sandbox.create({
          overlays: [
            { target: venv.venvPath, lower: [venv.layer.path] },
            { target: TESTBED, lower: [repoLayer.path] },
          ],
          mounts: pythonMounts(venv.python),
          env: venvEnvironment(venv.venvPath),
          cwd: TESTBED,
          ...(request.stateDir ? { stateDir: request.stateDir } : {}),
          ...(request.limits ? { limits: request.limits } : {}),
        }),
    };
  }

  async diskUsage(): Promise<number> {
    return (await this.#opts.store.du()).diskBytes;
  }
}
