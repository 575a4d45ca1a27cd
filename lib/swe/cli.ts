/**
 * `minisandbox prepare | eval | demo | tasks`: the SWE pipeline from the
 * command line. Each command is `(args) => Promise<exitCode>`; lib/cli/main.ts
 * registers them with their help texts. Output: results on stdout,
 * progress and problems on stderr.
 */
import { mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import { UsageError } from '../cli/args.js';
import { findPython, pythonSearchPath } from '../env/python.js';
import { removeTree } from '../files/fsTree.js';
import { defaultStoreRoot, openStore } from '../layers/store.js';
import { DEMO_PYTHON, createDemoTaskSet } from './demo/createDemoTaskSet.js';
import { deriveTaskFile } from './derive.js';
import { prepareTasks, type PrepareResult, type PrepareSummary } from './pipeline/prepare.js';
import type { PrepareProgress } from './pipeline/types.js';
import { formatBytes, formatMs, formatTable } from '../format.js';
import { createProgress } from './pipeline/progress.js';
import { evaluateAll, type EvalRunReport } from './pipeline/runReport.js';
import type { EvalResult } from './pipeline/evaluate.js';
import { loadPredictions, loadTasks, type Prediction, type Task } from './tasks.js';

export const PREPARE_HELP = `Usage: minisandbox prepare TASKS [--store DIR] [--jobs N]

Builds the environments of a task set (SWE-bench JSONL/JSON with recipe
fields python, install, test_cmd, repo_path or repo_url): one venv layer
per repo+version recipe, one repository layer per task at base_commit.
Layers already in the store are reused. A task that cannot be read or
prepared is reported with its reason; the others go on.

Options:
  --store DIR   Layer store (default ${defaultStoreRoot()})
  --jobs N      Builds at once (default 2)

Exit code: 0 if every task is ready, 1 if some were rejected or failed,
2 on usage errors.`;

export const EVAL_HELP = `Usage: minisandbox eval TASKS (--predictions PREDS | --gold) [OPTIONS]

Evaluates predictions as SWE-bench does, each in a fresh sandbox: apply the
patch (git apply, git apply --reject, patch --fuzz=5), reset the test files
and apply test_patch, run test_cmd, parse the log, grade. Environments are
prepared first (reused from the store when present).

Options:
  --predictions PREDS  SWE-bench predictions (JSONL, JSON list or object)
  --gold               Evaluate each task's own gold patch instead
  --store DIR          Layer store (default ${defaultStoreRoot()})
  --jobs N             Evaluations (and builds) at once (default 2)
  --timeout S          Limit for one test run, seconds (default 1800)
  --report FILE        Write the report (SWE-bench run report + per-instance
                       reports with every test's status, rewards, timings) as JSON
  --logs DIR           Write DIR/<instance_id>/{patch.diff,test_output.txt,report.json}

Exit code: 0 if every prediction was evaluated (resolved or not), 1 if some
could not be (preparation or harness errors), 2 on usage errors.`;

export const DEMO_HELP = `Usage: minisandbox demo [--jobs N] [--keep]

Creates the built-in demo task set (small Python repositories with real
bugs) in a temporary directory, prepares their environments, evaluates the
gold patches in sandboxes and prints the report and timings. Needs no
network. Exit code 0 when every gold patch resolves its task.

Options:
  --jobs N   Builds and evaluations at once (default 2)
  --keep     Keep the temporary directory (task set, store, report)`;

export const TASKS_HELP = `Usage: minisandbox tasks derive TASKS [--output FILE] [OPTIONS]

derive: finds each task's FAIL_TO_PASS and PASS_TO_PASS, as SWE-bench's
validation does: prepares the environments, runs test_cmd at base_commit
with test_patch applied, and again with the gold patch too (each run in a
fresh sandbox). FAIL_TO_PASS: tests that pass only with the gold patch;
PASS_TO_PASS: tests that pass in both runs (PASSED or XFAIL; a skipped
test is never in either). Lists the tasks already have are ignored.
Writes the task set, each record as it was with the two lists replaced,
as JSONL; a task the gold patch fixes nothing in is reported and left out.

Options:
  --output FILE   Where to write the derived task set (default stdout)
  --store DIR     Layer store (default ${defaultStoreRoot()})
  --jobs N        Builds and test runs at once (default 2)
  --timeout S     Limit for one test run, seconds (default 1800)

Exit code: 0 if every task was derived, 1 if some could not be, 2 on
usage errors.`;

function positiveInt(option: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 1) throw new UsageError(`${option}: expected a positive integer, got "${value}"`);
  return n;
}

function positiveNumber(option: string, value: string | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  const n = Number(value);
  if (!Number.isFinite(n) || n <= 0) throw new UsageError(`${option}: expected a positive number of seconds, got "${value}"`);
  return n;
}

type Values = Record<string, string | boolean | undefined>;

function parse(args: string[], options: ParseArgsConfig['options'], positionals: number): { values: Values; positionals: string[] } {
  let parsed;
  try {
    parsed = parseArgs({ args, options, allowPositionals: true, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  if (parsed.positionals.length !== positionals) {
    throw new UsageError(positionals === 0 ? `unexpected argument "${parsed.positionals[0]}"` : `expected ${positionals} argument(s): TASKS`);
  }
  return { values: parsed.values as Values, positionals: parsed.positionals };
}

const out = (text: string) => process.stdout.write(text.endsWith('\n') ? text : `${text}\n`);
const err = (text: string) => process.stderr.write(text.endsWith('\n') ? text : `${text}\n`);

/** The valid tasks; each rejected one is named on stderr. */
function readTasks(file: string): { tasks: Task[]; rejected: number } {
  const { tasks, errors } = loadTasks(file);
  reportRejected(errors);
  return { tasks, rejected: errors.length };
}

function reportRejected(errors: readonly { message: string }[]): void {
  for (const e of errors) err(`skipping ${e.message}`);
}

/** Progress of preparation on one line of stderr, failures above it. */
function prepareProgress(): { onProgress: (e: PrepareProgress) => void; end: () => void } {
  const progress = createProgress();
  return {
    onProgress: (e) => {
      if (e.status === 'failed') progress.log(`failed: ${e.label}: ${e.error?.split('\n')[0]}`);
      progress.update(e.done, e.total, `${e.status === 'start' ? 'building' : e.status} ${e.label}`);
    },
    end: () => progress.end(),
  };
}

/** "prepared 3/5 tasks in 2.1 s: ...; 1 rejected, 1 failed": the file's tasks all counted. */
function printPrepareSummary(s: PrepareSummary, rejected: number, storeDir: string): void {
  err(
    `prepared ${s.prepared}/${s.tasks + rejected} tasks in ${formatMs(s.durationMs)}: ` +
      `venvs ${s.envs.built} built, ${s.envs.reused} reused, ${s.envs.failed} failed; ` +
      `repos ${s.repos.built} built, ${s.repos.reused} reused, ${s.repos.failed} failed; ` +
      `${rejected} task(s) rejected, ${s.failed} failed` +
      (s.diskBytes !== undefined ? `; store ${storeDir} uses ${formatBytes(s.diskBytes)}` : ''),
  );
}

/** Prepares with a progress bar; prints failures one by one and the summary. */
async function prepareWithProgress(tasks: Task[], storeDir: string, jobs: number, rejected: number): Promise<PrepareResult> {
  const store = await openStore({ root: storeDir });
  const progress = prepareProgress();
  const result = await prepareTasks(tasks, { store, concurrency: jobs, onProgress: progress.onProgress });
  progress.end();
  for (const f of result.failures) err(`not prepared: ${f.message}`);
  printPrepareSummary(result.summary, rejected, storeDir);
  return result;
}

export async function prepareCommand(args: string[]): Promise<number> {
  const { values, positionals } = parse(args, { store: { type: 'string' }, jobs: { type: 'string' } }, 1);
  const { tasks, rejected } = readTasks(positionals[0]!);
  const result = await prepareWithProgress(tasks, resolve((values.store as string | undefined) ?? defaultStoreRoot()), positiveInt('--jobs', values.jobs as string | undefined, 2), rejected);
  return result.failures.length === 0 && rejected === 0 ? 0 : 1;
}

interface RunOptions {
  tasks: Task[];
  predictions: Prediction[];
  storeDir: string;
  jobs: number;
  timeoutMs: number;
  reportFile?: string;
  logsDir?: string;
  /** Tasks of the file that could not be read (for the summary). */
  rejected?: number;
}

function writeLogs(dir: string, results: EvalResult[], predictions: Prediction[]): void {
  const patches = new Map(predictions.map((p) => [p.instance_id, p.model_patch]));
  for (const r of results) {
    const d = join(dir, r.instance_id.replace(/[^\w.-]/g, '_'));
    mkdirSync(d, { recursive: true });
    writeFileSync(join(d, 'patch.diff'), patches.get(r.instance_id) ?? '');
    writeFileSync(join(d, 'test_output.txt'), r.log);
    writeFileSync(join(d, 'report.json'), `${JSON.stringify({ [r.instance_id]: r.report }, null, 2)}\n`);
  }
}

function printReport(report: EvalRunReport, results: EvalResult[]): void {
  const rows = [['instance', 'resolved', 'F2P', 'P2P', 'setup', 'tests', 'teardown', 'note']];
  for (const r of results) {
    const pct = (f: number) => `${Math.round(f * 100)}%`;
    rows.push([
      r.instance_id,
      r.reward.resolved ? 'yes' : 'no',
      pct(r.reward.failToPassFraction),
      pct(r.reward.passToPassFraction),
      formatMs(r.timings.setupMs),
      formatMs(r.timings.testsMs),
      formatMs(r.timings.teardownMs),
      r.timedOut ? 'timed out' : r.reward.resolved ? '' : r.reward.reason,
    ]);
  }
  out(formatTable(rows));
  const m = report.timing_medians;
  out(
    `\nresolved ${report.resolved_instances}/${report.total_instances} ` +
      `(submitted ${report.submitted_instances}, completed ${report.completed_instances}, ` +
      `empty patch ${report.empty_patch_instances}, errors ${report.error_instances})`,
  );
  if (m.n > 0) {
    out(
      `median per instance: setup ${formatMs(m.setupMs)}, tests ${formatMs(m.testsMs)}, teardown ${formatMs(m.teardownMs)}, ` +
        `total ${formatMs(m.totalMs)}, harness overhead ${formatMs(m.overheadMs)}; wall ${formatMs(report.totals.wall_ms)}`,
    );
  }
  for (const [id, reason] of Object.entries(report.errors)) err(`error: ${id}: ${reason}`);
}

async function runEvaluation(o: RunOptions): Promise<{ report: EvalRunReport; results: EvalResult[] }> {
  const wanted = new Set(o.predictions.map((p) => p.instance_id));
  // Only tasks with a prediction need an environment.
  const prep = await prepareWithProgress(o.tasks.filter((t) => wanted.has(t.instance_id)), o.storeDir, o.jobs, o.rejected ?? 0);
  const progress = createProgress();
  const { results, report } = await evaluateAll(o.tasks, o.predictions, {
    prepared: prep.prepared,
    prepareFailures: prep.failures,
    concurrency: o.jobs,
    timeoutMs: o.timeoutMs,
    onResult: (r, done, total) =>
      progress.update(done, total, `${r.instance_id}: ${r.reward.resolved ? 'resolved' : r.timedOut ? 'timed out' : 'not resolved'}`),
  });
  progress.end();
  if (o.reportFile) writeFileSync(o.reportFile, `${JSON.stringify(report, null, 2)}\n`);
  if (o.logsDir) writeLogs(o.logsDir, results, o.predictions);
  printReport(report, results);
  if (o.reportFile) out(`report written to ${o.reportFile}`);
  return { report, results };
}

export async function evalCommand(args: string[]): Promise<number> {
  const { values, positionals } = parse(
    args,
    {
      predictions: { type: 'string' },
      gold: { type: 'boolean' },
      store: { type: 'string' },
      jobs: { type: 'string' },
      timeout: { type: 'string' },
      report: { type: 'string' },
      logs: { type: 'string' },
    },
    1,
  );
  if (!values.gold === (values.predictions === undefined)) throw new UsageError('give exactly one of --predictions PREDS and --gold');
  const { tasks, rejected } = readTasks(positionals[0]!);
  let predictions: Prediction[];
  if (values.gold) {
    predictions = tasks.map((t) => ({ instance_id: t.instance_id, model_patch: t.patch, model_name_or_path: 'gold' }));
  } else {
    const loaded = loadPredictions(values.predictions as string);
    for (const e of loaded.errors) err(`skipping ${e.message}`);
    predictions = loaded.predictions;
  }
  const { report } = await runEvaluation({
    tasks,
    predictions,
    storeDir: resolve((values.store as string | undefined) ?? defaultStoreRoot()),
    jobs: positiveInt('--jobs', values.jobs as string | undefined, 2),
    timeoutMs: positiveNumber('--timeout', values.timeout as string | undefined, 1800) * 1000,
    ...(values.report ? { reportFile: resolve(values.report as string) } : {}),
    ...(values.logs ? { logsDir: resolve(values.logs as string) } : {}),
    rejected,
  });
  return report.error_instances === 0 ? 0 : 1;
}

export async function demoCommand(args: string[]): Promise<number> {
  const { values } = parse(args, { jobs: { type: 'string' }, keep: { type: 'boolean' } }, 0);
  const jobs = positiveInt('--jobs', values.jobs as string | undefined, 2);
  // The demo runs offline, so its tests need a base Python that already has
  // pytest; without one every test would just fail, which explains nothing.
  if (!findPython({ version: DEMO_PYTHON, modules: ['pytest'] })) {
    err(
      `demo: no Python ${DEMO_PYTHON} with pytest found (looked in ${pythonSearchPath().join(', ')}; ` +
        'an unreadable /root hides /root/.pyenv from other users: chmod o+x /root, or install pytest for a system Python)',
    );
    return 1;
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
      jobs,
      timeoutMs: 300_000,
      // Only a kept directory keeps the report: name it only then.
      ...(values.keep ? { reportFile: join(dir, 'report.json') } : {}),
    });
    return report.resolved_instances === demo.tasks.length ? 0 : 1;
  } finally {
    if (values.keep) err(`kept ${dir}`);
    else await removeTree(dir);
  }
}

export async function tasksCommand(args: string[]): Promise<number> {
  const [sub, ...rest] = args;
  if (sub !== 'derive') throw new UsageError(sub === undefined ? 'expected a subcommand: derive' : `unknown subcommand "${sub}" (expected derive)`);
  const { values, positionals } = parse(rest, { output: { type: 'string' }, store: { type: 'string' }, jobs: { type: 'string' }, timeout: { type: 'string' } }, 1);
  const storeDir = resolve((values.store as string | undefined) ?? defaultStoreRoot());
  const output = values.output === undefined ? undefined : resolve(values.output as string);
  const jobs = positiveInt('--jobs', values.jobs as string | undefined, 2);
  const timeoutMs = positiveNumber('--timeout', values.timeout as string | undefined, 1800) * 1000;
  const prepare = prepareProgress();
  const runs = createProgress();
  const derived = await deriveTaskFile(positionals[0]!, {
    store: await openStore({ root: storeDir }),
    concurrency: jobs,
    timeoutMs,
    onProgress: prepare.onProgress,
    onResult: (r, done, total) => runs.update(done, total, `${r.instance_id}: ${r.error ? 'not derived' : `${r.tests!.FAIL_TO_PASS.length} FAIL_TO_PASS, ${r.tests!.PASS_TO_PASS.length} PASS_TO_PASS`}`),
    ...(output ? { outputDir: dirname(output) } : {}),
  });
  prepare.end();
  runs.end();
  reportRejected(derived.rejected);
  printPrepareSummary(derived.prepare, derived.rejected.length, storeDir);
  const rows = [['instance', 'FAIL_TO_PASS', 'PASS_TO_PASS', 'FAIL_TO_FAIL', 'PASS_TO_FAIL']];
  for (const r of derived.results) {
    if (r.error !== undefined) err(`not derived: ${r.error}`);
    if (r.tests) rows.push([r.instance_id, ...(['FAIL_TO_PASS', 'PASS_TO_PASS', 'FAIL_TO_FAIL', 'PASS_TO_FAIL'] as const).map((k) => String(r.tests![k].length))]);
  }
  const body = derived.lines.map((l) => `${l}\n`).join('');
  if (output) writeFileSync(output, body);
  else process.stdout.write(body);
  err(formatTable(rows));
  err(`derived ${derived.lines.length}/${derived.results.length + derived.rejected.length} tasks${output ? `; written to ${output}` : ''}`);
  return derived.lines.length === derived.results.length && derived.rejected.length === 0 ? 0 : 1;
}
