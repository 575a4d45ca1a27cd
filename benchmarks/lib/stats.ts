/**
 * Small statistics helpers shared by the benchmarks (their numbers are
 * shown with lib/format.ts, as the CLI's are). Latencies are in
 * milliseconds throughout.
 */

export interface Summary {
  n: number;
  median: number;
  p95: number;
  mean: number;
  min: number;
  max: number;
}

/**
 * The p-th percentile (0..100) of already sorted samples, linearly
 * interpolated between the two closest ranks (numpy's default), so small
 * sample counts (docker: ~20) still give a stable value instead of jumping
 * between neighbours.
 */
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return NaN;
  const rank = (p / 100) * (sorted.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  const a = sorted[lo]!;
  const b = sorted[hi]!;
  return a + (b - a) * (rank - lo);
}

export function median(samples: readonly number[]): number {
  return percentile([...samples].sort((x, y) => x - y), 50);
}

export function summarize(samples: readonly number[]): Summary {
  const sorted = [...samples].sort((x, y) => x - y);
  const sum = sorted.reduce((acc, x) => acc + x, 0);
  return {
    n: sorted.length,
    median: percentile(sorted, 50),
    p95: percentile(sorted, 95),
    mean: sorted.length ? sum / sorted.length : NaN,
    min: sorted[0] ?? NaN,
    max: sorted[sorted.length - 1] ?? NaN,
  };
}

/**
 * Times two variants of one operation in ABBA order (A B B A, repeated), so
 * that drift of a shared machine falls on both alike: for ratios of the
 * form "with X / without X" measured in one run.
 */
export async function timePair(n: number, warmup: number, a: () => Promise<unknown>, b: () => Promise<unknown>): Promise<[number[], number[]]> {
  for (let i = 0; i < warmup; i++) {
    await a();
    await b();
  }
  const samples: [number[], number[]] = [[], []];
  const timed = async (which: 0 | 1) => {
    const t = performance.now();
    await (which === 0 ? a() : b());
    samples[which].push(performance.now() - t);
  };
  for (let i = 0; i < n; i++) {
    const order: (0 | 1)[] = i % 2 === 0 ? [0, 1] : [1, 0];
    for (const which of order) await timed(which);
  }
  return samples;
}

/**
 * timePair for any number of variants: each round runs them all, forward
 * in even rounds and backward in odd ones (A B C, C B A, ...), so drift
 * falls on all alike. Returns the samples of each variant, in order.
 */
export async function timeRounds(n: number, warmup: number, fns: readonly (() => Promise<unknown>)[]): Promise<number[][]> {
  for (let i = 0; i < warmup; i++) for (const fn of fns) await fn();
  const samples: number[][] = fns.map(() => []);
  const order = fns.map((_, i) => i);
  for (let round = 0; round < n; round++) {
    for (const i of round % 2 === 0 ? order : [...order].reverse()) {
      const t = performance.now();
      await fns[i]!();
      samples[i]!.push(performance.now() - t);
    }
  }
  return samples;
}

/**
 * n samples (ms) of fn, run one after another after `warmup` untimed runs;
 * `between`, if given, runs untimed before each sample (the rest of a step,
 * for work that is never done back to back in real use).
 */
export async function timeMany(n: number, warmup: number, fn: () => Promise<unknown>, between?: () => Promise<unknown>): Promise<number[]> {
  for (let i = 0; i < warmup; i++) await fn();
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    if (between) await between();
    const t = performance.now();
    await fn();
    samples.push(performance.now() - t);
  }
  return samples;
}
