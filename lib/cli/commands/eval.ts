/** `minisandbox eval`: predictions on a task set, each in a fresh sandbox. */
import { absolutePath, outputFile, readableFile, UsageError, type Command } from '../args.js';
import { JOBS_OPTION, STORE_OPTION, TEST_TIMEOUT_OPTION } from '../options.js';
import { INSTALL_NETWORK_OPTION, ISOLATION_OPTION, readPredictions, readTasks, runEvaluation } from '../swe.js';
import type { TaskIsolation } from '../../swe/tasks.js';
import { QUEUE_OPTIONS, runQueueEvaluation } from '../cluster.js';
import { REDIS_FLAGS, refuseWithoutQueue } from '../redis.js';

const evalCommand: Command = {
  spec: {
    name: 'eval',
    usage: ['minisandbox eval TASKS (--predictions PREDS | --gold) [OPTIONS]', 'minisandbox eval TASKS (--predictions PREDS | --gold) --queue redis://HOST:PORT/NAME [OPTIONS]'],
    about: `Evaluates predictions as SWE-bench does, each in a fresh sandbox: apply the
patch (git apply, git apply --reject, patch --fuzz=5), reset the test files
and apply test_patch, run test_cmd, parse the log, grade. Environments are
prepared first (reused from the store when present). A task that names an
image runs in a sandbox of that image, or in a Docker container of it
(isolation "docker"); the report says which, per instance.

With --queue, the instances are evaluated by the queue's workers ('minisandbox
worker', one per node; --store and --jobs are theirs) and the report is the
same. Running the same command again after an interruption resumes the run:
instances already graded are not run again (docs/cluster.md).`,
    positionals: [{ name: 'TASKS', check: readableFile }],
    options: {
      '--predictions': { values: ['PREDS'], check: readableFile, help: 'SWE-bench predictions (JSONL, JSON list or object)' },
      '--gold': { help: "Evaluate each task's own gold patch instead" },
      '--store': STORE_OPTION,
      '--jobs': { ...JOBS_OPTION, help: 'Evaluations (and builds) at once' },
      '--timeout': TEST_TIMEOUT_OPTION,
      '--isolation': ISOLATION_OPTION,
      '--install-network': INSTALL_NETWORK_OPTION,
      '--report': {
        values: ['FILE'],
        check: outputFile,
        help: `Write the report (SWE-bench run report + per-instance reports
with every test's status, rewards, timings) as JSON`,
      },
      '--logs': { values: ['DIR'], check: absolutePath, help: 'Write DIR/<instance_id>/{patch.diff,test_output.txt,report.json}' },
      ...QUEUE_OPTIONS,
      '--run-id': {
        values: ['ID'],
        section: 'Queue (Redis)',
        help: `The queue run to add to or resume (default: a digest of the tasks,
predictions, --timeout and --isolation, so the same command resumes)`,
      },
    },
    exitCodes: `Exit code: 0 if every task and prediction was read and evaluated (resolved
or not), 1 if some could not be (rejected records, preparation or harness
errors), 2 on usage errors.`,
  },
  async run(args) {
    const gold = args.has('--gold');
    const file = args.get('--predictions');
    if (gold === (file !== undefined)) throw new UsageError('give exactly one of --predictions PREDS and --gold');
    const { tasks, rejected } = readTasks(args.positionals[0] as string);
    const predictions = file !== undefined ? readPredictions(file) : { predictions: tasks.map((t) => ({ instance_id: t.instance_id, model_patch: t.patch, model_name_or_path: 'gold' })), rejected: 0 };
    const report = args.get('--report');
    const logs = args.get('--logs');
    const isolation = args.get<TaskIsolation>('--isolation');
    if (args.has('--queue')) {
      for (const [flag, instead] of [['--store', "each worker's --store"], ['--jobs', "each worker's --slots"], ['--install-network', 'the workers build offline']] as const) {
        if (args.has(flag)) throw new UsageError(`${flag} does not apply with --queue: the workers evaluate (${instead})`);
      }
      const run = await runQueueEvaluation(args, {
        tasks,
        predictions: predictions.predictions,
        timeoutMs: args.get<number>('--timeout')! * 1000,
        ...(report ? { reportFile: report } : {}),
        ...(logs ? { logsDir: logs } : {}),
        ...(isolation ? { isolation } : {}),
      });
      return run.error_instances === 0 && rejected === 0 && predictions.rejected === 0 ? 0 : 1;
    }
    refuseWithoutQueue(args, [...REDIS_FLAGS, '--run-id']);
    const { report: run } = await runEvaluation({
      tasks,
      predictions: predictions.predictions,
      storeDir: args.get('--store')!,
      jobs: args.get<number>('--jobs')!,
      timeoutMs: args.get<number>('--timeout')! * 1000,
      ...(report ? { reportFile: report } : {}),
      ...(logs ? { logsDir: logs } : {}),
      ...(isolation ? { isolation } : {}),
      installNetwork: args.get<'none' | 'host'>('--install-network')!,
      rejected,
    });
    return run.error_instances === 0 && rejected === 0 && predictions.rejected === 0 ? 0 : 1;
  },
};

export const commands = [evalCommand];
