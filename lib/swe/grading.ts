/**
 * Grading one evaluated instance, and summarising a run, in SWE-bench's
 * report shapes (so existing SWE-bench tooling and leaderboards can read
 * them), plus a scalar reward for training loops.
 *
 * Semantics follow SWE-bench's harness (grading.py):
 * - FAIL_TO_PASS succeeds only on PASSED or XFAIL; SKIPPED, FAILED, ERROR
 *   and absence from the log are failures (a skipped test proves nothing).
 * - PASS_TO_PASS is maintained on PASSED, XFAIL or SKIPPED (skips are often
 *   environment-dependent and were not the patch's doing); FAILED, ERROR and
 *   absence are failures.
 * - Resolved means every FAIL_TO_PASS and every PASS_TO_PASS test succeeded.
 * Deviation: an empty or whitespace-only model patch has patch_exists=false
 * (SWE-bench only checks for None); it cannot fix anything.
 */
import { SweError } from './errors.js';
import { canonicalTestId } from './logParsers.js';
import type { TestStatus, TestStatusMap } from './testStatus.js';
import type { Task } from './tasks.js';

export interface TestGroupResult {
  success: string[];
  failure: string[];
}

/**
 * SWE-bench's `tests_status`: the task's lists split by outcome.
 * FAIL_TO_FAIL and PASS_TO_FAIL are always there and empty, as SWE-bench's
 * harness writes them (it fills them only when told to, from lists task
 * sets do not carry), so code written for its report.json reads ours.
 */
export interface TestsStatus {
  FAIL_TO_PASS: TestGroupResult;
  PASS_TO_PASS: TestGroupResult;
  FAIL_TO_FAIL: TestGroupResult;
  PASS_TO_FAIL: TestGroupResult;
}

/** Per-instance report, SWE-bench's `report.json` value for one instance. */
export interface InstanceReport {
  patch_is_None: boolean;
  patch_exists: boolean;
  patch_successfully_applied: boolean;
  resolved: boolean;
  /** Present whenever tests were run and their log parsed. */
  tests_status?: TestsStatus;
  /**
   * Every test the log reports, with its status, in log order (not only
   * the task's lists): what changed elsewhere in the suite. MiniSandbox's
   * addition; present with tests_status.
   */
  test_statuses?: Record<string, TestStatus>;
}

/** SWE-bench's report.json: `{ [instance_id]: InstanceReport }`. */
export type InstanceReportFile = Record<string, InstanceReport>;

export interface Reward {
  reward: 0 | 1;
  resolved: boolean;
  /** Share of FAIL_TO_PASS tests that passed (0 when tests did not run). */
  failToPassFraction: number;
  /** Share of PASS_TO_PASS tests kept passing (1 when there are none, 0 when tests did not run). */
  passToPassFraction: number;
  /** Why the instance is (not) resolved, for humans reading run logs. */
  reason: string;
}

export interface GradeInput {
  /** The model's diff; null means no patch at all (SWE-bench's patch_is_None). */
  modelPatch: string | null | undefined;
  /** Did `git apply` of the model patch succeed? */
  patchApplied: boolean;
  /** Statuses parsed from the test log; undefined when tests never ran. */
  statuses?: TestStatusMap;
  /** The test command hit its time limit. */
  timedOut?: boolean;
  /** The harness failed around the tests (e.g. test_patch did not apply). */
  harnessError?: string;
}

export interface GradeResult {
  instance_id: string;
  report: InstanceReport;
  reward: Reward;
}

export type GradedTask = Pick<Task, 'instance_id' | 'FAIL_TO_PASS' | 'PASS_TO_PASS'>;

/**
 * Looks statuses up by exact id first, then by canonical id, so that a
 * task listing `test_a (pkg.T)` matches a log from Python 3.11+ that says
 * `test_a (pkg.T.test_a)` (both canonicalise to `pkg.T.test_a`).
 */
export function makeStatusLookup(statuses: TestStatusMap): (id: string) => TestStatus | undefined {
  const canonical = new Map<string, TestStatus>();
  for (const [id, status] of statuses) canonical.set(canonicalTestId(id), status);
  return (id) => statuses.get(id) ?? canonical.get(canonicalTestId(id));
}

/** Splits the task's FAIL_TO_PASS / PASS_TO_PASS lists by outcome. */
export function gradeTests(task: GradedTask, statuses: TestStatusMap): TestsStatus {
  const lookup = makeStatusLookup(statuses);
  const group = (ids: string[], isSuccess: (s: TestStatus | undefined) => boolean): TestGroupResult => {
    const result: TestGroupResult = { success: [], failure: [] };
    for (const id of ids) (isSuccess(lookup(id)) ? result.success : result.failure).push(id);
    return result;
  };
  return {
    FAIL_TO_PASS: group(task.FAIL_TO_PASS, isPass),
    PASS_TO_PASS: group(task.PASS_TO_PASS, (s) => isPass(s) || s === 'SKIPPED'),
    FAIL_TO_FAIL: { success: [], failure: [] },
    PASS_TO_FAIL: { success: [], failure: [] },
  };
}

/**
 * SWE-bench's "passed" (test_passed): PASSED or XFAIL. A skipped or
 * missing test proves nothing, so it never counts as a pass.
 */
export function isPass(status: TestStatus | undefined): boolean {
  return status === 'PASSED' || status === 'XFAIL';
}

function fraction(group: TestGroupResult): number {
  const total = group.success.length + group.failure.length;
  return total === 0 ? 1 : group.success.length / total;
}

export function isPatchEmpty(patch: string | null | undefined): boolean {
  return patch === null || patch === undefined || patch.trim() === '';
}

export function gradeInstance(task: GradedTask, input: GradeInput): GradeResult {
  const report: InstanceReport = {
    patch_is_None: input.modelPatch === null || input.modelPatch === undefined,
    patch_exists: !isPatchEmpty(input.modelPatch),
    patch_successfully_applied: false,
    resolved: false,
  };
  const unresolved = (reason: string, f2p = 0, p2p = 0): GradeResult => ({
    instance_id: task.instance_id,
    report,
    reward: { reward: 0, resolved: false, failToPassFraction: f2p, passToPassFraction: p2p, reason },
  });

  if (!report.patch_exists) return unresolved(report.patch_is_None ? 'no patch (None)' : 'empty patch');
  // The harness failing before the patch was tried says nothing of the patch.
  if (!input.patchApplied) return unresolved(input.harnessError !== undefined ? `evaluation error: ${input.harnessError}` : 'model patch did not apply');
  report.patch_successfully_applied = true;
  if (input.harnessError !== undefined) return unresolved(`evaluation error: ${input.harnessError}`);
  if (input.statuses === undefined) return unresolved('tests did not run');

  const tests = gradeTests(task, input.statuses);
  report.tests_status = tests;
  report.test_statuses = Object.fromEntries(input.statuses);
  const f2p = fraction(tests.FAIL_TO_PASS);
  const p2p = fraction(tests.PASS_TO_PASS);
  // Tests that finished before the limit are still reported, but a run cut
  // short is never resolved: the unfinished tests are unknown.
  if (input.timedOut) return unresolved('tests timed out', f2p, p2p);
  const failures = [
    ...describeFailures('FAIL_TO_PASS', tests.FAIL_TO_PASS),
    ...describeFailures('PASS_TO_PASS', tests.PASS_TO_PASS),
  ];
  if (failures.length > 0) return unresolved(failures.join('; '), f2p, p2p);
  report.resolved = true;
  return {
    instance_id: task.instance_id,
    report,
    reward: { reward: 1, resolved: true, failToPassFraction: f2p, passToPassFraction: p2p, reason: 'all tests pass' },
  };
}

function describeFailures(name: string, group: TestGroupResult): string[] {
  if (group.failure.length === 0) return [];
  const total = group.success.length + group.failure.length;
  return [`${group.failure.length} of ${total} ${name} tests failed`];
}

/** SWE-bench's report.json content for one graded instance. */
export function toReportFile(result: GradeResult): InstanceReportFile {
  return { [result.instance_id]: result.report };
}

/** What the runner knows about one instance after a run. */
export interface InstanceOutcome {
  instance_id: string;
  /** The submitted patch (from the prediction). */
  model_patch: string | null;
  /** Present when evaluation completed (even if unresolved). */
  report?: InstanceReport;
  /** Set when evaluation could not complete; such instances count as errors. */
  error?: string;
}

/** Final run summary, SWE-bench's `make_run_report` shape (schema_version 2). */
export interface RunReport {
  total_instances: number;
  submitted_instances: number;
  completed_instances: number;
  resolved_instances: number;
  unresolved_instances: number;
  empty_patch_instances: number;
  error_instances: number;
  completed_ids: string[];
  incomplete_ids: string[];
  empty_patch_ids: string[];
  submitted_ids: string[];
  resolved_ids: string[];
  unresolved_ids: string[];
  error_ids: string[];
  schema_version: 2;
}

/**
 * Totals over a run. `taskIds` is the whole task set; instances without an
 * outcome are "incomplete" (nothing was submitted for them), empty patches
 * are counted apart (not run), outcomes with a report are "completed"
 * (resolved or not) and the rest are errors. Ids are sorted for stable diffs.
 */
export function aggregateRunReport(taskIds: readonly string[], outcomes: readonly InstanceOutcome[]): RunReport {
  const byId = new Map<string, InstanceOutcome>();
  for (const outcome of outcomes) {
    if (byId.has(outcome.instance_id)) {
      throw new SweError(`aggregateRunReport: instance "${outcome.instance_id}" has more than one outcome`);
    }
    byId.set(outcome.instance_id, outcome);
  }
  const ids = {
    completed: [] as string[],
    incomplete: [] as string[],
    empty: [] as string[],
    resolved: [] as string[],
    unresolved: [] as string[],
    error: [] as string[],
  };
  for (const id of new Set(taskIds)) {
    const outcome = byId.get(id);
    if (outcome === undefined) ids.incomplete.push(id);
    else if (isPatchEmpty(outcome.model_patch)) ids.empty.push(id);
    else if (outcome.report === undefined || outcome.error !== undefined) ids.error.push(id);
    else {
      ids.completed.push(id);
      (outcome.report.resolved ? ids.resolved : ids.unresolved).push(id);
    }
  }
  const sorted = (list: string[]): string[] => [...list].sort();
  return {
    total_instances: new Set(taskIds).size,
    submitted_instances: byId.size,
    completed_instances: ids.completed.length,
    resolved_instances: ids.resolved.length,
    unresolved_instances: ids.unresolved.length,
    empty_patch_instances: ids.empty.length,
    error_instances: ids.error.length,
    completed_ids: sorted(ids.completed),
    incomplete_ids: sorted(ids.incomplete),
    empty_patch_ids: sorted(ids.empty),
    submitted_ids: sorted([...byId.keys()]),
    resolved_ids: sorted(ids.resolved),
    unresolved_ids: sorted(ids.unresolved),
    error_ids: sorted(ids.error),
    schema_version: 2,
  };
}
