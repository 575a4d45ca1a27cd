/**
 * The same pipeline on lib/env (buildEnv / buildRepo / createEnvSandbox),
 * offered next to LocalEnvProvider. Differences that matter here:
 * - lib/env makes a plain venv; offline, the test runner can only come from
 *   the base interpreter, so the first step turns on
 *   include-system-site-packages (what `venv --system-site-packages` writes);
 * - the env's own repo layer is at environment_setup_commit; each task's
 *   sandbox swaps in the task's repo layer at base_commit (same /testbed
 *   path, so nothing is relocated).
 */
import { buildEnv, buildRepo, createEnvSandbox, loadEnv, type Env } from '../../env/index.js';
import type { Layer, LayerStore } from '../../layers/store.js';
import type { Task } from '../tasks.js';
import { resolveBasePython } from './basePython.js';
import { EnvBuildError } from './localProvider.js';
import { envIdentity, hashKey, lockRef, readRef, writeRef } from './refs.js';
import { TESTBED, type EnvProvider, type PreparedTask, type SandboxRequest, type StepOutcome, type TaskSandbox } from './types.js';

const SYSTEM_SITE = `sed -i 's/^include-system-site-packages = false$/include-system-site-packages = true/' "$VIRTUAL_ENV/pyvenv.cfg"`;

export class EnvLibProvider implements EnvProvider {
  readonly name = 'lib/env';

  constructor(private readonly opts: { store: LayerStore; stateDir?: string }) {}

  envKey(task: Task): string {
    return hashKey({ provider: this.name, ...envIdentity(task) });
  }

  async prepareEnv(task: Task): Promise<StepOutcome<Env>> {
    const python = resolveBasePython(task);
    if (typeof python === 'string') throw new EnvBuildError(python);
    const key = this.envKey(task);
    const { store } = this.opts;
    const load = async (): Promise<Env | undefined> => {
      const found = await readRef(store, 'venv', key);
      return found ? loadEnv(String(found.ref.envId), { store }).catch(() => undefined) : undefined;
    };
    const existing = await load();
    if (existing) return { value: existing, reused: true };
    const lock = await lockRef(store, 'venv', key);
    try {
      const again = await load();
      if (again) return { value: again, reused: true };
      const env = await buildEnv(
        {
          name: `${task.repo}@${task.version}`,
          python: python.path,
          venvPath: `/opt/venvs/${key.slice(0, 16)}`,
          repo: { source: task.repo_path ?? task.repo_url!, commit: task.environment_setup_commit ?? task.base_commit },
          repoPath: TESTBED,
          steps: [{ run: SYSTEM_SITE }, ...task.install.map((run) => ({ run }))],
        },
        { store, keepArchives: false, ...(this.opts.stateDir ? { stateDir: this.opts.stateDir } : {}) },
      );
      writeRef(store, 'venv', key, { digest: env.venv.digest, envId: env.id, description: `env ${task.repo}@${task.version}`, created: new Date().toISOString() });
      return { value: env, reused: false };
    } finally {
      await lock.release();
    }
  }

  async prepareRepo(task: Task): Promise<StepOutcome<Layer>> {
    const { store } = this.opts;
    const key = hashKey({ source: task.repo_path ?? task.repo_url, commit: task.base_commit, provider: this.name });
    const found = await readRef(store, 'repo', key);
    if (found) return { value: found.layer, reused: true };
    const lock = await lockRef(store, 'repo', key);
    try {
      const again = await readRef(store, 'repo', key);
      if (again) return { value: again.layer, reused: true };
      const repo = await buildRepo(task.repo_path ?? task.repo_url!, task.base_commit, { store, repoPath: TESTBED, keepArchive: false });
      writeRef(store, 'repo', key, { digest: repo.layer.digest, description: `repo ${task.repo}@${repo.commit}`, created: new Date().toISOString() });
      return { value: repo.layer, reused: false };
    } finally {
      await lock.release();
    }
  }

  finish(task: Task, envValue: unknown, repoValue: unknown): PreparedTask {
    const env = envValue as Env;
    const repo = repoValue as Layer;
    const taskEnv: Env = { ...env, repo };
    return {
      instance_id: task.instance_id,
      env: {
        provider: this.name,
        envKey: env.id,
        venvDigest: env.venv.digest,
        repoDigest: repo.digest,
        venvPath: env.venvPath,
        python: { path: env.python.path, version: env.python.version, prefix: env.python.prefix },
      },
      createSandbox: async (request: SandboxRequest = {}): Promise<TaskSandbox> => {
        const sb = await createEnvSandbox(taskEnv, {
          ...(request.stateDir ? { stateDir: request.stateDir } : {}),
          ...(request.limits ? { limits: request.limits } : {}),
        });
        return { exec: (cmd, opts) => sb.exec(cmd, opts), close: () => sb.close() };
      },
    };
  }

  async diskUsage(): Promise<number> {
    return (await this.opts.store.du()).diskBytes;
  }
}
