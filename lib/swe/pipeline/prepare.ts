/**
 * Preparing a task set: one environment per recipe group, one repository
 * state per task, as many at once as `concurrency` allows. A task that
 * cannot be prepared (bad fields, unknown commit, failing recipe) is
 * reported with its reason and does not stop the others.
 */
import type { Env } from '../../env/index.js';
import type { Task } from '../tasks.js';
import { createLimiter } from '../../files/limit.js';
import { TaskEnvs, type TaskEnvOptions } from './taskEnvs.js';
import type { PrepareProgress, PreparedTask, PrepareStage } from './types.js';

export interface PrepareOptions extends TaskEnvOptions {
  /** Builds running at once (default 2). */
  concurrency?: number;
  onProgress?: (event: PrepareProgress) => void;
  signal?: AbortSignal;
}

export interface PrepareFailure {
  instance_id: string;
  stage: PrepareStage;
  /** Names the task and says why, e.g. 'task "x": venv owner/r@1.0: install[0] ... failed'. */
  message: string;
}

export interface PrepareSummary {
  tasks: number;
  prepared: number;
  failed: number;
  envs: { built: number; reused: number; failed: number };
  repos: { built: number; reused: number; failed: number };
  /** Disk used by the store after preparation. */
  diskBytes?: number;
  durationMs: number;
}

export interface PrepareResult {
  prepared: Map<string, PreparedTask>;
  failures: PrepareFailure[];
  summary: PrepareSummary;
}

/**
 * Problems that make a task impossible to prepare, checked before any work.
 * FAIL_TO_PASS and PASS_TO_PASS are not needed to prepare (tasks derive
 * prepares tasks to find them); evaluate refuses a task without them.
 */
export function checkTaskForPrepare(task: Partial<Task>): string[] {
  const problems: string[] = [];
  const str = (f: keyof Task) => {
    if (typeof task[f] !== 'string' || (task[f] as string).trim() === '') problems.push(`missing "${f}"`);
  };
  (['instance_id', 'repo', 'version', 'base_commit', 'python', 'test_cmd', 'test_patch'] as const).forEach(str);
  if (!Array.isArray(task.install) || task.install.some((c) => typeof c !== 'string')) problems.push('"install" must be a list of shell commands');
  if (!task.repo_path && !task.repo_url) problems.push('needs "repo_path" or "repo_url"');
  return problems;
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

export async function prepareTasks(tasks: readonly Task[], opts: PrepareOptions): Promise<PrepareResult> {
  const started = performance.now();
  const { onProgress, signal } = opts;
  const envs = new TaskEnvs(opts);
  const limit = createLimiter(opts.concurrency ?? 2);
  const failures: PrepareFailure[] = [];
  const prepared = new Map<string, PreparedTask>();
  const summary: PrepareSummary = {
    tasks: tasks.length,
    prepared: 0,
    failed: 0,
    envs: { built: 0, reused: 0, failed: 0 },
    repos: { built: 0, reused: 0, failed: 0 },
    durationMs: 0,
  };

  const valid: Task[] = [];
  const seen = new Set<string>();
  for (const task of tasks) {
    const problems = checkTaskForPrepare(task);
    if (task.instance_id && seen.has(task.instance_id)) problems.push('duplicate instance_id');
    seen.add(task.instance_id);
    if (problems.length > 0) {
      failures.push({ instance_id: task.instance_id ?? '?', stage: 'validate', message: `task "${task.instance_id ?? '?'}": ${problems.join('; ')}` });
    } else valid.push(task);
  }

  // Group by recipe: the first task of a group builds its environment.
  const groups = new Map<string, Task>();
  const keyOf = new Map<Task, string>();
  const ready: Task[] = [];
  for (const task of valid) {
    const python = envs.python(task);
    if (typeof python === 'string') {
      failures.push({ instance_id: task.instance_id, stage: 'python', message: `task "${task.instance_id}": ${python}` });
      continue;
    }
    const key = envs.envKey(task);
    keyOf.set(task, key);
    ready.push(task);
    if (!groups.has(key)) groups.set(key, task);
  }
  const total = groups.size + ready.length;
  let done = 0;
  const report = (event: Omit<PrepareProgress, 'done' | 'total'>) => {
    if (event.status !== 'start') done++;
    onProgress?.({ ...event, done, total });
  };

  const step = async <T>(stage: 'venv' | 'repo', label: string, counts: PrepareSummary['envs'], run: () => Promise<{ value: T; reused: boolean }>) =>
    limit(async () => {
      signal?.throwIfAborted();
      report({ stage, status: 'start', label });
      try {
        const out = await run();
        counts[out.reused ? 'reused' : 'built']++;
        report({ stage, status: out.reused ? 'reused' : 'built', label });
        return out.value;
      } catch (err) {
        counts.failed++;
        report({ stage, status: 'failed', label, error: message(err) });
        throw err;
      }
    });

  const built = new Map<string, Promise<Env>>();
  for (const [key, task] of groups) {
    const env = step('venv', `venv ${task.repo}@${task.version}`, summary.envs, () => envs.prepareEnv(task, { ...(signal ? { signal } : {}) }));
    env.catch(() => {}); // handled per task below
    built.set(key, env);
  }
  await Promise.all(
    ready.map(async (task) => {
      const repo = step('repo', `repo ${task.repo}@${task.base_commit.slice(0, 12)} (${task.instance_id})`, summary.repos, () =>
        envs.prepareRepo(task, { ...(signal ? { signal } : {}) }),
      );
      // Both steps settle before the task is judged, so the summary never
      // runs ahead of work still in flight.
      const [env, repoValue] = await Promise.allSettled([built.get(keyOf.get(task)!)!, repo]);
      if (env.status === 'rejected') {
        failures.push({ instance_id: task.instance_id, stage: 'venv', message: `task "${task.instance_id}": ${message(env.reason)}` });
      } else if (repoValue.status === 'rejected') {
        failures.push({ instance_id: task.instance_id, stage: 'repo', message: `task "${task.instance_id}": ${message(repoValue.reason)}` });
      } else {
        prepared.set(task.instance_id, envs.finish(task, env.value, repoValue.value));
      }
    }),
  );

  // Keep the task set's order: reports and diffs stay stable.
  const order = new Map(tasks.map((t, i) => [t.instance_id, i]));
  failures.sort((a, b) => (order.get(a.instance_id) ?? 0) - (order.get(b.instance_id) ?? 0));
  summary.prepared = prepared.size;
  summary.failed = failures.length;
  const disk = await envs.store.du().catch(() => undefined);
  if (disk !== undefined) summary.diskBytes = disk.diskBytes;
  summary.durationMs = performance.now() - started;
  return { prepared, failures, summary };
}
