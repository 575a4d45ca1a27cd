/**
 * Deriving a task's FAIL_TO_PASS and PASS_TO_PASS, as SWE-bench's
 * validation does when a task set is built: run the tests at base_commit
 * with the test patch ("before"), and again with the gold patch too
 * ("after"), then sort every test by how its outcome moved.
 */
import { dirname, isAbsolute, relative, resolve } from 'node:path';
import { isPass, makeStatusLookup } from './grading.js';
import { createLimiter } from '../files/limit.js';
import { prepareTasks, type PrepareOptions, type PrepareSummary } from './pipeline/prepare.js';
import { runTaskTests, type TestRun } from './pipeline/evaluate.js';
import type { SandboxRequest } from './pipeline/types.js';
import { guessFormat, readTextFile, splitRecords } from './records.js';
import { parseTasks, type Task, type TaskLoadError } from './tasks.js';
import type { TestStatus, TestStatusMap } from './testStatus.js';

/** Every test of a task by how its outcome moved from before to after the gold patch. */
export interface TestTransitions {
  FAIL_TO_PASS: string[];
  PASS_TO_PASS: string[];
  FAIL_TO_FAIL: string[];
  PASS_TO_FAIL: string[];
}

/**
 * SWE-bench's rules: a test passes on PASSED or XFAIL; failed, errored,
 * skipped and absent are not passes (a skipped test proves nothing, so one
 * skipped after the fix is never FAIL_TO_PASS or PASS_TO_PASS). Tests are
 * taken in the after-run's log order, then those only the before-run
 * reports (absent after: not passing).
 */
export function classifyTests(before: TestStatusMap, after: TestStatusMap): TestTransitions {
  const was = makeStatusLookup(before);
  const is = makeStatusLookup(after);
  const out: TestTransitions = { FAIL_TO_PASS: [], PASS_TO_PASS: [], FAIL_TO_FAIL: [], PASS_TO_FAIL: [] };
  const seen = new Set<string>();
  for (const id of [...after.keys(), ...before.keys()]) {
    if (seen.has(id) || (!after.has(id) && is(id) !== undefined)) continue; // a before-only id may be an after id under another spelling
    seen.add(id);
    const key = `${isPass(was(id)) ? 'PASS' : 'FAIL'}_TO_${isPass(is(id)) ? 'PASS' : 'FAIL'}` as keyof TestTransitions;
    out[key].push(id);
  }
  return out;
}

export interface DeriveOptions extends PrepareOptions {
  /** Limit for one test run (default 30 minutes, SWE-bench's default). */
  timeoutMs?: number;
  sandbox?: SandboxRequest;
  /** After each task's two runs. */
  onResult?: (result: DerivedTask, done: number, total: number) => void;
}

export interface DerivedTask {
  instance_id: string;
  /** The task with FAIL_TO_PASS and PASS_TO_PASS replaced by the derived lists; absent on error. */
  task?: Task;
  /** All four lists; absent when the runs could not say. */
  tests?: TestTransitions;
  /** Statuses of the runs, by test id. */
  before?: Record<string, TestStatus>;
  after?: Record<string, TestStatus>;
  /** Why the lists could not be derived. */
  error?: string;
}

export interface DeriveResult {
  results: DerivedTask[];
  prepare: PrepareSummary;
}

/** Why a run cannot be used, or undefined when it can. */
function unusable(run: TestRun, which: string): string | undefined {
  if (run.error !== undefined) return `${which}: ${run.error}`;
  if (!run.patchApplied) return `${which}: the gold patch did not apply`;
  if (run.timedOut) return `${which}: the tests timed out`;
  if (!run.statuses || run.statuses.size === 0) return `${which}: the test log reports no test (check test_cmd and log_parser)`;
  return undefined;
}

/**
 * Derives FAIL_TO_PASS and PASS_TO_PASS for every task (their own lists, if
 * any, are ignored): prepares the environments, runs each task's tests
 * before and after its gold patch in fresh sandboxes, and classifies. A
 * task fails alone, with its reason: it could not be prepared, a run could
 * not be used, or the gold patch makes no failing test pass.
 */
export async function deriveTestLists(tasks: readonly Task[], opts: DeriveOptions): Promise<DeriveResult> {
  const prep = await prepareTasks(tasks, opts);
  const failed = new Map(prep.failures.map((f) => [f.instance_id, f.message]));
  const limit = createLimiter(opts.concurrency ?? 2);
  let done = 0;
  const run = { ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}), ...(opts.sandbox ? { sandbox: opts.sandbox } : {}), ...(opts.signal ? { signal: opts.signal } : {}) };
  const results = await Promise.all(
    tasks.map(async (task): Promise<DerivedTask> => {
      const prepared = prep.prepared.get(task.instance_id);
      let result: DerivedTask;
      if (!prepared) {
        result = { instance_id: task.instance_id, error: failed.get(task.instance_id) ?? `task "${task.instance_id}" was not prepared` };
      } else {
        const [before, after] = await Promise.all([
          limit(() => runTaskTests(task, null, { prepared, ...run })),
          limit(() => runTaskTests(task, task.patch, { prepared, ...run })),
        ]);
        result = judge(task, before, after);
      }
      opts.onResult?.(result, ++done, tasks.length);
      return result;
    }),
  );
  return { results, prepare: prep.summary };
}

function judge(task: Task, before: TestRun, after: TestRun): DerivedTask {
  const result: DerivedTask = {
    instance_id: task.instance_id,
    before: Object.fromEntries(before.statuses ?? []),
    after: Object.fromEntries(after.statuses ?? []),
  };
  const problem = unusable(before, 'before the gold patch') ?? unusable(after, 'with the gold patch');
  if (problem !== undefined) return { ...result, error: `task "${task.instance_id}": ${problem}` };
  const tests = classifyTests(before.statuses!, after.statuses!);
  result.tests = tests;
  if (tests.FAIL_TO_PASS.length === 0) return { ...result, error: `task "${task.instance_id}": the gold patch makes no failing test pass` };
  result.task = { ...task, FAIL_TO_PASS: tests.FAIL_TO_PASS, PASS_TO_PASS: tests.PASS_TO_PASS };
  return result;
}

export interface DeriveFileResult extends DeriveResult {
  /** Records the task file holds that could not be read as tasks. */
  rejected: TaskLoadError[];
  /**
   * The derived tasks as JSONL lines: each the task file's own record (every
   * field kept, even those MiniSandbox does not read) with the two lists
   * replaced, and a relative repo_path made relative to `outputDir`.
   */
  lines: string[];
}

/** deriveTestLists on a task file, giving the records of the new one. */
export async function deriveTaskFile(file: string, opts: DeriveOptions & { outputDir?: string }): Promise<DeriveFileResult> {
  const text = readTextFile(file, 'task');
  const format = guessFormat(file, text);
  const baseDir = dirname(resolve(file));
  const { tasks, errors } = parseTasks(text, format, { baseDir, testLists: 'optional' });
  const records = new Map<string, Record<string, unknown>>();
  for (const r of splitRecords(text, format, 'tasks')) {
    const value = r.value as Record<string, unknown> | undefined;
    if (value && typeof value === 'object' && typeof value.instance_id === 'string' && !records.has(value.instance_id)) records.set(value.instance_id, value);
  }
  const derived = await deriveTestLists(tasks, opts);
  const lines = derived.results.flatMap((r) => {
    if (!r.task) return [];
    const record: Record<string, unknown> = { ...records.get(r.instance_id)!, FAIL_TO_PASS: r.task.FAIL_TO_PASS, PASS_TO_PASS: r.task.PASS_TO_PASS };
    if (typeof record.repo_path === 'string' && !isAbsolute(record.repo_path)) {
      const repo = resolve(baseDir, record.repo_path);
      record.repo_path = opts.outputDir ? relative(resolve(opts.outputDir), repo) || '.' : repo;
    }
    return [JSON.stringify(record)];
  });
  return { ...derived, rejected: errors, lines };
}
