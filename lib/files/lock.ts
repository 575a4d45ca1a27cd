import { spawn } from 'node:child_process';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { FileError } from './errors.js';

/**
 * Cross-process exclusive lock on a file, held by a `flock(1)` child process.
 *
 * Why a child and not a lock file with pid + start-time checks: the kernel
 * drops a flock when the last descriptor on it closes, i.e. when the holder
 * dies, however it dies. The holder is `flock -x FILE sh -c 'echo; exec cat'`.
 * cat blocks reading a pipe whose only writer is this Node process. If this
 * process exits or is SIGKILLed, the pipe closes, cat sees EOF and exits, and
 * the lock is gone. There is no stale-lock detection to get wrong and no
 * "steal" race: with O_EXCL/pid files two waiters can both judge a lock stale
 * and delete each other's fresh lock. Cost: one short-lived process pair per
 * acquisition (a few ms), which is negligible next to unpacking a layer.
 * Requires util-linux `flock` (present on Debian/Ubuntu base images).
 */
export interface FileLock {
  readonly path: string;
  /** Release the lock and wait until the holder process has exited. Idempotent. */
  release(): Promise<void>;
}

export interface LockOptions {
  /** Give up after this long (default: wait forever). */
  timeoutMs?: number;
  signal?: AbortSignal;
  /** What the lock protects, for error messages (e.g. "layer 3f2a…"). */
  what?: string;
}

export async function acquireLock(lockPath: string, opts: LockOptions = {}): Promise<FileLock> {
  const wait = opts.timeoutMs === undefined ? [] : ['-w', String(Math.max(0, opts.timeoutMs) / 1000)];
  const lock = await holdLock(lockPath, wait, opts);
  if (!lock) throw new FileError(`${opts.what ?? `lock ${lockPath}`}: timed out after ${opts.timeoutMs} ms waiting for ${lockPath} (held by another process)`);
  return lock;
}

/** The lock if nobody holds it right now, else undefined at once (flock -n). */
export function tryLock(lockPath: string, opts: Omit<LockOptions, 'timeoutMs'> = {}): Promise<FileLock | undefined> {
  return holdLock(lockPath, ['-n'], opts);
}

/** Undefined when flock gave up waiting (`wait` is -w or -n). */
async function holdLock(lockPath: string, wait: string[], opts: LockOptions): Promise<FileLock | undefined> {
  await fsp.mkdir(path.dirname(lockPath), { recursive: true });
  const what = opts.what ?? `lock ${lockPath}`;
  // -E 75: distinct exit status for "gave up waiting" vs other failures.
  const args = ['-x', ...wait, '-E', '75', lockPath, 'sh', '-c', 'echo locked; exec cat >/dev/null'];
  const child = spawn('flock', args, { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
  const closed = new Promise<void>((resolve) => child.once('close', () => resolve()));

  const locked = await new Promise<boolean>((resolve, reject) => {
    let done = false;
    const onAbort = (): void => {
      if (done) return;
      done = true;
      child.kill('SIGKILL');
      reject(new FileError(`${what}: waiting for ${lockPath} aborted`));
    };
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    if (opts.signal?.aborted) onAbort();
    child.stdout.once('data', () => {
      if (done) return;
      done = true;
      opts.signal?.removeEventListener('abort', onAbort);
      resolve(true);
    });
    child.once('error', (e) => {
      if (done) return;
      done = true;
      reject(new FileError(`${what}: cannot run flock(1) (util-linux) for ${lockPath}: ${e.message}`));
    });
    child.once('close', (code) => {
      if (done) return;
      done = true;
      opts.signal?.removeEventListener('abort', onAbort);
      if (code === 75) resolve(false);
      else reject(new FileError(`${what}: flock ${lockPath} failed (exit ${code}): ${stderr.trim()}`));
    });
  });
  if (!locked) return undefined;
  // The holder must not keep this process's event loop alive on its own.
  child.unref();
  (child.stdin as unknown as { unref?: () => void }).unref?.();
  (child.stdout as unknown as { unref?: () => void }).unref?.();
  (child.stderr as unknown as { unref?: () => void }).unref?.();

  let released: Promise<void> | undefined;
  return {
    path: lockPath,
    release(): Promise<void> {
      released ??= (async () => {
        // Re-ref while we wait, or an otherwise idle process would exit
        // (with an unsettled promise) before the holder is gone.
        child.ref();
        child.stdin.end();
        await closed;
      })();
      return released;
    },
  };
}

/** Run `fn` while holding the lock; always releases. */
export async function withLock<T>(lockPath: string, fn: () => Promise<T>, opts: LockOptions = {}): Promise<T> {
  const lock = await acquireLock(lockPath, opts);
  try {
    return await fn();
  } finally {
    await lock.release();
  }
}
