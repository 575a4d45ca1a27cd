/** The one concurrency limiter: FIFO, never above its limit, abortable while waiting. */
import { describe, expect, it } from 'vitest';
import { createLimiter, mapLimit } from '../../lib/files/limit.js';

const tick = () => new Promise<void>((r) => setImmediate(r));

function gate(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

describe('createLimiter', () => {
  it('runs at most n jobs at once, in the order they came, even when a newcomer arrives as a slot frees', async () => {
    const limit = createLimiter(2);
    let running = 0;
    let peak = 0;
    const started: number[] = [];
    const gates = Array.from({ length: 6 }, gate);
    const jobs = gates.map((g, i) =>
      limit(async () => {
        started.push(i);
        peak = Math.max(peak, ++running);
        await g.promise;
        running--;
        return i;
      }),
    );
    await tick();
    expect(started).toEqual([0, 1]);
    expect(limit.size).toBe(6);
    gates[0]!.resolve();
    // A job arriving in the same turn as the freed slot queues behind the waiters.
    const late = limit(async () => {
      started.push(99);
      peak = Math.max(peak, ++running);
      running--;
      return 99;
    });
    for (const g of gates.slice(1)) g.resolve();
    expect(await Promise.all([...jobs, late])).toEqual([0, 1, 2, 3, 4, 5, 99]);
    expect(started).toEqual([0, 1, 2, 3, 4, 5, 99]);
    expect(peak).toBe(2);
    expect(limit.size).toBe(0);
  });

  it("rejects a waiting job with its signal's reason and lets the next one through", async () => {
    const limit = createLimiter(1);
    const held = gate();
    const first = limit(() => held.promise);
    const ac = new AbortController();
    const aborted = limit(async () => 'never', ac.signal);
    const third = limit(async () => 'third');
    ac.abort(new Error('stop waiting'));
    await expect(aborted).rejects.toThrow('stop waiting');
    expect(limit.size).toBe(2);
    held.resolve();
    await first;
    expect(await third).toBe('third');
    await expect(limit(async () => 1, AbortSignal.abort(new Error('already')))).rejects.toThrow('already');
  });

  it('refuses a limit that is not a positive integer', () => {
    expect(() => createLimiter(0)).toThrow('concurrency must be a positive integer, got 0');
    expect(() => createLimiter(1.5)).toThrow(RangeError);
  });

  it('mapLimit keeps the order of its results', async () => {
    expect(await mapLimit([30, 10, 20], 2, (ms) => new Promise<number>((r) => setTimeout(() => r(ms), ms)))).toEqual([30, 10, 20]);
  });
});
