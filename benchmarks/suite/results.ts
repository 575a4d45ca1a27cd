/**
 * The suite's results: every raw sample, the machine, and the figures
 * derived from them (medians with their spread, ratios to Docker, the
 * issue's bars). Types and pure functions only: the writers (report.ts,
 * charts.ts) and the tests read the same figures.
 */
import { percentile } from '../lib/stats.js';
import type { MethodName } from './methods.js';

export interface Machine {
  cpus: number;
  cpuModel: string;
  memoryBytes: number;
  kernel: string;
  /** 1, 5, 15 minute load averages at the start and at the end. */
  loadStart: number[];
  loadEnd: number[];
  node: string;
  docker?: string;
  minisandbox: string;
  user: string;
  hostname: string;
}

export interface SetupSample {
  method: MethodName;
  kind: 'warm' | 'cold';
  task: string;
  ms: number;
}

export interface DiskFigures {
  /** Bytes on disk for the whole set, per method, with what was counted. */
  set: Partial<Record<MethodName, { bytes: number; what: string }>>;
  /** Docker without sharing: the sum of every instance image's full size (the per-task-image construction). */
  dockerPerTaskImages?: number;
  /** Docker's env and instance layers alone, without the base image. */
  dockerWithoutBase?: number;
  /** Bytes each extra running instance adds (its private layer, extracted copy or container layer). */
  perInstance: Partial<Record<MethodName, number>>;
}

export interface ScalingSample {
  method: MethodName;
  n: number;
  repeat: number;
  totalMs: number;
  /** Each environment's own start time (start to first command done), of the ones that started. */
  perEnvMs: number[];
  failures: number;
  /** First failure, for the report. */
  error?: string;
  /** Host memory in use with all N running, minus before (MemTotal - MemAvailable). */
  memoryBytes: number;
}

export interface RolloutSample {
  method: MethodName;
  task: string;
  repeat: number;
  setupMs: number;
  steps: number;
  failedSteps: number;
  /** The steps that exited non-zero, with their exit codes (first few). */
  failed?: string[];
  /** Wall time of the steps as the caller sees them, and the commands' own time measured by bash inside. */
  stepsWallMs: number;
  stepsInnerMs: number;
  testWallMs: number;
  testInnerMs: number;
  testExitCode: number | null;
  teardownMs: number;
}

export interface LatencySamples {
  method: MethodName;
  /** exec: a one-shot command (sandbox exec, docker exec); step: session.run (docker: docker exec). */
  kind: 'exec' | 'step';
  ms: number[];
}

export interface Bar {
  name: string;
  target: string;
  value: string;
  ok: boolean | undefined;
  /** Why no verdict (a contender skipped). */
  note?: string;
}

export interface SuiteResults {
  version: 1;
  startedAt: string;
  durationMs: number;
  options: Record<string, unknown>;
  machine: Machine;
  workload: { name: string; tasks: number; envs: number; repos: number; dir: string; dockerSkipped?: string };
  methods: MethodName[];
  /** Methods (or parts) not run, with the reason. */
  skipped: Record<string, string>;
  setup: SetupSample[];
  disk: DiskFigures;
  scaling: ScalingSample[];
  rollout: RolloutSample[];
  latency: LatencySamples[];
  bars: Bar[];
}

export interface Spread {
  n: number;
  median: number;
  p5: number;
  p95: number;
  min: number;
  max: number;
}

export function spread(samples: readonly number[]): Spread {
  const s = [...samples].sort((a, b) => a - b);
  return { n: s.length, median: percentile(s, 50), p5: percentile(s, 5), p95: percentile(s, 95), min: s[0] ?? NaN, max: s[s.length - 1] ?? NaN };
}

export function setupSpread(r: Pick<SuiteResults, 'setup'>, method: MethodName, kind: 'warm' | 'cold'): Spread {
  return spread(r.setup.filter((s) => s.method === method && s.kind === kind).map((s) => s.ms));
}

/**
 * Per N: all-ready time, its share per environment (all-ready / N: flat
 * when scaling is linear, the paper's sense), each environment's own start
 * latency (grows with N on 2 cores: they share the CPUs), failures, memory.
 */
export function scalingRows(r: Pick<SuiteResults, 'scaling'>, method: MethodName): Array<{ n: number; perEnv: Spread; latency: Spread; total: Spread; failures: number; memoryBytes: number }> {
  const ns = [...new Set(r.scaling.filter((s) => s.method === method).map((s) => s.n))].sort((a, b) => a - b);
  return ns.map((n) => {
    const runs = r.scaling.filter((s) => s.method === method && s.n === n);
    return {
      n,
      perEnv: spread(runs.map((s) => s.totalMs / s.n)),
      latency: spread(runs.flatMap((s) => s.perEnvMs)),
      total: spread(runs.map((s) => s.totalMs)),
      failures: runs.reduce((a, s) => a + s.failures, 0),
      memoryBytes: spread(runs.map((s) => s.memoryBytes)).median,
    };
  });
}

/** Sandbox overhead of one rollout step: wall minus the command's own time, per step. */
export function stepOverheads(r: Pick<SuiteResults, 'rollout'>, method: MethodName): number[] {
  return r.rollout.filter((s) => s.method === method && s.steps > 0).map((s) => (s.stepsWallMs - s.stepsInnerMs) / s.steps);
}

/** The per-instance evaluation split into its parts (medians over instances and repeats). */
export function evalParts(r: Pick<SuiteResults, 'rollout'>, method: MethodName): Record<'setup' | 'commands' | 'step overhead' | 'tests' | 'test overhead' | 'teardown', number> | undefined {
  const s = r.rollout.filter((x) => x.method === method);
  if (s.length === 0) return undefined;
  const m = (f: (x: RolloutSample) => number) => spread(s.map(f)).median;
  return {
    setup: m((x) => x.setupMs),
    commands: m((x) => x.stepsInnerMs),
    'step overhead': m((x) => x.stepsWallMs - x.stepsInnerMs),
    tests: m((x) => x.testInnerMs),
    'test overhead': m((x) => x.testWallMs - x.testInnerMs),
    teardown: m((x) => x.teardownMs),
  };
}

const pct = (x: number) => `${(x * 100).toFixed(x < 0.1 ? 2 : 1)}%`;

/** The bars, judged from the samples. */
export function judgeBars(r: Omit<SuiteResults, 'bars'>): Bar[] {
  const bars: Bar[] = [];
  const has = (m: MethodName) => r.methods.includes(m);
  const noDocker = r.skipped.docker ? `docker skipped: ${r.skipped.docker}` : 'docker not run';
  // 1. warm setup
  if (has('layers') && has('docker') && r.setup.some((s) => s.method === 'docker')) {
    const ratio = setupSpread(r, 'layers', 'warm').median / setupSpread(r, 'docker', 'warm').median;
    bars.push({ name: 'warm setup, layers / docker', target: '<= 2%', value: pct(ratio), ok: ratio <= 0.02 });
  } else bars.push({ name: 'warm setup, layers / docker', target: '<= 2%', value: 'n/a', ok: undefined, note: noDocker });
  // 2. disk for the set
  const dDisk = r.disk.set.docker?.bytes;
  const lDisk = r.disk.set.layers?.bytes;
  if (dDisk && lDisk !== undefined) {
    const ratio = lDisk / dDisk;
    bars.push({ name: 'disk for the set, layers / docker', target: '<= 15%', value: pct(ratio), ok: ratio <= 0.15 });
  } else bars.push({ name: 'disk for the set, layers / docker', target: '<= 15%', value: 'n/a', ok: undefined, note: noDocker });
  // 3. scaling
  if (has('layers')) {
    const rows = scalingRows(r, 'layers');
    const first = rows[0];
    const last = rows[rows.length - 1];
    if (first && last) {
      const growth = last.perEnv.median / first.perEnv.median;
      const failures = rows.reduce((a, x) => a + x.failures, 0);
      bars.push({ name: `layers: N=${last.n} at once without failure`, target: '0 failures', value: `${failures} failures`, ok: failures === 0 });
      bars.push({ name: `layers: per-environment setup (all ready / N), N=${last.n} / N=${first.n}`, target: '< 2x', value: `${growth.toFixed(2)}x`, ok: growth < 2 && last.n >= 256 ? true : growth < 2 ? undefined : false, ...(last.n < 256 ? { note: `measured up to N=${last.n} only; the bar is N=256` } : {}) });
    }
  }
  // 4. rollout overhead per step
  if (has('layers') && has('docker') && r.rollout.some((s) => s.method === 'docker')) {
    const l = spread(stepOverheads(r, 'layers')).median;
    const d = spread(stepOverheads(r, 'docker')).median;
    const ratio = l / d;
    bars.push({ name: 'overhead per rollout step, layers / docker', target: '<= 1/20 (5%)', value: pct(ratio), ok: ratio <= 0.05 });
  } else bars.push({ name: 'overhead per rollout step, layers / docker', target: '<= 1/20 (5%)', value: 'n/a', ok: undefined, note: noDocker });
  return bars;
}
