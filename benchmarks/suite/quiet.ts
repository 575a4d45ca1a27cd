/**
 * Waiting for a quiet machine before a timed start. A contender's work does
 * not end when its close returns: `docker rm -f` comes back while dockerd,
 * containerd and the kernel still unmount, delete and free (network
 * namespaces are torn down by a kernel worker, for sandboxes too). Whatever
 * starts next would be charged for it, so each timed start waits until the
 * CPUs have been idle for a short window, for every contender alike.
 */
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

/** The CPU times of /proc/stat's first line: busy (all but idle; iowait counts as busy, someone's disk work) and total, in ticks. */
export function cpuTimes(stat: string): { busy: number; total: number } {
  const line = stat.split('\n').find((l) => l.startsWith('cpu '));
  if (!line) throw new Error('/proc/stat has no "cpu " line');
  // user nice system idle iowait irq softirq steal (guest time is already in user)
  const f = line.trim().split(/\s+/).slice(1, 9).map(Number);
  const total = f.reduce((a, b) => a + b, 0);
  return { busy: total - (f[3] ?? 0), total };
}

export interface SettleOptions {
  /** Busy share of all CPUs under which the machine counts as quiet. */
  threshold?: number;
  /** How long each look lasts, ms (/proc/stat counts in 10 ms ticks). */
  windowMs?: number;
  /** Give up after this long and go on, ms. */
  maxMs?: number;
}

/** Waits until one window is quiet or maxMs has passed; says how long it waited and whether it was quiet. */
export async function settle(opts: SettleOptions = {}): Promise<{ waitedMs: number; quiet: boolean }> {
  const { threshold = 0.1, windowMs = 50, maxMs = 2000 } = opts;
  const started = performance.now();
  let before = cpuTimes(readFileSync('/proc/stat', 'utf8'));
  for (;;) {
    await sleep(windowMs);
    const now = cpuTimes(readFileSync('/proc/stat', 'utf8'));
    const total = now.total - before.total;
    const quiet = total > 0 && (now.busy - before.busy) / total < threshold;
    const waitedMs = performance.now() - started;
    if (quiet || waitedMs >= maxMs) return { waitedMs, quiet };
    before = now;
  }
}
