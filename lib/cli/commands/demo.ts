/** `minisandbox demo`: the main job, on the built-in task set. */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { findPython, pythonSearchPath } from '../../env/python.js';
import { removeTree } from '../../files/fsTree.js';
import { DEMO_PYTHON, createDemoTaskSet } from '../../swe/demo/createDemoTaskSet.js';
import { CommandError, type Command } from '../args.js';
import { JOBS_OPTION } from '../options.js';
import { err, runEvaluation } from '../swe.js';

const demoCommand: Command = {
  spec: {
    name: 'demo',
    about: `Creates the built-in demo task set (small Python repositories with real
bugs) in a temporary directory, prepares their environments, evaluates the
gold patches in sandboxes and prints the report and timings. Needs no
network.`,
    options: {
      '--jobs': { ...JOBS_OPTION, help: 'Builds and evaluations at once' },
      '--keep': { help: 'Keep the temporary directory (task set, store, report)' },
    },
    exitCodes: 'Exit code: 0 when every gold patch resolves its task, 1 otherwise, 2 on usage errors.',
  },
  async run(args) {
    const keep = args.has('--keep');
    // The demo runs offline, so its tests need a base Python that already has
    // pytest; without one every test would just fail, which explains nothing.
    if (!findPython({ version: DEMO_PYTHON, modules: ['pytest'] })) {
      throw new CommandError(
        `no Python ${DEMO_PYTHON} with pytest found (looked in ${pythonSearchPath().join(', ')}; ` +
          'an unreadable /root hides /root/.pyenv from other users: chmod o+x /root, or install pytest for a system Python)',
      );
    }
    const dir = mkdtempSync(join(tmpdir(), 'minisandbox-demo-'));
    try {
      const demo = createDemoTaskSet(join(dir, 'taskset'));
      err(`demo task set: ${demo.tasks.length} tasks in ${demo.dir}`);
      const { report } = await runEvaluation({
        tasks: demo.tasks,
        predictions: demo.tasks.map((t) => ({ instance_id: t.instance_id, model_patch: t.patch, model_name_or_path: 'gold' })),
        // A private store: the demo leaves nothing behind unless --keep.
        storeDir: join(dir, 'store'),
        jobs: args.get<number>('--jobs')!,
        timeoutMs: 300_000,
        // Only a kept directory keeps the report: name it only then.
        ...(keep ? { reportFile: join(dir, 'report.json') } : {}),
      });
      return report.resolved_instances === demo.tasks.length ? 0 : 1;
    } finally {
      if (keep) err(`kept ${dir}`);
      else await removeTree(dir);
    }
  },
};

export const commands = [demoCommand];
