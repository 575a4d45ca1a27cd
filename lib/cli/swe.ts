/**
 * What the SWE commands (prepare, eval, demo, tasks derive) share: reading
 * task and prediction files, progress on stderr, the summary and report.
 * Results go to stdout, progress and problems to stderr.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { openStore } from '../layers/index.js';
import type { PrepareProgress } from '../swe/pipeline/types.js';
import { prepareTasks, type PrepareResult, type PrepareSummary } from '../swe/pipeline/prepare.js';
import { formatBytes, formatMs, formatTable } from '../format.js';
import { createProgress } from '../swe/pipeline/progress.js';
import { evaluateAll, type EvalRunReport } from '../swe/pipeline/runReport.js';
import type { EvalResult } from '../swe/pipeline/evaluate.js';
import { loadPredictions, loadTasks, type Prediction, type Task, type TaskIsolation } from '../swe/tasks.js';
import { CommandError, oneOf, type OptionSpec } from './args.js';

/** `--isolation sandbox|docker` of prepare and eval: a whole task set's isolation. */
export const ISOLATION_OPTION: OptionSpec = {
  values: ['sandbox|docker'],
  check: oneOf('sandbox', 'docker'),
  help: `Run every task in a sandbox (of its image, else of its venv) or in
Docker (every task must name an image), over each task's own "isolation"`,
};

/** `--install-network none|host` of prepare and eval: TaskEnvs' installNetwork. */
export const INSTALL_NETWORK_OPTION: OptionSpec = {
  values: ['none|host'],
  check: oneOf('none', 'host'),
  default: 'none',
  help: `Network of the environments' install step only (building a venv: its
install commands, e.g. a pip install from a package index), never of the
evaluation, whose sandboxes have none. A venv built with host is another
than one built with none (the network is part of its key): give eval the
value prepare had`,
};

export const out = (text: string) => process.stdout.write(text.endsWith('\n') ? text : `${text}\n`);
export const err = (text: string) => process.stderr.write(text.endsWith('\n') ? text : `${text}\n`);

export function reportRejected(errors: readonly { message: string }[]): void {
  for (const e of errors) err(`skipping ${e.message}`);
}

/**
 * Records of a file, each rejected one named on stderr. A file with none
 * to work on is an error before anything is built: "resolved 0/0" would
 * read as success.
 */
function readRecords<T>(name: string, file: string, what: string, load: () => { records: T[]; errors: readonly { message: string }[] }): { records: T[]; rejected: number } {
  let loaded;
  try {
    loaded = load();
  } catch (e) {
    // The file as a whole: not JSON, not a list of records.
    throw new CommandError(`${name} ${file}: ${(e as Error).message}`, { cause: e });
  }
  reportRejected(loaded.errors);
  if (loaded.records.length === 0) {
    throw new CommandError(`${name} ${file}: no ${what} to work on${loaded.errors.length ? ` (${loaded.errors.length} rejected, each named above)` : ' (the file holds none)'}`);
  }
  return { records: loaded.records, rejected: loaded.errors.length };
}

/** The valid tasks of a task file (TASKS), and how many were rejected. */
export function readTasks(file: string, testLists?: 'optional'): { tasks: Task[]; rejected: number } {
  const { records, rejected } = readRecords('TASKS', file, 'valid task', () => {
    const { tasks, errors } = loadTasks(file, undefined, testLists ? { testLists } : {});
    return { records: tasks, errors };
  });
  return { tasks: records, rejected };
}

/** The valid predictions of a predictions file, and how many were rejected. */
export function readPredictions(file: string): { predictions: Prediction[]; rejected: number } {
  const { records, rejected } = readRecords('--predictions', file, 'valid prediction', () => {
    const { predictions, errors } = loadPredictions(file);
    return { records: predictions, errors };
  });
  return { predictions: records, rejected };
}

/** Progress of preparation on one line of stderr, failures above it. */
export function prepareProgress(): { onProgress: (e: PrepareProgress) => void; end: () => void } {
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
export function printPrepareSummary(s: PrepareSummary, rejected: number, storeDir: string): void {
  err(
    `prepared ${s.prepared}/${s.tasks + rejected} tasks in ${formatMs(s.durationMs)}: ` +
      `venvs ${s.envs.built} built, ${s.envs.reused} reused, ${s.envs.failed} failed; ` +
      `repos ${s.repos.built} built, ${s.repos.reused} reused, ${s.repos.failed} failed; ` +
      (s.images.fetched + s.images.reused + s.images.failed > 0
        ? `images ${s.images.fetched} imported or pulled, ${s.images.reused} already there, ${s.images.failed} failed; `
        : '') +
      `${rejected} task(s) rejected, ${s.failed} failed` +
      (s.diskBytes !== undefined ? `; store ${storeDir} uses ${formatBytes(s.diskBytes)}` : ''),
  );
}

/** Prepares with a progress bar; prints failures one by one and the summary. */
export async function prepareWithProgress(
  tasks: Task[],
  storeDir: string,
  jobs: number,
  rejected: number,
  opts: { isolation?: TaskIsolation; installNetwork?: 'none' | 'host' } = {},
): Promise<PrepareResult> {
  const store = await openStore({ root: storeDir });
  const progress = prepareProgress();
  const result = await prepareTasks(tasks, {
    store,
    concurrency: jobs,
    onProgress: progress.onProgress,
    ...(opts.isolation ? { isolation: opts.isolation } : {}),
    ...(opts.installNetwork ? { installNetwork: opts.installNetwork } : {}),
  });
  progress.end();
  for (const f of result.failures) err(`not prepared: ${f.message}`);
  printPrepareSummary(result.summary, rejected, storeDir);
  return result;
}

export interface RunOptions {
  tasks: Task[];
  predictions: Prediction[];
  storeDir: string;
  jobs: number;
  timeoutMs: number;
  reportFile?: string;
  logsDir?: string;
  /** Every task's isolation, over what each task says. */
  isolation?: TaskIsolation;
  /** Network of the environments' install step (default none). */
  installNetwork?: 'none' | 'host';
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
  const rows = [['instance', 'isolation', 'resolved', 'F2P', 'P2P', 'setup', 'tests', 'teardown', 'note']];
  for (const r of results) {
    const pct = (f: number) => `${Math.round(f * 100)}%`;
    rows.push([
      r.instance_id,
      r.isolation ?? '',
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

export async function runEvaluation(o: RunOptions): Promise<{ report: EvalRunReport; results: EvalResult[] }> {
  const wanted = new Set(o.predictions.map((p) => p.instance_id));
  // Only tasks with a prediction need an environment.
  const prep = await prepareWithProgress(o.tasks.filter((t) => wanted.has(t.instance_id)), o.storeDir, o.jobs, o.rejected ?? 0, {
    ...(o.isolation ? { isolation: o.isolation } : {}),
    ...(o.installNetwork ? { installNetwork: o.installNetwork } : {}),
  });
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
  writeRunOutputs(report, results, o);
  return { report, results };
}

/** The report file, the logs and the table of a finished run: the same for a local run and a queue run (lib/cluster). */
export function writeRunOutputs(report: EvalRunReport, results: EvalResult[], o: Pick<RunOptions, 'reportFile' | 'logsDir' | 'predictions'>): void {
  if (o.reportFile) writeFileSync(o.reportFile, `${JSON.stringify(report, null, 2)}\n`);
  if (o.logsDir) writeLogs(o.logsDir, results, o.predictions);
  printReport(report, results);
  if (o.reportFile) out(`report written to ${o.reportFile}`);
}
