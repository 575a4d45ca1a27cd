/**
 * What the commands that use a queue (worker, eval --queue, prepare --queue)
 * share: the queue URL and the Redis credentials' options, read into a
 * QueueTarget by lib/cluster.
 */
import { ClusterError, evaluateOnQueue, parseQueueUrl, prepareOnQueue, REDIS_PASSWORD_ENV, type QueueTarget } from '../cluster/index.js';
import { createProgress } from '../swe/pipeline/progress.js';
import type { EvalRunReport } from '../swe/pipeline/runReport.js';
import type { Prediction, Task, TaskIsolation } from '../swe/tasks.js';
import { CommandError, type Args, type OptionSpec } from './args.js';
import { redisClientOptions, redisOptions } from './redis.js';
import { err, printPrepareSummary, writeRunOutputs } from './swe.js';

const REDIS = 'Queue (Redis)';

export const QUEUE_OPTIONS: Record<string, OptionSpec> = {
  '--queue': {
    values: ['URL'],
    section: REDIS,
    help: `redis://[USER@]HOST:PORT/NAME (rediss:// for TLS): the BullMQ queue
NAME on that Redis. The password comes from --redis-password-file or
${REDIS_PASSWORD_ENV} (a password in the URL is visible to ps)`,
  },
  ...redisOptions(REDIS),
};

/** The queue the options name (a CommandError in the options' terms otherwise); hides a password given in the URL from ps. */
export function queueTarget(args: Args, command: string): QueueTarget {
  const url = args.get('--queue')!;
  const redis = redisClientOptions(args);
  let target: QueueTarget;
  try {
    target = parseQueueUrl(url, redis);
  } catch (e) {
    throw new CommandError((e as Error).message, { cause: e });
  }
  if (target.connection.password !== undefined && /\/\/[^/@]*:[^/@]*@/.test(url)) {
    // /proc/<pid>/cmdline is readable by every local user: from now on it shows the URL without its password.
    process.title = [process.argv0, process.argv[1] ?? '', command, ...args.argv.map((a) => (a === url ? target.display : a))].join(' ');
    process.stderr.write(`minisandbox ${command}: warning: the password in --queue was visible to every local user (ps) while the command started; use --redis-password-file or ${REDIS_PASSWORD_ENV}\n`);
  }
  return target;
}

export interface QueueRunOptions {
  tasks: Task[];
  predictions: Prediction[];
  timeoutMs: number;
  reportFile?: string;
  logsDir?: string;
  isolation?: TaskIsolation;
}

/** `eval --queue`: the run through the queue, progress as results arrive from every worker, then the same outputs as a local eval. */
export async function runQueueEvaluation(args: Args, o: QueueRunOptions): Promise<EvalRunReport> {
  const target = queueTarget(args, 'eval');
  const progress = createProgress();
  const runId = args.get('--run-id');
  const workersSeen = new Set<string>();
  const ac = new AbortController();
  // SIGINT leaves the jobs to the workers; the same command resumes.
  const onSignal = () => ac.abort(new CommandError(`interrupted: the queue's workers go on with run ${id}; run the same command again to resume it`));
  let id = runId ?? '(computing)';
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    const run = await evaluateOnQueue(o.tasks, o.predictions, {
      target,
      ...(runId !== undefined ? { runId } : {}),
      timeoutMs: o.timeoutMs,
      ...(o.isolation ? { isolation: o.isolation } : {}),
      signal: ac.signal,
      onProgress: (p) => {
        if (p.worker) workersSeen.add(p.worker);
        if (p.instance_id) progress.update(p.done, p.total, `${p.instance_id}: ${p.status}${p.worker ? ` (${p.worker})` : ''}; ${p.workers} worker(s) on ${target.display}`);
        else if (p.workers === 0) progress.log(`waiting: no worker is announced on ${target.display} (start 'minisandbox worker --queue ...' on a node)`);
      },
    }).catch((e: unknown) => {
      if (ac.signal.aborted) throw ac.signal.reason;
      throw e;
    });
    id = run.runId;
    progress.end();
    err(`run ${run.runId}: ${run.results.length} result(s) from ${new Set(Object.values(run.gradedBy)).size} worker(s)${run.resumed ? `, ${run.resumed} already graded before this call` : ''}`);
    writeRunOutputs(run.report, run.results, { predictions: o.predictions, ...(o.reportFile ? { reportFile: o.reportFile } : {}), ...(o.logsDir ? { logsDir: o.logsDir } : {}) });
    return run.report;
  } catch (e) {
    progress.end();
    if (e instanceof ClusterError) throw new CommandError(e.message, { cause: e });
    throw e;
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
}

/** `prepare --queue`: every announced store prepared once; prints each store's summary. The number of tasks not prepared, over all stores. */
export async function runQueuePrepare(args: Args, tasks: Task[], rejected: number, isolation?: TaskIsolation): Promise<number> {
  const target = queueTarget(args, 'prepare');
  let result;
  try {
    result = await prepareOnQueue(tasks, { target, ...(isolation ? { isolation } : {}), onProgress: (line) => err(line) });
  } catch (e) {
    if (e instanceof ClusterError) throw new CommandError(e.message, { cause: e });
    throw e;
  }
  let failed = 0;
  for (const s of result.stores) {
    for (const f of s.failures) err(`not prepared in ${s.storeDir} (${s.worker}): ${f.message}`);
    err(`store ${s.storeDir} (${s.worker}):`);
    printPrepareSummary(s.summary, rejected, s.storeDir);
    failed += s.summary.failed;
  }
  return failed;
}
