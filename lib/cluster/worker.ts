/**
 * A node's worker: takes eval jobs from the queue (and prepare jobs for its
 * store), prepares or reuses the task's environment in its own store, runs
 * the evaluation in a sandbox (lib/swe's evaluate, as a local `eval` does),
 * at most `slots` at once, and returns the graded result as the job's value.
 *
 * Failures are BullMQ's: a worker that dies holds its jobs' locks until they
 * expire (`lockDurationMs`), then another worker's stalled-job check puts
 * them back in the queue. A job completes once: BullMQ refuses to complete
 * a job whose lock its worker lost, so a late result is dropped, not counted.
 */
import { randomUUID } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { Worker, WaitingError, UnrecoverableError, type ConnectionOptions, type Job } from 'bullmq';
import { IoBudget, openStore, type LayerStore } from '../layers/index.js';
import { createLimiter } from '../files/limit.js';
import { evaluate } from '../swe/pipeline/evaluate.js';
import { prepareTasks } from '../swe/pipeline/prepare.js';
import { TaskEnvs } from '../swe/pipeline/taskEnvs.js';
import type { PreparedTask } from '../swe/pipeline/types.js';
import type { Task, TaskIsolation } from '../swe/tasks.js';
import { ClusterError } from './errors.js';
import {
  capLog,
  checkEvalJob,
  checkPrepareJob,
  EVAL_JOB,
  JOB_FORMAT,
  keys,
  PREPARE_JOB,
  sha256,
  storeQueueName,
  type EvalJobResult,
  type PrepareJobResult,
} from './jobs.js';
import { connectRedis, waitForRedis, type QueueTarget } from './redis.js';

export interface WorkerOptions {
  target: QueueTarget;
  /** Evaluations at once (default 2). */
  slots?: number;
  /** The node's layer store (default: the store's default root). */
  storeDir?: string;
  /**
   * The node's I/O budget directory (default: the store's own, `<store>/budget`).
   * The budget tells dead holders by pid, which another node's pids are not:
   * workers sharing one store over the network must each give a local one.
   */
  budgetDir?: string;
  /** How long a job's lock lasts without renewal: how soon a dead worker's jobs return (default 30 s, BullMQ's). */
  lockDurationMs?: number;
  /** How often this worker looks for stalled jobs of dead workers (default 30 s, BullMQ's). */
  stalledIntervalMs?: number;
  /** How many times a job may stall (its worker die) before it fails (default 2). */
  maxStalledCount?: number;
  /** How often the announcement is refreshed (default 5 s; it expires after three missed). */
  announceIntervalMs?: number;
  /** Where the worker says what it does (a line per job; default none). */
  onLog?: (line: string) => void;
  /** For tests: an id instead of host-pid-random. */
  id?: string;
}

/** What a worker publishes about itself in Redis (`msbx:<queue>:worker:<id>`). */
export interface WorkerAnnouncement {
  id: string;
  host: string;
  pid: number;
  slots: number;
  /** Evaluations running now. */
  busy: number;
  /** Jobs this worker has finished since it started. */
  done: number;
  store: StoreContents;
  startedAt: string;
  updatedAt: string;
}

export interface StoreContents {
  dir: string;
  /** Names the store, shared by every worker on it (a shared store has one id for all its nodes). */
  id: string;
  /** lib/env's recipe index keys: the venvs this store can give without a build. */
  envRecipes: string[];
  /** Repository layers prepared (lib/swe's refs). */
  repoRefs: number;
  layers: number;
}

export interface ClusterWorker {
  readonly id: string;
  readonly storeId: string;
  /**
   * Stops taking jobs and lets the running ones finish; after `graceMs`
   * (default: wait for them), returns the unfinished ones to the queue for
   * other workers (their sandboxes killed).
   */
  close(opts?: { graceMs?: number }): Promise<void>;
  announcement(): WorkerAnnouncement;
}

/**
 * The store's cluster id: a random name made once (link(2) is atomic and
 * fails if the name exists, so two workers starting on one shared store agree
 * on the first one's id).
 */
async function storeId(store: LayerStore): Promise<string> {
  const file = join(store.root, 'cluster-id');
  try {
    return (await fsp.readFile(file, 'utf8')).trim();
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
  const tmp = join(store.root, 'staging', `cluster-id.${process.pid}.${randomUUID()}`);
  await fsp.writeFile(tmp, `${randomUUID()}\n`);
  try {
    await fsp.link(tmp, file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
  } finally {
    await fsp.rm(tmp, { force: true });
  }
  return (await fsp.readFile(file, 'utf8')).trim();
}

async function names(dir: string, suffix: string): Promise<string[]> {
  try {
    return (await fsp.readdir(dir)).filter((n) => n.endsWith(suffix)).map((n) => n.slice(0, -suffix.length));
  } catch {
    return [];
  }
}

/** What the store holds, read from its directories (lib/env's recipe index, lib/swe's refs, the layers). */
async function storeContents(store: LayerStore, id: string): Promise<StoreContents> {
  const [envRecipes, repoRefs, layers] = await Promise.all([
    names(join(store.root, 'envs', 'recipes'), '.json'),
    names(join(store.root, 'refs', 'swe', 'repo'), '.json'),
    fsp.readdir(join(store.root, 'layers')).catch(() => []),
  ]);
  return { dir: store.root, id, envRecipes: envRecipes.sort(), repoRefs: repoRefs.length, layers: layers.length };
}

type Prepared = { prepared: PreparedTask } | { failure: string };

export async function startWorker(opts: WorkerOptions): Promise<ClusterWorker> {
  const slots = opts.slots ?? 2;
  if (!Number.isInteger(slots) || slots < 1) throw new ClusterError(`worker: slots must be a positive integer, got ${slots}`);
  const log = opts.onLog ?? (() => {});
  const store = await openStore({
    ...(opts.storeDir !== undefined ? { root: opts.storeDir } : {}),
    ...(opts.budgetDir !== undefined ? { budget: new IoBudget({ dir: opts.budgetDir }) } : {}),
  });
  const sid = await storeId(store);
  const id = opts.id ?? `${hostname()}-${process.pid}-${randomUUID().slice(0, 8)}`;
  const { target } = opts;

  const redis = connectRedis(target);
  await waitForRedis(redis, target).catch(async (e: unknown) => {
    redis.disconnect();
    throw e;
  });

  const limit = createLimiter(slots);
  // One TaskEnvs for the worker's life: each interpreter is probed once (a
  // synchronous run of Python, which would otherwise block the event loop,
  // and BullMQ's lock renewals with it, on every job).
  const envs = new TaskEnvs({ store });
  // Environments this worker prepared, by the task's digest: a task's later
  // jobs (another run, a retry) reuse them without asking the store again.
  const preparedTasks = new Map<string, Promise<Prepared>>();
  let busy = 0;
  let done = 0;
  const startedAt = new Date().toISOString();
  let contents = await storeContents(store, sid);
  const returning = new AbortController();

  const prepare = (task: Task, isolation: TaskIsolation | undefined): Promise<Prepared> => {
    const key = sha256(JSON.stringify([task, isolation ?? null]));
    let p = preparedTasks.get(key);
    if (!p) {
      p = prepareTasks([task], { store, envs, concurrency: 1, ...(isolation ? { isolation } : {}) }).then((r) => {
        const prepared = r.prepared.get(task.instance_id);
        return prepared ? { prepared } : { failure: r.failures[0]?.message ?? `task "${task.instance_id}" was not prepared` };
      });
      // A failure may be the node's passing state (a lock timeout, a full
      // disk): it is not kept, so the next job tries again.
      p.then((r) => 'failure' in r && preparedTasks.delete(key), () => preparedTasks.delete(key));
      preparedTasks.set(key, p);
    }
    return p;
  };

  /** A job this worker gives back: into the queue's wait list for any worker, not failed. */
  const giveBack = async (job: Job, token: string | undefined): Promise<never> => {
    await job.moveToWait(token);
    log(`returned ${job.id} to the queue`);
    throw new WaitingError();
  };

  const evalProcessor = async (job: Job, token?: string, signal?: AbortSignal): Promise<EvalJobResult> => {
    if (job.name !== EVAL_JOB) throw new UnrecoverableError(`job ${job.id}: unknown job name ${JSON.stringify(job.name)} (this worker runs "${EVAL_JOB}")`);
    let data;
    try {
      data = checkEvalJob(job.data, String(job.id));
    } catch (e) {
      // A payload that is not what the coordinator sends fails for good: no
      // other worker would read it otherwise.
      throw new UnrecoverableError((e as Error).message);
    }
    return limit(async () => {
      if (returning.signal.aborted) return giveBack(job, token);
      busy++;
      log(`${job.id}: started (attempt ${job.attemptsMade + 1}${job.stalledCounter ? `, after ${job.stalledCounter} stalled worker(s)` : ''})`);
      try {
        const both = AbortSignal.any([returning.signal, ...(signal ? [signal] : [])]);
        const p = await prepare(data.task, data.isolation);
        if (returning.signal.aborted) return await giveBack(job, token);
        const base = { format: JOB_FORMAT, instance_id: data.task.instance_id, predictionDigest: data.predictionDigest, worker: id } as const;
        if ('failure' in p) {
          log(`${job.id}: not prepared: ${p.failure}`);
          return { ...base, notPrepared: p.failure };
        }
        const result = await evaluate(data.task, data.prediction.model_patch, { prepared: p.prepared, timeoutMs: data.timeoutMs, signal: both });
        // An evaluation cut short to return the job is not a result.
        if (returning.signal.aborted) return await giveBack(job, token);
        log(`${job.id}: ${result.reward.resolved ? 'resolved' : result.timedOut ? 'timed out' : 'not resolved'}`);
        return { ...base, result: { ...result, log: capLog(result.log) } };
      } finally {
        busy--;
        done++;
      }
    });
  };

  const prepareProcessor = async (job: Job): Promise<PrepareJobResult> => {
    if (job.name !== PREPARE_JOB) throw new UnrecoverableError(`job ${job.id}: unknown job name ${JSON.stringify(job.name)} (this queue runs "${PREPARE_JOB}")`);
    let data;
    try {
      data = checkPrepareJob(job.data, String(job.id));
    } catch (e) {
      throw new UnrecoverableError((e as Error).message);
    }
    log(`${job.id}: preparing ${data.tasks.length} task(s) in ${store.root}`);
    const r = await prepareTasks(data.tasks, { store, envs, concurrency: slots, ...(data.isolation ? { isolation: data.isolation } : {}) });
    contents = await storeContents(store, sid);
    await announce();
    return { format: JOB_FORMAT, worker: id, storeId: sid, storeDir: store.root, summary: r.summary, failures: r.failures };
  };

  const workerOpts = {
    connection: target.connection as ConnectionOptions,
    lockDuration: opts.lockDurationMs ?? 30_000,
    stalledInterval: opts.stalledIntervalMs ?? 30_000,
    maxStalledCount: opts.maxStalledCount ?? 2,
    autorun: false,
  };
  // BullMQ holds `slots` jobs at once; the limiter is what bounds the
  // sandboxes (prepare jobs share nothing with it: one at a time, per store).
  const evalWorker = new Worker(target.queueName, evalProcessor, { ...workerOpts, concurrency: slots });
  const prepWorker = new Worker(storeQueueName(target.queueName, sid), prepareProcessor, { ...workerOpts, concurrency: 1 });
  for (const w of [evalWorker, prepWorker]) w.on('error', (e) => log(`queue error: ${e.message}`));

  const announcement = (): WorkerAnnouncement => ({ id, host: hostname(), pid: process.pid, slots, busy, done, store: contents, startedAt, updatedAt: new Date().toISOString() });
  const announceMs = opts.announceIntervalMs ?? 5000;
  const announce = async () => {
    await redis.set(keys.worker(target.queueName, id), JSON.stringify(announcement()), 'PX', announceMs * 3).catch((e: Error) => log(`announce: ${e.message}`));
  };
  let refreshes = 0;
  const timer = setInterval(() => {
    // The store's listing every sixth refresh (~30 s): other workers on a shared store add to it.
    if (++refreshes % 6 === 0) void storeContents(store, sid).then((c) => (contents = c));
    void announce();
  }, announceMs);
  timer.unref();
  await announce();
  void evalWorker.run();
  void prepWorker.run();
  await Promise.all([evalWorker.waitUntilReady(), prepWorker.waitUntilReady()]);
  log(`worker ${id}: ${slots} slot(s), store ${store.root} (id ${sid}), queue ${target.display}`);

  let closing: Promise<void> | undefined;
  return {
    id,
    storeId: sid,
    announcement,
    close({ graceMs } = {}) {
      // A later call may shorten the grace of a close under way (a second SIGTERM).
      if (graceMs === 0) returning.abort();
      closing ??= (async () => {
        clearInterval(timer);
        await redis.del(keys.worker(target.queueName, id)).catch(() => {});
        const grace = graceMs !== undefined && graceMs > 0 ? setTimeout(() => returning.abort(), graceMs) : undefined;
        try {
          await Promise.all([evalWorker.close(), prepWorker.close()]);
        } finally {
          clearTimeout(grace);
          redis.disconnect();
        }
        log(`worker ${id}: stopped after ${done} job(s)`);
      })();
      return closing;
    },
  };
}

/** Every worker announced on the queue now (expired announcements are gone: their workers stopped refreshing). */
export async function listWorkers(target: QueueTarget): Promise<WorkerAnnouncement[]> {
  const redis = connectRedis(target);
  try {
    await waitForRedis(redis, target);
    const found: WorkerAnnouncement[] = [];
    let cursor = '0';
    do {
      const [next, batch] = await redis.scan(cursor, 'MATCH', keys.workerPattern(target.queueName), 'COUNT', 100);
      cursor = next;
      if (batch.length > 0) {
        for (const v of await redis.mget(...batch)) if (v) found.push(JSON.parse(v) as WorkerAnnouncement);
      }
    } while (cursor !== '0');
    return found.sort((a, b) => (a.id < b.id ? -1 : 1));
  } finally {
    redis.disconnect();
  }
}
