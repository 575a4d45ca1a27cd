/**
 * Task environments, built by lib/env (the project's one builder):
 * - one venv per recipe group (repo, version, resolved interpreter, install
 *   commands, setup commit): `buildEnv` at /opt/venvs/<key>, the path it has
 *   in every later sandbox, against the repo at environment_setup_commit
 *   bound at /testbed, so editable installs point where every task's repo
 *   will be. On lib/env's fast path: the venv sees the base's packages
 *   (offline, the test runner can only come from there) and borrows its pip
 *   (no ensurepip), layers are added as directories (no archive), and the
 *   setup-commit checkout is not stored;
 * - one repository layer per task, a self-contained checkout at base_commit
 *   (`buildRepo`). Measured on the demo set (docs/swe.md): a per-task layer
 *   costs ~0.1 s and, thanks to the store's dedup, little disk, while the
 *   alternative (one shared repo layer plus `git checkout` at every
 *   evaluation) would add the checkout and its copy-up to every one of
 *   thousands of evaluations.
 * Each evaluation stacks the two by overlay with a private writable layer
 * (`createEnvSandbox` with the task's repo layer).
 */
import type { Env } from '../../env/index.js';
import { EnvError } from '../../env/errors.js';
import { findPython, resolvePython, type BasePython } from '../../env/python.js';
import type { Layer, LayerStore } from '../../layers/store.js';
import type { Task } from '../tasks.js';
import { hashKey, lockRef, readRef, writeRef } from './refs.js';
import { TESTBED, type PreparedTask, type SandboxRequest, type StepOutcome, type TaskSandbox } from './types.js';

/** Bumped when the way venvs are built changes, so old refs are not reused. */
const VENV_RECIPE_VERSION = 2;

export interface TaskEnvOptions {
  store: LayerStore;
  /** Network while installing: 'none' (default, offline) or 'host' (e.g. to reach a package index). */
  installNetwork?: 'none' | 'host';
  /**
   * Variables for the install commands that are not part of the env's key
   * (lib/env's stepVariables): where to fetch from, e.g. PIP_INDEX_URL of a
   * package index on a port that changes between runs. A venv built with
   * other values is reused.
   */
  installVariables?: Record<string, string>;
  /** Per install command (default 15 minutes). */
  installTimeoutMs?: number;
  /** Where sandboxes' private dirs go during builds (default: the sandbox default). */
  stateDir?: string;
}

let libraries: Promise<{ env: typeof import('../../env/index.js'); capabilities: string[] }> | undefined;

/**
 * lib/env and lib/sandbox, loaded on first use: they load the native addon,
 * and lib/swe's parsers and grader (pure functions, used on machines where
 * the addon cannot load) must not.
 */
function sandboxLibraries(): NonNullable<typeof libraries> {
  libraries ??= Promise.all([import('../../env/index.js'), import('../../sandbox/index.js')]).then(([env, sandbox]) => ({
    env,
    // Store layers are read-only (0444/0555): the tests and `git apply` must
    // write over them (copy-up). CAP_FSETID keeps a file's setgid bit on
    // write, as it would for root in a container.
    capabilities: [...sandbox.policy.FILE_CAPABILITIES, 'CAP_FSETID'],
  }));
  return libraries;
}

function repoSource(task: Task): string {
  const source = task.repo_path ?? task.repo_url;
  if (!source) throw new EnvError(`task ${task.instance_id}: no repo_path or repo_url`);
  return source;
}

export class TaskEnvs {
  readonly #opts: TaskEnvOptions;
  /** Resolved interpreters (or why none fits) by request: each is probed once per run, not once per task. */
  readonly #pythons = new Map<string, BasePython | string>();

  constructor(opts: TaskEnvOptions) {
    this.#opts = opts;
  }

  get store(): LayerStore {
    return this.#opts.store;
  }

  /**
   * The base interpreter for `task.python`, or why there is none. Offline,
   * a test runner cannot be installed, so when the test command uses pytest
   * an interpreter that has it is preferred.
   */
  python(task: Pick<Task, 'python' | 'test_cmd'>): BasePython | string {
    if (task.python === undefined) return 'no "python" version to find an interpreter for';
    const wantsPytest = /\bpytest\b/.test(task.test_cmd);
    const key = `${task.python}|${wantsPytest}`;
    let found = this.#pythons.get(key);
    if (found === undefined) {
      try {
        found = (wantsPytest ? findPython({ version: task.python, modules: ['pytest'] }) : undefined) ?? resolvePython(task.python!);
      } catch (err) {
        found = (err as Error).message;
      }
      this.#pythons.set(key, found);
    }
    return found;
  }

  #pythonOf(task: Task): BasePython {
    const python = this.python(task);
    if (typeof python === 'string') throw new EnvError(python);
    return python;
  }

  /**
   * Tasks with the same key share one venv: the repo and version, the
   * resolved interpreter (not just "3.11": another patch release is another
   * venv), the install commands and the commit they run at.
   */
  envKey(task: Task): string {
    const python = this.#pythonOf(task);
    return hashKey({
      recipe: VENV_RECIPE_VERSION,
      repo: task.repo,
      source: task.repo_path ?? task.repo_url,
      version: task.version,
      python: [python.path, python.version],
      install: task.install,
      setup: task.environment_setup_commit ?? task.base_commit,
      network: this.#opts.installNetwork ?? 'none',
    });
  }

  /**
   * The task's venv: built once per key, by lib/env's builder, whose recipe
   * index returns the env of a recipe built before (by an earlier prepare,
   * or by `env build`) and makes concurrent builds of one recipe wait for
   * the first.
   */
  async prepareEnv(task: Task, opts: { signal?: AbortSignal } = {}): Promise<StepOutcome<Env>> {
    const python = this.#pythonOf(task);
    const key = this.envKey(task);
    const { env: lib } = await sandboxLibraries();
    const env = await lib.buildEnv(
      {
        name: `${task.repo}@${task.version}`,
        python: python.path,
        venvPath: `/opt/venvs/${key.slice(0, 16)}`,
        repo: { source: repoSource(task), commit: task.environment_setup_commit ?? task.base_commit },
        repoPath: TESTBED,
        steps: task.install.map((run) => ({ run })),
        systemSitePackages: true,
        network: this.#opts.installNetwork ?? 'none',
        stepTimeoutMs: this.#opts.installTimeoutMs ?? 15 * 60_000,
      },
      {
        store: this.#opts.store,
        keepArchives: false,
        keepRepo: false,
        ...(this.#opts.stateDir ? { stateDir: this.#opts.stateDir } : {}),
        ...(this.#opts.installVariables ? { stepVariables: this.#opts.installVariables } : {}),
        ...(opts.signal ? { signal: opts.signal } : {}),
      },
    );
    return { value: env, reused: env.reused === true };
  }

  /**
   * The task's repository at base_commit, as a layer built for `repoDir`
   * (TESTBED for venv tasks; an image task's repo_dir).
   */
  async prepareRepo(task: Task, opts: { signal?: AbortSignal; repoDir?: string } = {}): Promise<StepOutcome<Layer>> {
    const source = repoSource(task);
    const repoDir = opts.repoDir ?? TESTBED;
    // The layer records where it was built (relocation needs it): another
    // directory is another layer. TESTBED's keys stay what they were.
    const key = hashKey(repoDir === TESTBED ? { source, commit: task.base_commit } : { source, commit: task.base_commit, repoDir });
    const { store } = this.#opts;
    const found = await readRef(store, 'repo', key);
    if (found) return { value: found.layer, reused: true };
    const lock = await lockRef(store, 'repo', key, opts.signal);
    try {
      const again = await readRef(store, 'repo', key);
      if (again) return { value: again.layer, reused: true };
      const { env: lib } = await sandboxLibraries();
      const repo = await lib.buildRepo(source, task.base_commit, {
        store,
        repoPath: repoDir,
        keepArchive: false,
        // The prepared tasks' use of the layer, which gc respects.
        pin: { owner: `swe repo ${key}`, label: `prepared repo ${task.repo}@${task.base_commit}` },
        ...(opts.signal ? { signal: opts.signal } : {}),
      });
      writeRef(store, 'repo', key, { digest: repo.layer.digest, description: `repo ${task.repo}@${repo.commit}`, created: new Date().toISOString(), commit: repo.commit });
      return { value: repo.layer, reused: false };
    } finally {
      await lock.release();
    }
  }

  finish(task: Task, env: Env, repo: Layer): PreparedTask {
    return {
      instance_id: task.instance_id,
      isolation: 'sandbox-venv',
      repoDir: TESTBED,
      env: {
        envId: env.id,
        envKey: this.envKey(task),
        venvDigest: env.venv.digest,
        repoDigest: repo.digest,
        venvPath: env.venvPath,
        python: { path: env.python.path, version: env.python.version, prefix: env.python.prefix },
      },
      createSandbox: async (request: SandboxRequest = {}): Promise<TaskSandbox> => {
        const { env: lib, capabilities } = await sandboxLibraries();
        const sb = await lib.createEnvSandbox(env, {
          repo,
          capabilities,
          ...(request.stateDir ? { stateDir: request.stateDir } : {}),
          ...(request.limits ? { limits: request.limits } : {}),
        });
        return { exec: (cmd, opts) => sb.exec(cmd, opts), close: () => sb.close() };
      },
    };
  }
}
