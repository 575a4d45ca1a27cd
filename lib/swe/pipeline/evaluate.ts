/**
 * One evaluation: a fresh sandbox of the prepared task, the model patch,
 * the test patch, the tests under a time limit, the grade. Built to be
 * called thousands of times from a training loop: it never throws for a
 * problem of the patch, the tests or the harness (those come back in the
 * result), the sandbox is always closed, and nothing an evaluation writes
 * outlives it (every write lands in the sandbox's private overlay layer).
 */
import { SweError } from '../errors.js';
import { gradeInstance, isPatchEmpty, type InstanceReport, type Reward } from '../grading.js';
import { parseTestLog } from '../logParsers.js';
import type { Task } from '../tasks.js';
import type { TestStatus, TestStatusMap } from '../testStatus.js';
import {
  APPLY_OK,
  applyScript,
  parseTestTime,
  PATCH_FILE,
  TEST_PATCH_FILE,
  testPatchScript,
  testScript,
} from './evalScript.js';
import type { IsolationKind, PreparedTask, SandboxRequest, TaskSandbox } from './types.js';

export interface EvaluateOptions {
  prepared: PreparedTask;
  /** Limit for the test command (default 30 minutes, SWE-bench's default). */
  timeoutMs?: number;
  /** Limit for applying the patches (default 2 minutes). */
  setupTimeoutMs?: number;
  sandbox?: SandboxRequest;
  signal?: AbortSignal;
}

export interface EvalTimings {
  /** Sandbox start, writing and applying the patches. */
  setupMs: number;
  /** The test step as the harness sees it (exec included). */
  testsMs: number;
  /** The test command alone, measured inside the sandbox (undefined if it did not run). */
  testCommandMs?: number;
  /** Closing the sandbox. */
  teardownMs: number;
  totalMs: number;
}

/** One run of a task's tests in a fresh sandbox, before grading. */
export interface TestRun {
  instance_id: string;
  /** What the tests ran in (absent when nothing ran: an empty patch, no FAIL_TO_PASS). */
  isolation?: IsolationKind;
  /** The patch applied (always true for a run without one). */
  patchApplied: boolean;
  /** Which command applied the patch, e.g. "git apply --verbose". */
  applyMethod?: string;
  timedOut: boolean;
  /** Statuses parsed from the test log; undefined when the tests did not run. */
  statuses?: TestStatusMap;
  /** Apply output, test-patch output and the test run, as one log. */
  log: string;
  /** The harness could not run the tests (sandbox failed, test patch did not apply...). */
  error?: string;
  timings: EvalTimings;
}

export interface EvalResult extends Omit<TestRun, 'statuses'> {
  /** SWE-bench's per-instance report. */
  report: InstanceReport;
  reward: Reward;
  /** Statuses parsed from the test log, by test id. */
  statuses: Record<string, TestStatus>;
}

function errorText(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}

/**
 * Grades `patch` on `task`. An empty patch is not run (SWE-bench does the
 * same); a task without FAIL_TO_PASS tests is not run either, since any
 * patch would resolve it.
 */
export async function evaluate(task: Task, patch: string | null | undefined, opts: EvaluateOptions): Promise<EvalResult> {
  const t0 = performance.now();
  let run: TestRun;
  if (isPatchEmpty(patch)) {
    run = { instance_id: task.instance_id, isolation: opts.prepared.isolation, patchApplied: false, timedOut: false, log: '', timings: { setupMs: 0, testsMs: 0, teardownMs: 0, totalMs: 0 } };
  } else if (task.FAIL_TO_PASS.length === 0) {
    run = {
      instance_id: task.instance_id,
      isolation: opts.prepared.isolation,
      patchApplied: false,
      timedOut: false,
      log: '',
      error: `task "${task.instance_id}" lists no FAIL_TO_PASS tests: any patch would resolve it (derive them with 'minisandbox tasks derive')`,
      timings: { setupMs: 0, testsMs: 0, teardownMs: 0, totalMs: 0 },
    };
  } else {
    run = await runTaskTests(task, patch!, opts);
  }
  const graded = gradeInstance(task, {
    modelPatch: patch,
    patchApplied: run.patchApplied,
    ...(run.statuses ? { statuses: run.statuses } : {}),
    timedOut: run.timedOut,
    ...(run.error !== undefined ? { harnessError: run.error } : {}),
  });
  const { statuses, ...rest } = run;
  run.timings.totalMs = performance.now() - t0;
  return { ...rest, statuses: Object.fromEntries(statuses ?? []), report: graded.report, reward: graded.reward };
}

/**
 * Runs `task`'s tests in a fresh sandbox of its prepared environment: the
 * base commit, `patch` applied (none when null), the test patch, the test
 * command under its time limit. Never throws for problems of the patch,
 * the tests or the harness; the sandbox is always closed.
 */
export async function runTaskTests(task: Task, patch: string | null, opts: EvaluateOptions): Promise<TestRun> {
  const t0 = performance.now();
  const run: TestRun = {
    instance_id: task.instance_id,
    isolation: opts.prepared.isolation,
    patchApplied: patch === null,
    timedOut: false,
    log: '',
    timings: { setupMs: 0, testsMs: 0, teardownMs: 0, totalMs: 0 },
  };
  if (opts.prepared.instance_id !== task.instance_id) {
    run.error = `prepared environment is for "${opts.prepared.instance_id}", not "${task.instance_id}"`;
    return run;
  }
  let sandbox: TaskSandbox | undefined;
  try {
    sandbox = await opts.prepared.createSandbox(opts.sandbox);
    // The scripts work where the prepared task put the repository.
    await runSteps(sandbox, { ...task, repo_dir: opts.prepared.repoDir }, patch, opts, run, t0);
  } catch (err) {
    run.error = `evaluation of "${task.instance_id}" (${opts.prepared.isolation}) failed: ${errorText(err)}`;
    if (run.timings.setupMs === 0) run.timings.setupMs = performance.now() - t0;
  } finally {
    const closeStart = performance.now();
    await sandbox?.close().catch((err: unknown) => {
      run.error ??= `closing the sandbox of "${task.instance_id}" failed: ${errorText(err)}`;
    });
    run.timings.teardownMs = performance.now() - closeStart;
    run.timings.totalMs = performance.now() - t0;
  }
  return run;
}

/** The steps in a started sandbox; setupMs counts from `t0`, before the sandbox started, as the docs say. */
async function runSteps(sb: TaskSandbox, task: Task, patch: string | null, opts: EvaluateOptions, run: TestRun, t0: number): Promise<void> {
  const signal = opts.signal ? { signal: opts.signal } : {};
  const setupTimeout = opts.setupTimeoutMs ?? 120_000;
  const bash = (script: string, timeout: number) => sb.exec(['/bin/bash', '-c', script], { timeout, ...signal });

  const files: Array<[string, string]> = [...(patch !== null ? [[PATCH_FILE, patch] as [string, string]] : []), [TEST_PATCH_FILE, task.test_patch]];
  for (const [file, text] of files) {
    const w = await sb.exec(['/bin/sh', '-c', 'cat > "$1"', 'sh', file], { input: text, timeout: setupTimeout, ...signal });
    if (w.exitCode !== 0) throw new SweError(`writing ${file}: ${w.stderr.trim() || `exit ${w.exitCode}`}`);
  }
  if (patch !== null) {
    const apply = await bash(applyScript(task), setupTimeout);
    run.log += apply.stdout;
    if (apply.exitCode !== 0 || !apply.stdout.includes(APPLY_OK)) {
      run.timings.setupMs = performance.now() - t0;
      return; // graded as "model patch did not apply"
    }
    run.patchApplied = true;
    const method = /\(([^)]*)\)\s*$/.exec(apply.stdout.trim())?.[1];
    if (method !== undefined) run.applyMethod = method;
  }

  const testPatch = await bash(testPatchScript(task), setupTimeout);
  run.log += testPatch.stdout;
  run.timings.setupMs = performance.now() - t0;
  if (testPatch.exitCode !== 0) {
    run.error = `test_patch of "${task.instance_id}" did not apply${patch !== null ? ' after the model patch' : ''}`;
    return;
  }

  const timeout = opts.timeoutMs ?? 30 * 60_000;
  const tests = await bash(testScript(task), timeout);
  run.timings.testsMs = tests.durationMs;
  run.log += tests.stdout;
  const commandMs = parseTestTime(tests.stdout);
  if (commandMs !== undefined) run.timings.testCommandMs = commandMs;
  if (tests.timedOut) {
    run.timedOut = true;
    run.log += `\n>>>>> Tests Timed Out after ${timeout / 1000} s\n`;
  }
  run.statuses = parseTestLog(tests.stdout, { parser: task.log_parser ?? 'auto' });
}
