/**
 * The library's one concurrency limiter: a counting semaphore, first come
 * first served. It bounds builds and evaluations (lib/swe), file system
 * calls in flight (walks, hashing, chmods) and a process's waiters on the
 * store's I/O budget (lib/layers/budget.ts).
 */
export interface Limiter {
  /**
   * Runs `job` once fewer than the limit's jobs are running. A `signal`
   * aborted before the job starts (already, or while it waits its turn)
   * rejects with the signal's reason and gives the turn to the next; a job
   * already started is not stopped by it.
   */
  <T>(job: () => Promise<T>, signal?: AbortSignal): Promise<T>;
  /** Jobs running or waiting. */
  readonly size: number;
}

export function createLimiter(n: number): Limiter {
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`concurrency must be a positive integer, got ${n}`);
  let running = 0;
  const waiting: Array<() => void> = [];
  const turn = (signal: AbortSignal | undefined): Promise<void> =>
    new Promise<void>((resolve, reject) => {
      const go = (): void => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      const onAbort = (): void => {
        const i = waiting.indexOf(go);
        if (i >= 0) waiting.splice(i, 1);
        reject(signal!.reason);
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      waiting.push(go);
    });
  const limit = async <T>(job: () => Promise<T>, signal?: AbortSignal): Promise<T> => {
    signal?.throwIfAborted();
    // A finishing job hands its slot straight to the next waiter (running
    // stays the same), so a newcomer can never slip in between the two.
    if (running >= n || waiting.length > 0) await turn(signal);
    else running++;
    try {
      return await job();
    } finally {
      const next = waiting.shift();
      if (next) next();
      else running--;
    }
  };
  return Object.defineProperty(limit, 'size', { get: () => running + waiting.length }) as Limiter;
}

/** Promise.all over `items` with at most `limit` calls of `fn` running at once; results in order. */
export function mapLimit<T, R>(items: readonly T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const run = createLimiter(limit);
  return Promise.all(items.map((item) => run(() => fn(item))));
}
