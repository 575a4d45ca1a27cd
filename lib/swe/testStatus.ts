/**
 * Per-test outcome vocabulary, identical to SWE-bench's `TestStatus` enum so
 * that status maps and reports can be compared with SWE-bench's own output.
 *
 * Runner-specific outcomes are folded into these five by the parsers:
 * pytest's non-strict XPASS becomes PASSED (pytest itself does not fail the
 * session for it), unittest's "unexpected success" becomes FAILED (unittest
 * does fail the run for it).
 */
export const TEST_STATUSES = ['PASSED', 'FAILED', 'SKIPPED', 'ERROR', 'XFAIL'] as const;

export type TestStatus = (typeof TEST_STATUSES)[number];

/** Test id (pytest node id, or canonical unittest id) to its outcome. */
export type TestStatusMap = Map<string, TestStatus>;

export function isTestStatus(value: unknown): value is TestStatus {
  return typeof value === 'string' && (TEST_STATUSES as readonly string[]).includes(value);
}

/**
 * How bad an outcome is. A test can be reported more than once in one log
 * (pytest prints a PASSED call phase and then an ERROR teardown for the same
 * node id, and `-v` lines are repeated by the `-rA` summary); the worst
 * report wins so a broken teardown is never hidden by an earlier PASSED.
 */
const SEVERITY: Record<TestStatus, number> = {
  PASSED: 0,
  XFAIL: 0,
  SKIPPED: 1,
  FAILED: 2,
  ERROR: 2,
};

/** Records `status` for `id` unless an equally or more severe one is already known. */
export function recordStatus(map: TestStatusMap, id: string, status: TestStatus): void {
  const previous = map.get(id);
  if (previous === undefined || SEVERITY[status] >= SEVERITY[previous]) {
    map.set(id, status);
  }
}
