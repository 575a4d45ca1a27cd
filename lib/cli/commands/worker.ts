/** `minisandbox worker`: a node's worker on a BullMQ queue (lib/cluster). */
import { startWorker } from '../../cluster/index.js';
import { absolutePath, positiveInt, seconds, type Command } from '../args.js';
import { queueTarget, QUEUE_OPTIONS } from '../cluster.js';
import { STORE_OPTION } from '../options.js';

const workerCommand: Command = {
  spec: {
    name: 'worker',
    usage: ['minisandbox worker --queue redis://HOST:PORT/NAME [--slots N] [--store DIR]'],
    about: `Takes evaluation jobs (from 'eval --queue') and preparation jobs (from
'prepare --queue') from a BullMQ queue on Redis, prepares or reuses each
task's environment in this node's store, runs it in a sandbox, at most N at
once, and returns the graded result. It announces its slots and what its
store holds in Redis while it runs. One worker per node; see docs/cluster.md.

SIGTERM or SIGINT: stop taking jobs and finish the running ones; after
--grace seconds (or at a second signal) the unfinished ones are returned to
the queue for other workers. A worker killed outright (SIGKILL, a dead node)
holds its jobs until their locks expire (--lock-timeout); another worker
then takes them.`,
    options: {
      ...QUEUE_OPTIONS,
      '--queue': { ...QUEUE_OPTIONS['--queue']!, required: true },
      '--slots': { values: ['N'], check: positiveInt, default: '2', help: 'Evaluations at once (and builds of a prepare job)' },
      '--store': STORE_OPTION,
      '--budget-dir': {
        values: ['DIR'],
        check: absolutePath,
        help: `The node's I/O budget for unpacking layers (default: DIR/budget of
--store). A store shared by several nodes needs a local directory on each`,
      },
      '--grace': { values: ['S'], check: seconds, default: '300', help: 'How long running jobs may finish after SIGTERM' },
      '--lock-timeout': {
        values: ['S'],
        check: seconds,
        default: '30',
        help: `How long a job stays with a worker that stopped renewing its lock:
how soon a dead worker's jobs go to another (BullMQ's lockDuration)`,
      },
      '--quiet': { help: 'No line per job on stderr' },
    },
    exitCodes: 'Exit code: 0 after SIGTERM or SIGINT (jobs finished or returned); 1 if the worker cannot start (Redis unreachable...); 2 on usage errors.',
  },
  async run(args) {
    const target = queueTarget(args, 'worker');
    const lockMs = args.get<number>('--lock-timeout')! * 1000;
    const quiet = args.has('--quiet');
    const worker = await startWorker({
      target,
      slots: args.get<number>('--slots')!,
      storeDir: args.get('--store')!,
      ...(args.get('--budget-dir') !== undefined ? { budgetDir: args.get('--budget-dir')! } : {}),
      lockDurationMs: lockMs,
      // Look for dead workers' jobs as often as a lock can expire.
      stalledIntervalMs: Math.max(1000, Math.min(30_000, lockMs)),
      onLog: (line) => {
        if (!quiet || line.startsWith('worker ')) process.stderr.write(`minisandbox worker: ${line}\n`);
      },
    });
    await new Promise<void>((resolve) => {
      let signals = 0;
      const stop = () => {
        signals++;
        if (signals === 1) {
          process.stderr.write(`minisandbox worker: stopping: running jobs finish (at most ${args.get('--grace')} s), then return to the queue\n`);
          void worker.close({ graceMs: args.get<number>('--grace')! * 1000 }).then(resolve, resolve);
        } else {
          // A second signal: return the jobs now.
          void worker.close({ graceMs: 0 });
        }
      };
      process.on('SIGINT', stop);
      process.on('SIGTERM', stop);
    });
    return 0;
  },
};

export const commands = [workerCommand];
