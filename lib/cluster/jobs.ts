/**
 * What travels through the queue, and how a worker checks it. A job is data:
 * a task record and a patch, read by lib/swe's own parsers on the worker as
 * `eval` reads them from files, and run only inside a sandbox. Nothing in a
 * payload names code to load or a command to run outside one.
 */
import { createHash } from 'node:crypto';
import { isAbsolute } from 'node:path';
import { parsePredictions, parseTasks, isImageFile, type Prediction, type Task, type TaskIsolation } from '../swe/tasks.js';
import type { EvalResult } from '../swe/pipeline/evaluate.js';
import type { PrepareFailure, PrepareSummary } from '../swe/pipeline/prepare.js';
import { ClusterError } from './errors.js';

/** The payload format; a worker refuses another (an older or newer coordinator). */
export const JOB_FORMAT = 1;
export const EVAL_JOB = 'eval';
export const PREPARE_JOB = 'prepare';

export interface EvalJobData {
  format: typeof JOB_FORMAT;
  runId: string;
  task: Task;
  prediction: Prediction;
  /** The digest of the prediction's patch: what the result is keyed by. */
  predictionDigest: string;
  timeoutMs: number;
  isolation?: TaskIsolation;
}

export interface EvalJobResult {
  format: typeof JOB_FORMAT;
  instance_id: string;
  predictionDigest: string;
  /** The worker that graded it (its announced id). */
  worker: string;
  /** The graded evaluation; absent when the task could not be prepared on that node. */
  result?: EvalResult;
  /** Why the task could not be prepared (PrepareFailure.message), as a local eval reports it. */
  notPrepared?: string;
}

export interface PrepareJobData {
  format: typeof JOB_FORMAT;
  runId: string;
  tasks: Task[];
  isolation?: TaskIsolation;
}

export interface PrepareJobResult {
  format: typeof JOB_FORMAT;
  worker: string;
  storeId: string;
  storeDir: string;
  summary: PrepareSummary;
  failures: PrepareFailure[];
}

/** A result's log above this is cut (its head and tail kept): a job's value lives in Redis. */
export const MAX_LOG_BYTES = 1 << 20;

export function sha256(text: string): string {
  return createHash('sha256').update(text).digest('hex');
}

/** The digest results are keyed by: the patch text, a null patch told apart from an empty one. */
export function predictionDigest(p: Pick<Prediction, 'model_patch'>): string {
  return sha256(p.model_patch === null ? '\0null' : `\0patch\0${p.model_patch}`);
}

/**
 * The id of one instance's job in a run. BullMQ refuses ':' in ids, and an
 * instance id is the user's text: it is percent-encoded. The same run and
 * instance give the same id, so adding it again is a no-op (BullMQ keeps one
 * job per id): re-running a command resumes it.
 */
export function evalJobId(runId: string, instanceId: string): string {
  return `${runId}.${encodeURIComponent(instanceId).replace(/\./g, '%2E')}`;
}

/**
 * A run's default id: a digest of what decides its results (each task and
 * prediction, the time limit, the isolation), so that the same command run
 * again is the same run, and a changed prediction is another.
 */
export function defaultRunId(tasks: readonly Task[], predictions: readonly Prediction[], timeoutMs: number, isolation?: TaskIsolation): string {
  const byId = new Map(tasks.map((t) => [t.instance_id, t]));
  const parts = [...predictions]
    .sort((a, b) => (a.instance_id < b.instance_id ? -1 : a.instance_id > b.instance_id ? 1 : 0))
    .map((p) => [p.instance_id, sha256(JSON.stringify(byId.get(p.instance_id) ?? null)), predictionDigest(p)]);
  return `run-${sha256(JSON.stringify({ parts, timeoutMs, isolation: isolation ?? null })).slice(0, 16)}`;
}

export const RUN_ID = /^[A-Za-z0-9_-]{1,64}$/;

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** One task record as the worker's loader reads it: lib/swe's parseTasks, then the node's rules on paths. */
function checkTask(raw: unknown, where: string): Task {
  if (!isRecord(raw)) throw new ClusterError(`${where}: task is not a JSON object`);
  const { tasks, errors } = parseTasks(JSON.stringify(raw), 'jsonl');
  if (errors.length > 0 || tasks.length !== 1) throw new ClusterError(`${where}: ${errors.map((e) => e.message).join('; ') || 'not one task'}`);
  const task = tasks[0]!;
  // Relative paths would be resolved against the worker's cwd, which means
  // nothing to the coordinator: it sends them absolute (loadTasks did).
  if (task.repo_path !== undefined && !isAbsolute(task.repo_path)) throw new ClusterError(`${where}: repo_path ${JSON.stringify(task.repo_path)} is relative; a queued task needs an absolute path every node can read`);
  if (task.image !== undefined && isImageFile(task.image) && !isAbsolute(task.image)) throw new ClusterError(`${where}: image file ${JSON.stringify(task.image)} is relative; a queued task needs an absolute path every node can read`);
  // git runs on the node, outside any sandbox, to fetch a repo_url: only the
  // network transports git trusts by default, never `ext::` (runs a
  // command) or another remote helper a URL could name.
  if (task.repo_url !== undefined && !/^(https?|git|ssh):\/\/[^\s]+$/.test(task.repo_url) && !/^[\w.-]+@[\w.-]+:(?!:)[^\s]*$/.test(task.repo_url)) {
    throw new ClusterError(`${where}: repo_url ${JSON.stringify(task.repo_url)}: a queued task's repository is fetched over https://, http://, git://, ssh:// or user@host:path only`);
  }
  return task;
}

function checkHeader(raw: unknown, where: string): Record<string, unknown> {
  if (!isRecord(raw)) throw new ClusterError(`${where}: the payload is not a JSON object`);
  if (raw.format !== JOB_FORMAT) throw new ClusterError(`${where}: payload format ${JSON.stringify(raw.format)}, this worker reads ${JOB_FORMAT} (coordinator and workers must run the same MiniSandbox)`);
  if (typeof raw.runId !== 'string' || !RUN_ID.test(raw.runId)) throw new ClusterError(`${where}: runId ${JSON.stringify(raw.runId)} is not a run id`);
  if (raw.isolation !== undefined && raw.isolation !== 'sandbox' && raw.isolation !== 'docker') throw new ClusterError(`${where}: isolation ${JSON.stringify(raw.isolation)} is neither "sandbox" nor "docker"`);
  return raw;
}

/** An eval job's payload, checked as `eval` checks its files; a ClusterError naming the job and the field otherwise. */
export function checkEvalJob(raw: unknown, jobId: string): EvalJobData {
  const where = `job ${jobId}`;
  const data = checkHeader(raw, where);
  const task = checkTask(data.task, where);
  const { predictions, errors } = parsePredictions(JSON.stringify(data.prediction ?? null), 'jsonl');
  if (errors.length > 0 || predictions.length !== 1) throw new ClusterError(`${where}: prediction: ${errors.map((e) => e.message).join('; ') || 'not one prediction'}`);
  const prediction = predictions[0]!;
  if (prediction.instance_id !== task.instance_id) throw new ClusterError(`${where}: the prediction is for "${prediction.instance_id}", the task is "${task.instance_id}"`);
  if (data.predictionDigest !== predictionDigest(prediction)) throw new ClusterError(`${where}: predictionDigest does not match the patch`);
  if (typeof data.timeoutMs !== 'number' || !Number.isFinite(data.timeoutMs) || data.timeoutMs <= 0) throw new ClusterError(`${where}: timeoutMs ${JSON.stringify(data.timeoutMs)} is not a positive number`);
  return {
    format: JOB_FORMAT,
    runId: data.runId as string,
    task,
    prediction,
    predictionDigest: data.predictionDigest as string,
    timeoutMs: data.timeoutMs,
    ...(data.isolation !== undefined ? { isolation: data.isolation as TaskIsolation } : {}),
  };
}

/** A prepare job's payload, checked likewise. */
export function checkPrepareJob(raw: unknown, jobId: string): PrepareJobData {
  const where = `job ${jobId}`;
  const data = checkHeader(raw, where);
  if (!Array.isArray(data.tasks) || data.tasks.length === 0) throw new ClusterError(`${where}: tasks is not a non-empty list`);
  const tasks = data.tasks.map((t, i) => checkTask(t, `${where}: task ${i}`));
  return { format: JOB_FORMAT, runId: data.runId as string, tasks, ...(data.isolation !== undefined ? { isolation: data.isolation as TaskIsolation } : {}) };
}

/** `log` cut to MAX_LOG_BYTES, its head and tail kept (the test output's end holds the summary). */
export function capLog(log: string): string {
  if (Buffer.byteLength(log) <= MAX_LOG_BYTES) return log;
  const half = MAX_LOG_BYTES / 2;
  const buf = Buffer.from(log);
  return `${buf.subarray(0, half).toString()}\n>>>>> [${buf.length - MAX_LOG_BYTES} bytes cut by the worker: a queued result's log is at most ${MAX_LOG_BYTES} bytes]\n${buf.subarray(buf.length - half).toString()}`;
}

/** Redis keys of lib/cluster's own (BullMQ's are `bull:<queue>:...`). */
export const keys = {
  /** One key per live worker, expiring unless refreshed: its announcement. */
  worker: (queue: string, id: string) => `msbx:${queue}:worker:${id}`,
  workerPattern: (queue: string) => `msbx:${queue}:worker:*`,
};

/** The queue a store's prepare jobs go to: every worker on that store takes them. */
export function storeQueueName(queue: string, storeId: string): string {
  return `${queue}.store.${storeId}`;
}
