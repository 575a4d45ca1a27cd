/**
 * A whole evaluation run: every prediction evaluated (at most `concurrency`
 * at once), then one report in SWE-bench's shape (the run report of
 * `make_run_report`, plus each instance's report.json value) with MiniSandbox's
 * additions: rewards, preparation failures, timings and their medians.
 */
import { aggregateRunReport, type InstanceOutcome, type InstanceReport, type Reward, type RunReport } from '../grading.js';
import type { Prediction } from '../predictions.js';
import type { Task } from '../tasks.js';
import { evaluate, type EvalResult, type EvalTimings } from './evaluate.js';
import { createLimiter } from '../../files/limit.js';
import type { PrepareFailure } from './prepare.js';
import type { IsolationKind, PreparedTask, SandboxRequest } from './types.js';

export interface EvaluateAllOptions {
  prepared: ReadonlyMap<string, PreparedTask>;
  /** Why tasks could not be prepared: their predictions become errors. */
  prepareFailures?: readonly PrepareFailure[];
  concurrency?: number;
  timeoutMs?: number;
  sandbox?: SandboxRequest;
  onResult?: (result: EvalResult, done: number, total: number) => void;
  signal?: AbortSignal;
}

export interface TimingSummary {
  n: number;
  setupMs: number;
  testsMs: number;
  teardownMs: number;
  totalMs: number;
  /** total - the test command's own time: what the harness costs. */
  overheadMs: number;
}

/** SWE-bench's run report plus per-instance detail. */
export interface EvalRunReport extends RunReport {
  /** SWE-bench's report.json values, by instance id. */
  instances: Record<string, InstanceReport>;
  rewards: Record<string, Reward>;
  /** Instances whose evaluation hit the test time limit. */
  timed_out_ids: string[];
  /** Why an instance is an error (preparation or harness failure). */
  errors: Record<string, string>;
  timings: Record<string, EvalTimings>;
  /** What each evaluated instance ran in: 'sandbox-venv', 'sandbox-image' or 'docker'. */
  isolation: Record<string, IsolationKind>;
  /** Medians over evaluated instances. */
  timing_medians: TimingSummary;
  /** The same medians for each isolation used (a Docker baseline beside the sandboxes). */
  timing_medians_by_isolation: Partial<Record<IsolationKind, TimingSummary>>;
  totals: { resolved: number; evaluated: number; mean_reward: number; wall_ms: number };
}

export interface EvaluateAllResult {
  results: EvalResult[];
  report: EvalRunReport;
}

function median(values: number[]): number {
  if (values.length === 0) return 0;
  const s = [...values].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid]! : (s[mid - 1]! + s[mid]!) / 2;
}

export function overheadOf(t: EvalTimings): number {
  return t.totalMs - (t.testCommandMs ?? 0);
}

export function summarizeTimings(timings: EvalTimings[]): TimingSummary {
  const pick = (f: (t: EvalTimings) => number) => median(timings.map(f));
  return {
    n: timings.length,
    setupMs: pick((t) => t.setupMs),
    testsMs: pick((t) => t.testsMs),
    teardownMs: pick((t) => t.teardownMs),
    totalMs: pick((t) => t.totalMs),
    overheadMs: pick(overheadOf),
  };
}

export async function evaluateAll(tasks: readonly Task[], predictions: readonly Prediction[], opts: EvaluateAllOptions): Promise<EvaluateAllResult> {
  const started = performance.now();
  const byId = new Map(tasks.map((t) => [t.instance_id, t]));
  const failed = new Map((opts.prepareFailures ?? []).map((f) => [f.instance_id, f.message]));
  const limit = createLimiter(opts.concurrency ?? 2);
  const outcomes: InstanceOutcome[] = [];
  const errors: Record<string, string> = {};
  const results: EvalResult[] = [];
  let done = 0;

  const runnable = predictions.filter((p) => {
    const reason = !byId.has(p.instance_id)
      ? `prediction "${p.instance_id}": no such task in the task set`
      : failed.get(p.instance_id) ?? (opts.prepared.has(p.instance_id) ? undefined : `task "${p.instance_id}" was not prepared`);
    if (reason === undefined) return true;
    if (byId.has(p.instance_id)) {
      errors[p.instance_id] = reason;
      outcomes.push({ instance_id: p.instance_id, model_patch: p.model_patch, error: reason });
    }
    return false;
  });

  await Promise.all(
    runnable.map((p) =>
      limit(async () => {
        const result = await evaluate(byId.get(p.instance_id)!, p.model_patch, {
          prepared: opts.prepared.get(p.instance_id)!,
          ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}),
          ...(opts.sandbox ? { sandbox: opts.sandbox } : {}),
          ...(opts.signal ? { signal: opts.signal } : {}),
        });
        results.push(result);
        if (result.error !== undefined) errors[p.instance_id] = result.error;
        outcomes.push({
          instance_id: p.instance_id,
          model_patch: p.model_patch,
          report: result.report,
          ...(result.error !== undefined ? { error: result.error } : {}),
        });
        opts.onResult?.(result, ++done, runnable.length);
      }),
    ),
  );

  const report = buildRunReport(tasks, results, outcomes, errors, performance.now() - started);
  const order = new Map(tasks.map((t, i) => [t.instance_id, i]));
  results.sort((a, b) => order.get(a.instance_id)! - order.get(b.instance_id)!);
  return { results, report };
}

/**
 * The run report of finished evaluations: `results` (each a graded
 * evaluation), `outcomes` (one per prediction: graded or an error, as
 * aggregateRunReport takes them) and `errors` (why an instance is an error).
 * The one report writer: evaluateAll and lib/cluster's queue runs (whose
 * results come back from other nodes) both call it.
 */
export function buildRunReport(
  tasks: readonly Task[],
  results: readonly EvalResult[],
  outcomes: readonly InstanceOutcome[],
  errors: Readonly<Record<string, string>>,
  wallMs: number,
): EvalRunReport {
  const ran = results.filter((r) => r.timings.testCommandMs !== undefined || r.timedOut);
  const runReport = aggregateRunReport(
    tasks.map((t) => t.instance_id),
    [...outcomes],
  );
  const sortedRecord = <T>(entries: Array<[string, T]>) => Object.fromEntries(entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
  return {
    ...runReport,
    instances: sortedRecord(results.map((r) => [r.instance_id, r.report])),
    rewards: sortedRecord(results.map((r) => [r.instance_id, r.reward])),
    timed_out_ids: results.filter((r) => r.timedOut).map((r) => r.instance_id).sort(),
    errors: sortedRecord(Object.entries(errors)),
    timings: sortedRecord(results.map((r) => [r.instance_id, r.timings])),
    isolation: sortedRecord(results.flatMap((r) => (r.isolation ? [[r.instance_id, r.isolation] as [string, IsolationKind]] : []))),
    timing_medians: summarizeTimings(ran.map((r) => r.timings)),
    timing_medians_by_isolation: Object.fromEntries(
      [...new Set(ran.flatMap((r) => (r.isolation ? [r.isolation] : [])))].sort().map((k) => [k, summarizeTimings(ran.filter((r) => r.isolation === k).map((r) => r.timings))]),
    ),
    totals: {
      resolved: runReport.resolved_instances,
      evaluated: results.length,
      mean_reward: results.length ? results.reduce((s, r) => s + r.reward.reward, 0) / results.length : 0,
      wall_ms: wallMs,
    },
  };
}
