/**
 * The coordinator's side: a whole evaluation (or preparation) run through
 * the queue. It enqueues one job per instance, watches them finish on every
 * worker, and builds the report with lib/swe's own report code: a queue run
 * and a local run of the same predictions give the same report.
 *
 * Resuming is BullMQ's job ids: an instance's job id is the run's id and the
 * instance, so running the same command again adds nothing that exists,
 * reads the results already there, and waits only for the rest.
 */
import { Queue, type ConnectionOptions, type Job } from 'bullmq';
import type { InstanceOutcome } from '../swe/grading.js';
import type { EvalResult } from '../swe/pipeline/evaluate.js';
import type { PrepareFailure, PrepareSummary } from '../swe/pipeline/prepare.js';
import { buildRunReport, type EvalRunReport } from '../swe/pipeline/runReport.js';
import type { Prediction, Task, TaskIsolation } from '../swe/tasks.js';
import { ClusterError } from './errors.js';
import {
  defaultRunId,
  EVAL_JOB,
  evalJobId,
  JOB_FORMAT,
  PREPARE_JOB,
  predictionDigest,
  RUN_ID,
  storeQueueName,
  type EvalJobData,
  type EvalJobResult,
  type PrepareJobData,
  type PrepareJobResult,
} from './jobs.js';
import { connectRedis, waitForRedis, type QueueTarget } from './redis.js';
import { listWorkers, type WorkerAnnouncement } from './worker.js';

/** How long finished jobs stay in Redis (their results, for resuming and for the report): 7 days. */
export const KEEP_JOBS_S = 7 * 24 * 3600;
/** Attempts of a job whose worker threw (Redis or the store failed on that node; not a failing patch, which is a result). */
const ATTEMPTS = 3;

export interface QueueRunProgress {
  /** Instances with a result (or a final failure). */
  done: number;
  total: number;
  /** The instance just finished, if any. */
  instance_id?: string;
  /** 'resolved', 'not resolved', 'timed out', 'error: ...', or 'already graded' on a resumed run. */
  status?: string;
  /** The worker that graded it. */
  worker?: string;
  /** Workers announced on the queue at the last look. */
  workers: number;
}

export interface EvaluateOnQueueOptions {
  target: QueueTarget;
  /** The run's id (default: a digest of the tasks, predictions, timeout and isolation: the same command resumes the same run). */
  runId?: string;
  timeoutMs: number;
  isolation?: TaskIsolation;
  onProgress?: (p: QueueRunProgress) => void;
  /** How often finished jobs are looked for (default 500 ms). */
  pollMs?: number;
  signal?: AbortSignal;
}

export interface EvaluateOnQueueResult {
  runId: string;
  report: EvalRunReport;
  results: EvalResult[];
  /** instance_id -> the worker that graded it. */
  gradedBy: Record<string, string>;
  /** Instances whose results were already in Redis when this call started (a resumed run). */
  resumed: number;
}

function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function openQueue(target: QueueTarget, name = target.queueName): Queue {
  return new Queue(name, { connection: target.connection as ConnectionOptions });
}

async function announced(target: QueueTarget): Promise<WorkerAnnouncement[]> {
  return listWorkers(target).catch(() => []);
}

/**
 * Evaluates `predictions` on `tasks` through the queue's workers and builds
 * the report as `evaluateAll` does. Interrupting it (the signal, or the
 * process) leaves the jobs running on the workers; the same call later
 * resumes: graded instances are read, not run again.
 */
export async function evaluateOnQueue(tasks: readonly Task[], predictions: readonly Prediction[], opts: EvaluateOnQueueOptions): Promise<EvaluateOnQueueResult> {
  const started = performance.now();
  const runId = opts.runId ?? defaultRunId(tasks, predictions, opts.timeoutMs, opts.isolation);
  if (!RUN_ID.test(runId)) throw new ClusterError(`run id ${JSON.stringify(runId)}: 1 to 64 letters, digits, '_' or '-'`);
  const byId = new Map(tasks.map((t) => [t.instance_id, t]));
  const seen = new Set<string>();
  for (const p of predictions) {
    if (seen.has(p.instance_id)) throw new ClusterError(`prediction "${p.instance_id}" is given twice: one run grades one patch per instance`);
    seen.add(p.instance_id);
  }
  // As evaluateAll: a prediction for no task of the set is not run.
  const runnable = predictions.filter((p) => byId.has(p.instance_id));

  const redis = connectRedis(opts.target);
  await waitForRedis(redis, opts.target).finally(() => redis.disconnect());
  const queue = openQueue(opts.target);
  try {
    const jobs = runnable.map((p) => {
      const data: EvalJobData = {
        format: JOB_FORMAT,
        runId,
        task: byId.get(p.instance_id)!,
        prediction: p,
        predictionDigest: predictionDigest(p),
        timeoutMs: opts.timeoutMs,
        ...(opts.isolation ? { isolation: opts.isolation } : {}),
      };
      return {
        name: EVAL_JOB,
        data,
        opts: {
          jobId: evalJobId(runId, p.instance_id),
          attempts: ATTEMPTS,
          backoff: { type: 'exponential', delay: 1000 },
          removeOnComplete: { age: KEEP_JOBS_S },
          removeOnFail: { age: KEEP_JOBS_S },
        },
      };
    });
    // Adding an id that exists is a no-op: a resumed run's finished jobs stay as they are.
    for (let i = 0; i < jobs.length; i += 500) await queue.addBulk(jobs.slice(i, i + 500));

    const results = new Map<string, EvalResult>();
    const failures = new Map<string, string>();
    const gradedBy: Record<string, string> = {};
    const pending = new Map(runnable.map((p) => [evalJobId(runId, p.instance_id), p]));
    let workers = (await announced(opts.target)).length;
    let resumed = 0;
    let first = true;
    let lastWorkerLook = performance.now();

    const take = (job: Job | undefined, p: Prediction): string | undefined => {
      if (!job) return `job ${evalJobId(runId, p.instance_id)} is gone from Redis (removed by hand?); run again to enqueue it`;
      if (!job.finishedOn) return undefined;
      const value = job.returnvalue as EvalJobResult | null;
      if (value && typeof value === 'object' && value.instance_id === p.instance_id) {
        // The grader's side of "counted once": a result for another patch
        // (a job id reused by hand) is not this prediction's.
        if (value.predictionDigest !== predictionDigest(p)) return `job ${job.id}: its result is for another patch of "${p.instance_id}"`;
        gradedBy[p.instance_id] = value.worker;
        if (value.result) results.set(p.instance_id, value.result);
        else failures.set(p.instance_id, value.notPrepared ?? `task "${p.instance_id}" was not prepared`);
        return 'ok';
      }
      if (job.failedReason) {
        failures.set(p.instance_id, `queue job ${job.id} failed after ${job.attemptsMade} attempt(s): ${job.failedReason}`);
        return 'ok';
      }
      return undefined;
    };

    while (pending.size > 0) {
      if (!first) await sleep(opts.pollMs ?? 500, opts.signal);
      opts.signal?.throwIfAborted();
      const ids = [...pending.keys()];
      const found = await Promise.all(ids.map((id) => queue.getJob(id)));
      for (let i = 0; i < ids.length; i++) {
        const p = pending.get(ids[i]!)!;
        const job = found[i];
        // A resumed run retries what failed before: an instance not graded is not done.
        if (first && job?.finishedOn && !job.returnvalue && job.failedReason) {
          await job.retry('failed');
          continue;
        }
        const taken = take(job, p);
        if (taken === undefined) continue;
        if (taken !== 'ok') throw new ClusterError(`queue ${opts.target.display}, run ${runId}: ${taken}`);
        pending.delete(ids[i]!);
        if (first) resumed++;
        const r = results.get(p.instance_id);
        const status = first ? 'already graded' : r ? (r.reward.resolved ? 'resolved' : r.timedOut ? 'timed out' : 'not resolved') : `error: ${failures.get(p.instance_id)}`;
        opts.onProgress?.({ done: runnable.length - pending.size, total: runnable.length, instance_id: p.instance_id, status, ...(gradedBy[p.instance_id] ? { worker: gradedBy[p.instance_id] } : {}), workers });
      }
      if (performance.now() - lastWorkerLook > 5000) {
        workers = (await announced(opts.target)).length;
        lastWorkerLook = performance.now();
        opts.onProgress?.({ done: runnable.length - pending.size, total: runnable.length, workers });
      }
      first = false;
    }

    // The outcomes as evaluateAll makes them: a result, or an error.
    const outcomes: InstanceOutcome[] = [];
    const errors: Record<string, string> = {};
    for (const p of runnable) {
      const r = results.get(p.instance_id);
      if (r) {
        if (r.error !== undefined) errors[p.instance_id] = r.error;
        outcomes.push({ instance_id: p.instance_id, model_patch: p.model_patch, report: r.report, ...(r.error !== undefined ? { error: r.error } : {}) });
      } else {
        const why = failures.get(p.instance_id)!;
        errors[p.instance_id] = why;
        outcomes.push({ instance_id: p.instance_id, model_patch: p.model_patch, error: why });
      }
    }
    const order = new Map(tasks.map((t, i) => [t.instance_id, i]));
    const list = [...results.values()].sort((a, b) => order.get(a.instance_id)! - order.get(b.instance_id)!);
    const report = buildRunReport(tasks, list, outcomes, errors, performance.now() - started);
    return { runId, report, results: list, gradedBy, resumed };
  } finally {
    await queue.close();
  }
}

export interface PrepareOnQueueOptions {
  target: QueueTarget;
  runId?: string;
  isolation?: TaskIsolation;
  /** Stores to prepare: default every store a live worker announces (each once, however many workers share it). */
  onProgress?: (line: string) => void;
  pollMs?: number;
  signal?: AbortSignal;
}

export interface PrepareOnQueueResult {
  /** One per store, from the worker that prepared it. */
  stores: Array<{ storeId: string; storeDir: string; worker: string; summary: PrepareSummary; failures: PrepareFailure[] }>;
}

/**
 * Prepares `tasks` in every store the queue's live workers announce: one
 * prepare job per store (a store shared by several nodes is prepared once,
 * by whichever of its workers takes the job; builds of one key are
 * serialised by the store's file locks anyway). Fails if no worker is there.
 */
export async function prepareOnQueue(tasks: readonly Task[], opts: PrepareOnQueueOptions): Promise<PrepareOnQueueResult> {
  const workers = await listWorkers(opts.target);
  if (workers.length === 0) throw new ClusterError(`queue ${opts.target.display}: no worker is announced; start 'minisandbox worker --queue ...' on each node first`);
  const stores = new Map<string, WorkerAnnouncement>();
  for (const w of workers) if (!stores.has(w.store.id)) stores.set(w.store.id, w);
  const runId = opts.runId ?? `prep-${defaultRunId(tasks, [], 0, opts.isolation).slice(4)}-${Date.now().toString(36)}`;
  const data: PrepareJobData = { format: JOB_FORMAT, runId, tasks: [...tasks], ...(opts.isolation ? { isolation: opts.isolation } : {}) };
  const queues = [...stores.keys()].map((sid) => ({ sid, queue: openQueue(opts.target, storeQueueName(opts.target.queueName, sid)) }));
  try {
    for (const { sid, queue } of queues) {
      await queue.add(PREPARE_JOB, data, { jobId: runId, attempts: 1, removeOnComplete: { age: KEEP_JOBS_S }, removeOnFail: { age: KEEP_JOBS_S } });
      opts.onProgress?.(`store ${sid} (${stores.get(sid)!.store.dir} on ${stores.get(sid)!.host}): preparing ${tasks.length} task(s)`);
    }
    const out: PrepareOnQueueResult['stores'] = [];
    const pending = new Set(queues.map((q) => q.sid));
    while (pending.size > 0) {
      await sleep(opts.pollMs ?? 500, opts.signal);
      for (const { sid, queue } of queues) {
        if (!pending.has(sid)) continue;
        const job = await queue.getJob(runId);
        if (!job?.finishedOn) continue;
        pending.delete(sid);
        const v = job.returnvalue as PrepareJobResult | null;
        if (!v) throw new ClusterError(`queue ${opts.target.display}: preparing store ${sid} failed: ${job.failedReason ?? 'no result'}`);
        out.push({ storeId: v.storeId, storeDir: v.storeDir, worker: v.worker, summary: v.summary, failures: v.failures });
        opts.onProgress?.(`store ${sid}: prepared ${v.summary.prepared}/${v.summary.tasks} by ${v.worker}`);
      }
    }
    return { stores: out };
  } finally {
    await Promise.all(queues.map((q) => q.queue.close()));
  }
}
