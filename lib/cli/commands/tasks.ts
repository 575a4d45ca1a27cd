/** `minisandbox tasks derive`: FAIL_TO_PASS and PASS_TO_PASS from runs before and after the gold patch. */
import { writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { openStore } from '../../layers/index.js';
import { deriveTaskFile } from '../../swe/derive.js';
import { formatTable } from '../../format.js';
import { createProgress } from '../../swe/pipeline/progress.js';
import { outputFile, readableFile, type Command } from '../args.js';
import { JOBS_OPTION, STORE_OPTION, TEST_TIMEOUT_OPTION } from '../options.js';
import { err, prepareProgress, printPrepareSummary, readTasks } from '../swe.js';

const LISTS = ['FAIL_TO_PASS', 'PASS_TO_PASS', 'FAIL_TO_FAIL', 'PASS_TO_FAIL'] as const;

const derive: Command = {
  spec: {
    name: 'tasks derive',
    about: `Finds each task's FAIL_TO_PASS and PASS_TO_PASS, as SWE-bench's
validation does: prepares the environments, runs test_cmd at base_commit
with test_patch applied, and again with the gold patch too (each run in a
fresh sandbox). FAIL_TO_PASS: tests that pass only with the gold patch;
PASS_TO_PASS: tests that pass in both runs (PASSED or XFAIL; a skipped
test is never in either). Lists the tasks already have are ignored.
Writes the task set, each record as it was with the two lists replaced,
as JSONL; a task the gold patch fixes nothing in is reported and left out.`,
    positionals: [{ name: 'TASKS', check: readableFile }],
    options: {
      '--output': { values: ['FILE'], check: outputFile, help: 'Where to write the derived task set (default stdout)' },
      '--store': STORE_OPTION,
      '--jobs': JOBS_OPTION,
      '--timeout': TEST_TIMEOUT_OPTION,
    },
    exitCodes: 'Exit code: 0 if every task was derived, 1 if some could not be (or none could be read), 2 on usage errors.',
  },
  async run(args) {
    const file = args.positionals[0] as string;
    const storeDir = args.get('--store')!;
    const output = args.get('--output');
    // deriveTaskFile reads the file again for its records; reading it here
    // first names the rejected records and fails a file without a task
    // before the store is made.
    readTasks(file, 'optional');
    const prepare = prepareProgress();
    const runs = createProgress();
    const derived = await deriveTaskFile(file, {
      store: await openStore({ root: storeDir }),
      concurrency: args.get<number>('--jobs')!,
      timeoutMs: args.get<number>('--timeout')! * 1000,
      onProgress: prepare.onProgress,
      onResult: (r, done, total) => runs.update(done, total, `${r.instance_id}: ${r.error ? 'not derived' : `${r.tests!.FAIL_TO_PASS.length} FAIL_TO_PASS, ${r.tests!.PASS_TO_PASS.length} PASS_TO_PASS`}`),
      ...(output ? { outputDir: dirname(output) } : {}),
    });
    prepare.end();
    runs.end();
    printPrepareSummary(derived.prepare, derived.rejected.length, storeDir);
    const rows = [['instance', ...LISTS]];
    for (const r of derived.results) {
      if (r.error !== undefined) err(`not derived: ${r.error}`);
      if (r.tests) rows.push([r.instance_id, ...LISTS.map((k) => String(r.tests![k].length))]);
    }
    const body = derived.lines.map((l) => `${l}\n`).join('');
    if (output) writeFileSync(output, body);
    else process.stdout.write(body);
    err(formatTable(rows));
    err(`derived ${derived.lines.length}/${derived.results.length + derived.rejected.length} tasks${output ? `; written to ${output}` : ''}`);
    return derived.lines.length === derived.results.length && derived.rejected.length === 0 ? 0 : 1;
  },
};

export const commands = [derive];
