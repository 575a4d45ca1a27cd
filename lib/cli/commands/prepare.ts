/** `minisandbox prepare`: the environments of a task set. */
import { readableFile, UsageError, type Command } from '../args.js';
import { JOBS_OPTION, STORE_OPTION } from '../options.js';
import { INSTALL_NETWORK_OPTION, ISOLATION_OPTION, prepareWithProgress, readTasks } from '../swe.js';
import type { TaskIsolation } from '../../swe/tasks.js';
import { QUEUE_OPTIONS, runQueuePrepare } from '../cluster.js';
import { REDIS_FLAGS, refuseWithoutQueue } from '../redis.js';

const prepareCommand: Command = {
  spec: {
    name: 'prepare',
    about: `Builds the environments of a task set (SWE-bench JSONL/JSON with recipe
fields python, install, test_cmd, repo_path or repo_url): one venv layer
per repo+version recipe, one repository layer per task at base_commit.
Images the tasks name are imported or pulled once each: into the store for
a sandbox, into Docker for isolation "docker". What is there is reused. A task that cannot be read or
prepared is reported with its reason; the others go on.

With --queue, every store the queue's workers announce is prepared by one of
its workers (a store shared by several nodes once); --store and --jobs are
theirs (docs/cluster.md).`,
    positionals: [{ name: 'TASKS', check: readableFile }],
    options: { '--store': STORE_OPTION, '--jobs': { ...JOBS_OPTION, help: 'Builds at once' }, '--isolation': ISOLATION_OPTION, '--install-network': INSTALL_NETWORK_OPTION, ...QUEUE_OPTIONS },
    exitCodes: `Exit code: 0 if every task is ready, 1 if some were rejected or failed
(or none could be read), 2 on usage errors.`,
  },
  async run(args) {
    // The command line first: a usage error before the task file is read.
    if (args.has('--queue')) {
      for (const [flag, instead] of [['--store', "each worker's --store"], ['--jobs', "each worker's --slots"], ['--install-network', 'the workers build offline']] as const) {
        if (args.has(flag)) throw new UsageError(`${flag} does not apply with --queue: the workers prepare (${instead})`);
      }
    } else refuseWithoutQueue(args, REDIS_FLAGS);
    const { tasks, rejected } = readTasks(args.positionals[0] as string);
    const isolation = args.get<TaskIsolation>('--isolation');
    if (args.has('--queue')) {
      const failed = await runQueuePrepare(args, tasks, rejected, isolation);
      return failed === 0 && rejected === 0 ? 0 : 1;
    }
    const result = await prepareWithProgress(tasks, args.get('--store')!, args.get<number>('--jobs')!, rejected, {
      ...(isolation ? { isolation } : {}),
      installNetwork: args.get<'none' | 'host'>('--install-network')!,
    });
    return result.failures.length === 0 && rejected === 0 ? 0 : 1;
  },
};

export const commands = [prepareCommand];
