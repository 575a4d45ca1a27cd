import { describe, expect, it } from 'vitest';
import { aggregateRunReport, gradeInstance, gradeTests, toReportFile, type InstanceOutcome } from '../../lib/swe/grading.js';
import type { TestStatus } from '../../lib/swe/logParsers.js';

const task = {
  instance_id: 'org__proj-1',
  FAIL_TO_PASS: ['t.py::test_fix_a', 't.py::test_fix_b[x y]'],
  PASS_TO_PASS: ['t.py::test_keep_a', 't.py::test_keep_b'],
};
const statuses = (entries: Record<string, TestStatus>): Map<string, TestStatus> => new Map(Object.entries(entries));
const allPass = statuses({
  't.py::test_fix_a': 'PASSED',
  't.py::test_fix_b[x y]': 'XFAIL',
  't.py::test_keep_a': 'PASSED',
  't.py::test_keep_b': 'SKIPPED',
});

describe('gradeInstance', () => {
  it('resolves when every FAIL_TO_PASS passes and PASS_TO_PASS is kept (SKIPPED counts as kept)', () => {
    const result = gradeInstance(task, { modelPatch: 'diff', patchApplied: true, statuses: allPass });
    expect(toReportFile(result)).toEqual({
      'org__proj-1': {
        patch_is_None: false,
        patch_exists: true,
        patch_successfully_applied: true,
        resolved: true,
        tests_status: {
          FAIL_TO_PASS: { success: task.FAIL_TO_PASS, failure: [] },
          PASS_TO_PASS: { success: task.PASS_TO_PASS, failure: [] },
          FAIL_TO_FAIL: { success: [], failure: [] },
          PASS_TO_FAIL: { success: [], failure: [] },
        },
        test_statuses: Object.fromEntries(allPass),
      },
    });
    expect(result.reward).toEqual({ reward: 1, resolved: true, failToPassFraction: 1, passToPassFraction: 1, reason: 'all tests pass' });
  });

  it('counts missing, skipped FAIL_TO_PASS and broken PASS_TO_PASS tests as failures', () => {
    const result = gradeInstance(task, {
      modelPatch: 'diff',
      patchApplied: true,
      statuses: statuses({ 't.py::test_fix_a': 'SKIPPED', 't.py::test_keep_a': 'ERROR', 't.py::test_keep_b': 'PASSED' }),
    });
    expect(result.report.tests_status).toEqual({
      FAIL_TO_PASS: { success: [], failure: task.FAIL_TO_PASS },
      PASS_TO_PASS: { success: ['t.py::test_keep_b'], failure: ['t.py::test_keep_a'] },
      FAIL_TO_FAIL: { success: [], failure: [] },
      PASS_TO_FAIL: { success: [], failure: [] },
    });
    expect(result.reward).toEqual({
      reward: 0,
      resolved: false,
      failToPassFraction: 0,
      passToPassFraction: 0.5,
      reason: '2 of 2 FAIL_TO_PASS tests failed; 1 of 2 PASS_TO_PASS tests failed',
    });
  });

  it('distinguishes None, empty, unapplied, timed-out and harness-error outcomes', () => {
    const none = gradeInstance(task, { modelPatch: null, patchApplied: false });
    expect(none.report).toEqual({ patch_is_None: true, patch_exists: false, patch_successfully_applied: false, resolved: false });
    expect(none.reward.reason).toBe('no patch (None)');
    expect(gradeInstance(task, { modelPatch: ' \n', patchApplied: true, statuses: allPass }).report.resolved).toBe(false);
    const unapplied = gradeInstance(task, { modelPatch: 'diff', patchApplied: false });
    expect(unapplied.report).toMatchObject({ patch_exists: true, patch_successfully_applied: false, resolved: false });
    expect(unapplied.reward.reason).toBe('model patch did not apply');
    const timedOut = gradeInstance(task, { modelPatch: 'diff', patchApplied: true, statuses: allPass, timedOut: true });
    expect(timedOut.report.resolved).toBe(false);
    expect(timedOut.report.tests_status?.FAIL_TO_PASS.success).toEqual(task.FAIL_TO_PASS);
    expect(timedOut.reward).toMatchObject({ reward: 0, failToPassFraction: 1, reason: 'tests timed out' });
    const harness = gradeInstance(task, { modelPatch: 'diff', patchApplied: true, harnessError: 'test_patch did not apply' });
    expect(harness.reward.reason).toBe('evaluation error: test_patch did not apply');
    expect(harness.report.tests_status).toBeUndefined();
    // A harness that failed before trying the patch says nothing of the patch.
    const early = gradeInstance(task, { modelPatch: 'diff', patchApplied: false, harnessError: 'sandbox did not start' });
    expect(early.report.patch_successfully_applied).toBe(false);
    expect(early.reward.reason).toBe('evaluation error: sandbox did not start');
  });

  it('matches unittest ids across Python versions', () => {
    const djangoTask = { instance_id: 'd', FAIL_TO_PASS: ['test_a (app.tests.T)'], PASS_TO_PASS: ['app.tests.T.test_b'] };
    const tests = gradeTests(djangoTask, statuses({ 'app.tests.T.test_a': 'PASSED', 'test_b (app.tests.T.test_b)': 'PASSED' }));
    expect(tests.FAIL_TO_PASS.success).toEqual(['test_a (app.tests.T)']);
    expect(tests.PASS_TO_PASS.success).toEqual(['app.tests.T.test_b']);
  });
});

describe('aggregateRunReport', () => {
  const report = (resolved: boolean) => ({ patch_is_None: false, patch_exists: true, patch_successfully_applied: true, resolved });

  it('counts like SWE-bench: incomplete, empty, error, resolved, unresolved', () => {
    const outcomes: InstanceOutcome[] = [
      { instance_id: 'r2', model_patch: 'd', report: report(true) },
      { instance_id: 'r1', model_patch: 'd', report: report(true) },
      { instance_id: 'u', model_patch: 'd', report: report(false) },
      { instance_id: 'e', model_patch: '', report: report(false) },
      { instance_id: 'n', model_patch: null },
      { instance_id: 'x', model_patch: 'd', error: 'sandbox crashed' },
    ];
    expect(aggregateRunReport(['r1', 'r2', 'u', 'e', 'n', 'x', 'missing'], outcomes)).toEqual({
      total_instances: 7,
      submitted_instances: 6,
      completed_instances: 3,
      resolved_instances: 2,
      unresolved_instances: 1,
      empty_patch_instances: 2,
      error_instances: 1,
      completed_ids: ['r1', 'r2', 'u'],
      incomplete_ids: ['missing'],
      empty_patch_ids: ['e', 'n'],
      submitted_ids: ['e', 'n', 'r1', 'r2', 'u', 'x'],
      resolved_ids: ['r1', 'r2'],
      unresolved_ids: ['u'],
      error_ids: ['x'],
      schema_version: 2,
    });
  });

  it('rejects two outcomes for one instance', () => {
    const o: InstanceOutcome = { instance_id: 'a', model_patch: 'd', report: report(true) };
    expect(() => aggregateRunReport(['a'], [o, o])).toThrow('aggregateRunReport: instance "a" has more than one outcome');
  });
});
