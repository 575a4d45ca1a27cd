/**
 * One evaluation: a fresh sandbox of the prepared task, the model patch,
 * the test patch, the tests under a time limit, the grade. Built to be
 * called thousands of times from a training loop: it never throws for a
 * problem of the patch, the tests or the harness (those come back in the
 * result), the sandbox is always closed, and nothing an evaluation writes
 * outlives it (every write lands in the sandbox's private overlay layer).
 */
import { gradeInstance, isPatchEmpty, type InstanceReport, type Reward } from '../grading.js';
import { parseTestLog } from '../logParsers.js';
import type { Task } from '../tasks.js';
import type { TestStatus } from '../testStatus.js';
import {
  APPLY_OK,
  applyScript,
  parseTestTime,
  PATCH_FILE,
  TEST_PATCH_FILE,
  testPatchScript,
  testScript,
} from './evalScript.js';
import { EVAL_CAPABILITIES } from './localProvider.js';
import type { PreparedTask, SandboxRequest, TaskSandbox } from './types.js';

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

export interface EvalResult {
  instance_id: string;
  /** SWE-bench's per-instance report. */
  report: InstanceReport;
  reward: Reward;
  patchApplied: boolean;
  /** Which command applied the patch, e.g. "git apply --verbose". */
  applyMethod?: string;
  timedOut: boolean;
  /** Statuses parsed from the test log, by test id. */
  statuses: Record<string, TestStatus>;
  /** Apply output, test-patch output and the test run, as one log. */
  log: string;
  /** The harness could not evaluate (sandbox failed, test patch did not apply...). */
  error?: string;
  timings: EvalTimings;
}

function errorText(err: unknown): string {
  return err instanceof Error ? `${err.name}: ${err.message}` : String(err);
}

export async function evaluate(task: Task, patch: string | null | undefined, opts: EvaluateOptions): Promise<EvalResult> {
  const t0 = performance.now();
  const timings: EvalTimings = { setupMs: 0, testsMs: 0, teardownMs: 0, totalMs: 0 };
  const result: Omit<EvalResult, 'report' | 'reward'> = {
    instance_id: task.instance_id,
    patchApplied: false,
    timedOut: false,
    statuses: {},
    log: '',
    timings,
  };
  const finish = (extra: { statuses?: Map<string, TestStatus>; harnessError?: string } = {}): EvalResult => {
    const graded = gradeInstance(task, {
      modelPatch: patch,
      patchApplied: result.patchApplied,
      ...(extra.statuses ? { statuses: extra.statuses } : {}),
      timedOut: result.timedOut,
      ...(extra.harnessError !== undefined ? { harnessError: extra.harnessError } : {}),
    });
    timings.totalMs = performance.now() - t0;
    return { ...result, report: graded.report, reward: graded.reward };
  };

  // SWE-bench does not run empty patches: nothing to apply, nothing fixed.
  if (isPatchEmpty(patch)) return finish();
  if (opts.prepared.instance_id !== task.instance_id) {
    result.error = `prepared environment is for "${opts.prepared.instance_id}", not "${task.instance_id}"`;
    return finish({ harnessError: result.error });
  }

  let sandbox: TaskSandbox | undefined;
  let outcome: { statuses?: Map<string, TestStatus>; harnessError?: string } = {};
  try {
    sandbox = await opts.prepared.createSandbox(opts.sandbox);
    outcome = await runSteps(sandbox, task, patch!, opts, result);
  } catch (err) {
    result.error = `evaluation of "${task.instance_id}" failed: ${errorText(err)}`;
    outcome = { harnessError: result.error };
    if (timings.setupMs === 0) timings.setupMs = performance.now() - t0;
  } finally {
    const closeStart = performance.now();
    await sandbox?.close().catch((err: unknown) => {
      result.error ??= `closing the sandbox of "${task.instance_id}" failed: ${errorText(err)}`;
    });
    timings.teardownMs = performance.now() - closeStart;
  }
  return finish(outcome);
}

async function runSteps(
  sb: TaskSandbox,
  task: Task,
  patch: string,
  opts: EvaluateOptions,
  result: Omit<EvalResult, 'report' | 'reward'>,
): Promise<{ statuses?: Map<string, TestStatus>; harnessError?: string }> {
  const t0 = performance.now();
  const signal = opts.signal ? { signal: opts.signal } : {};
  const setupTimeout = opts.setupTimeoutMs ?? 120_000;
  const run = (script: string, timeout: number) =>
    sb.exec(['/bin/bash', '-c', script], { timeout, capabilities: EVAL_CAPABILITIES, ...signal });

  for (const [file, text] of [[PATCH_FILE, patch], [TEST_PATCH_FILE, task.test_patch]] as const) {
    const w = await sb.exec(['/bin/sh', '-c', 'cat > "$1"', 'sh', file], { input: text, timeout: setupTimeout, ...signal });
    if (w.exitCode !== 0) throw new Error(`writing ${file}: ${w.stderr.trim() || `exit ${w.exitCode}`}`);
  }
  const apply = await run(applyScript(), setupTimeout);
  result.log += apply.stdout;
  const applied = apply.exitCode === 0 && apply.stdout.includes(APPLY_OK);
  if (!applied) {
    result.timings.setupMs = performance.now() - t0;
    return {}; // graded as "model patch did not apply"
  }
  result.patchApplied = true;
  result.applyMethod = /\(([^)]*)\)\s*$/.exec(apply.stdout.trim())?.[1];

  const testPatch = await run(testPatchScript(task), setupTimeout);
  result.log += testPatch.stdout;
  result.timings.setupMs = performance.now() - t0;
  if (testPatch.exitCode !== 0) {
    result.error = `test_patch of "${task.instance_id}" did not apply after the model patch`;
    return { harnessError: result.error };
  }

  const timeout = opts.timeoutMs ?? 30 * 60_000;
  const tests = await run(testScript(task), timeout);
  result.timings.testsMs = tests.durationMs;
  result.log += tests.stdout;
  const commandMs = parseTestTime(tests.stdout);
  if (commandMs !== undefined) result.timings.testCommandMs = commandMs;
  if (tests.timedOut) {
    result.timedOut = true;
    result.log += `\n>>>>> Tests Timed Out after ${timeout / 1000} s\n`;
  }
  const statuses = parseTestLog(tests.stdout, { parser: task.log_parser ?? 'auto' });
  result.statuses = Object.fromEntries(statuses);
  return { statuses };
}
