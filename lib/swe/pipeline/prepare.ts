/**
 * Preparing a task set: one environment per recipe group, one repository
 * state per task, one import or pull per image, as many at once as
 * `concurrency` allows. A task that cannot be prepared (bad fields, unknown
 * commit, failing recipe, an image that cannot be had) is reported with its
 * reason and does not stop the others.
 */
import type { Env } from '../../env/index.js';
import type { Layer } from '../../layers/store.js';
import { DEFAULT_REPO_DIR, isImageFile, isTaskIsolation, TASK_ISOLATIONS, type Task, type TaskIsolation } from '../tasks.js';
import { createLimiter } from '../../files/limit.js';
import { SweError } from '../errors.js';
import { createDockerSandbox, ensureDockerImage } from './docker.js';
import { createImageTaskSandbox, ensureStoreImage } from './imageSandbox.js';
import { TaskEnvs, type TaskEnvOptions } from './taskEnvs.js';
import type { IsolationKind, PrepareProgress, PreparedTask, PrepareStage, SandboxRequest } from './types.js';

export interface PrepareOptions extends TaskEnvOptions {
  /** Builds running at once (default 2). */
  concurrency?: number;
  onProgress?: (event: PrepareProgress) => void;
  signal?: AbortSignal;
  /**
   * Every task's isolation, over what each task says (`eval --isolation`):
   * 'docker' needs every task to name an image; 'sandbox' runs tasks marked
   * 'docker' in a sandbox of their image.
   */
  isolation?: TaskIsolation;
  /**
   * The TaskEnvs to use (default: a new one, whose interpreter probes last
   * this call). A long-lived caller that prepares one task at a time (a queue
   * worker, lib/cluster) passes its own, so that an interpreter is probed
   * once, not once per task: a probe is a synchronous run of Python.
   */
  envs?: TaskEnvs;
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
  /** Images the tasks name, once per image and isolation: imported or pulled now, already there, or not to be had. */
  images: { fetched: number; reused: number; failed: number };
  /** Tasks by what their evaluations will run in. */
  isolation: Record<IsolationKind, number>;
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
 * What a task's evaluations run in, or why it cannot run: the override (a
 * whole set's `--isolation`), else the task's own `isolation`, else a
 * sandbox; a sandbox of the image when the task names one, else of its venv.
 */
export function isolationOf(task: Pick<Task, 'image' | 'isolation'>, override?: TaskIsolation): IsolationKind | { error: string } {
  if (override !== undefined && !isTaskIsolation(override)) {
    throw new SweError(`isolation: must be one of ${TASK_ISOLATIONS.join(', ')}, got ${JSON.stringify(override)}`);
  }
  const wanted = override ?? task.isolation ?? 'sandbox';
  if (wanted === 'docker') {
    if (task.image === undefined) {
      return { error: `isolation docker${override ? ' (--isolation)' : ''} needs an "image": the task has a venv recipe only, which Docker cannot run` };
    }
    return 'docker';
  }
  return task.image !== undefined ? 'sandbox-image' : 'sandbox-venv';
}

/**
 * Problems that make a task impossible to prepare, checked before any work.
 * FAIL_TO_PASS and PASS_TO_PASS are not needed to prepare (tasks derive
 * prepares tasks to find them); evaluate refuses a task without them. A
 * venv task needs its recipe; an image task needs only its image (and a
 * repository, from the image or from repo_path / repo_url).
 */
export function checkTaskForPrepare(task: Partial<Task>, isolation: IsolationKind = task.image !== undefined ? 'sandbox-image' : 'sandbox-venv'): string[] {
  const problems: string[] = [];
  const str = (f: keyof Task) => {
    if (typeof task[f] !== 'string' || (task[f] as string).trim() === '') problems.push(`missing "${f}"`);
  };
  (['instance_id', 'repo', 'version', 'base_commit', 'test_cmd', 'test_patch'] as const).forEach(str);
  if (isolation === 'sandbox-venv') {
    str('python');
    if (!Array.isArray(task.install) || task.install.some((c) => typeof c !== 'string')) problems.push('"install" must be a list of shell commands');
    if (!task.repo_path && !task.repo_url) problems.push('needs "repo_path" or "repo_url"');
  } else {
    str('image');
    if (task.repo_dir !== undefined && !task.repo_dir.startsWith('/')) problems.push(`"repo_dir" must be an absolute path, got "${task.repo_dir}"`);
  }
  return problems;
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

export async function prepareTasks(tasks: readonly Task[], opts: PrepareOptions): Promise<PrepareResult> {
  const started = performance.now();
  const { onProgress, signal } = opts;
  const envs = opts.envs ?? new TaskEnvs(opts);
  const limit = createLimiter(opts.concurrency ?? 2);
  const failures: PrepareFailure[] = [];
  const prepared = new Map<string, PreparedTask>();
  const summary: PrepareSummary = {
    tasks: tasks.length,
    prepared: 0,
    failed: 0,
    envs: { built: 0, reused: 0, failed: 0 },
    repos: { built: 0, reused: 0, failed: 0 },
    images: { fetched: 0, reused: 0, failed: 0 },
    isolation: { 'sandbox-venv': 0, 'sandbox-image': 0, docker: 0 },
    durationMs: 0,
  };
  const fail = (task: Pick<Task, 'instance_id'>, stage: PrepareStage, why: string) =>
    failures.push({ instance_id: task.instance_id ?? '?', stage, message: `task "${task.instance_id ?? '?'}": ${why}` });

  const venvTasks: Task[] = [];
  const imageTasks: Array<{ task: Task; kind: Exclude<IsolationKind, 'sandbox-venv'> }> = [];
  const seen = new Set<string>();
  for (const task of tasks) {
    const kind = isolationOf(task, opts.isolation);
    const problems = typeof kind === 'string' ? checkTaskForPrepare(task, kind) : [kind.error];
    if (task.instance_id && seen.has(task.instance_id)) problems.push('duplicate instance_id');
    seen.add(task.instance_id);
    if (problems.length > 0 || typeof kind !== 'string') fail(task, 'validate', problems.join('; '));
    else {
      if (kind === 'sandbox-venv') venvTasks.push(task);
      else imageTasks.push({ task, kind });
    }
  }

  // Group by recipe: the first task of a group builds its environment.
  const groups = new Map<string, Task>();
  const keyOf = new Map<Task, string>();
  const ready: Task[] = [];
  for (const task of venvTasks) {
    const python = envs.python(task);
    if (typeof python === 'string') {
      fail(task, 'python', python);
      continue;
    }
    const key = envs.envKey(task);
    keyOf.set(task, key);
    ready.push(task);
    if (!groups.has(key)) groups.set(key, task);
  }
  // One import or pull per image and place (the store, or Docker).
  const imageKey = (t: Task, kind: IsolationKind) => `${kind === 'docker' ? 'docker' : 'store'}\0${t.image}`;
  const images = new Map<string, { task: Task; kind: IsolationKind }>();
  for (const it of imageTasks) if (!images.has(imageKey(it.task, it.kind))) images.set(imageKey(it.task, it.kind), it);
  const imageRepos = imageTasks.filter(({ task }) => task.repo_path !== undefined || task.repo_url !== undefined).length;
  const total = groups.size + ready.length + images.size + imageRepos;
  let done = 0;
  const report = (event: Omit<PrepareProgress, 'done' | 'total'>) => {
    if (event.status !== 'start') done++;
    onProgress?.({ ...event, done, total });
  };

  const step = async <T>(stage: PrepareProgress['stage'], label: string, counts: Record<'reused' | 'failed', number>, fresh: 'built' | 'fetched', run: () => Promise<{ value: T; reused: boolean }>) =>
    limit(async () => {
      signal?.throwIfAborted();
      report({ stage, status: 'start', label });
      try {
        const out = await run();
        (counts as Record<string, number>)[out.reused ? 'reused' : fresh]!++;
        report({ stage, status: out.reused ? 'reused' : 'built', label });
        return out.value;
      } catch (err) {
        counts.failed++;
        report({ stage, status: 'failed', label, error: message(err) });
        throw err;
      }
    });
  const signalOpt = signal ? { signal } : {};
  const repoStep = (task: Task, repoDir?: string) =>
    step('repo', `repo ${task.repo}@${task.base_commit.slice(0, 12)} (${task.instance_id})`, summary.repos, 'built', () =>
      envs.prepareRepo(task, { ...signalOpt, ...(repoDir ? { repoDir } : {}) }),
    );

  const built = new Map<string, Promise<Env>>();
  for (const [key, task] of groups) {
    const env = step('venv', `venv ${task.repo}@${task.version}`, summary.envs, 'built', () => envs.prepareEnv(task, signalOpt));
    env.catch(() => {}); // handled per task below
    built.set(key, env);
  }
  const fetched = new Map<string, Promise<string>>();
  for (const [key, { task, kind }] of images) {
    const image = task.image!;
    const file = isImageFile(image);
    const id = step('image', `image ${image} (${kind === 'docker' ? 'docker' : 'store'})`, summary.images, 'fetched', async () => {
      const got = kind === 'docker' ? await ensureDockerImage(image, file) : await ensureStoreImage(envs.store, image, file, signal);
      return { value: got.id, reused: !got.fetched };
    });
    id.catch(() => {}); // handled per task below
    fetched.set(key, id);
  }

  await Promise.all([
    ...ready.map(async (task) => {
      const repo = repoStep(task);
      // Both steps settle before the task is judged, so the summary never
      // runs ahead of work still in flight.
      const [env, repoValue] = await Promise.allSettled([built.get(keyOf.get(task)!)!, repo]);
      if (env.status === 'rejected') fail(task, 'venv', message(env.reason));
      else if (repoValue.status === 'rejected') fail(task, 'repo', message(repoValue.reason));
      else prepared.set(task.instance_id, envs.finish(task, env.value, repoValue.value));
    }),
    ...imageTasks.map(async ({ task, kind }) => {
      const repoDir = task.repo_dir ?? DEFAULT_REPO_DIR;
      const repo = task.repo_path !== undefined || task.repo_url !== undefined ? repoStep(task, repoDir) : Promise.resolve(undefined);
      const [id, repoValue] = await Promise.allSettled([fetched.get(imageKey(task, kind))!, repo]);
      if (id.status === 'rejected') fail(task, 'image', message(id.reason));
      else if (repoValue.status === 'rejected') fail(task, 'repo', message(repoValue.reason));
      else prepared.set(task.instance_id, imageTask(task, kind, id.value, repoDir, repoValue.value, envs));
    }),
  ]);

  // Keep the task set's order: reports and diffs stay stable.
  const order = new Map(tasks.map((t, i) => [t.instance_id, i]));
  failures.sort((a, b) => (order.get(a.instance_id) ?? 0) - (order.get(b.instance_id) ?? 0));
  for (const p of prepared.values()) summary.isolation[p.isolation]++;
  summary.prepared = prepared.size;
  summary.failed = failures.length;
  const disk = await envs.store.du().catch(() => undefined);
  if (disk !== undefined) summary.diskBytes = disk.diskBytes;
  summary.durationMs = performance.now() - started;
  return { prepared, failures, summary };
}

/** A prepared image task: a sandbox of the image, or a Docker container of it, with the repo at repoDir. */
function imageTask(task: Task, kind: Exclude<IsolationKind, 'sandbox-venv'>, imageId: string, repoDir: string, repo: Layer | undefined, envs: TaskEnvs): PreparedTask {
  return {
    instance_id: task.instance_id,
    isolation: kind,
    repoDir,
    image: { ref: task.image!, id: imageId, ...(repo ? { repoDigest: repo.digest } : {}) },
    createSandbox: (request: SandboxRequest = {}) =>
      kind === 'docker'
        ? createDockerSandbox({
            imageId,
            instanceId: task.instance_id,
            repoDir,
            ...(repo ? { repoSource: repo.path } : {}),
            ...(request.limits ? { limits: request.limits } : {}),
          })
        : createImageTaskSandbox({
            store: envs.store,
            imageId,
            instanceId: task.instance_id,
            repoDir,
            ...(repo ? { repoLayerPath: repo.path } : {}),
            ...(request.stateDir ? { stateDir: request.stateDir } : {}),
            ...(request.limits ? { limits: request.limits } : {}),
          }),
  };
}
