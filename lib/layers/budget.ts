import { EventEmitter } from 'node:events';
import { promises as fsp, watch, type FSWatcher } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { codeOf } from '../errors.js';
import { createLimiter, type Limiter } from '../files/limit.js';
import { withLock } from '../files/lock.js';
import { processIsAlive, selfStartTime } from '../files/proc.js';
import { LayerError } from './errors.js';

/**
 * Machine-wide I/O budget for unpacking. It is a weighted semaphore on archive
 * bytes in flight (default 2 GiB) plus a cap on the number of concurrent
 * unpacks (default: the number of CPUs). Both are shared by every process
 * that uses the same state directory.
 *
 * State is one small file per request in `dir`:
 *   q-<ticket>-<pid>-<starttime>-<n>.json  waiting
 *   r-<ticket>-<pid>-<starttime>-<n>.json  admitted (bytes in flight)
 * Every check-and-change happens under a flock on `dir/.mutex`, so two
 * processes can never both see room that only one of them has. Admission is
 * FIFO: a request goes in only when it is the oldest waiter *and* fits. A
 * large unpack is therefore not starved by a stream of small ones. A request
 * larger than maxBytes is admitted once nothing else is in flight, because it
 * could never fit otherwise.
 *
 * A crashed process leaves its slot file behind. Slot names carry the pid and
 * its start time (from /proc/PID/stat), so a slot whose process is gone, or
 * whose pid now belongs to another process, is deleted on the next check.
 */
export interface BudgetOptions {
  /** State directory shared by all cooperating processes. */
  dir: string;
  /** Max archive bytes being unpacked at once (default 2 GiB). */
  maxBytes?: number;
  /** Max concurrent unpacks (default: twice the CPU count). */
  maxConcurrent?: number;
  /** Fallback poll interval while waiting (default 200 ms); inotify wakes us sooner. */
  pollMs?: number;
}

export interface BudgetProgress {
  label: string;
  done: number;
  total: number;
}

export interface BudgetTicket {
  readonly label: string;
  readonly bytes: number;
  /** Report bytes done for this unpack; emitted as a 'progress' event. */
  progress(done: number): void;
  release(): Promise<void>;
}

export interface BudgetUsage {
  running: number;
  runningBytes: number;
  waiting: number;
}

interface Slot {
  file: string;
  state: 'q' | 'r';
  ticket: number;
  bytes: number;
}

export interface IoBudgetEvents {
  wait: [{ label: string; bytes: number }];
  acquire: [{ label: string; bytes: number; waitedMs: number }];
  progress: [BudgetProgress];
  release: [{ label: string; bytes: number }];
}

let counter = 0;

/**
 * Waiters of one process queue here first, one at a time per budget
 * directory, so that only the head of the local queue polls the
 * machine-wide state. Without it every waiter wakes on every slot change and
 * takes the cross-process lock (a flock helper each time): a thundering herd
 * that costs more than the unpacking it schedules. Admission is FIFO either
 * way.
 */
const localQueues = new Map<string, Limiter>();

async function inLocalQueue<T>(dir: string, signal: AbortSignal | undefined, fn: () => Promise<T>): Promise<T> {
  let queue = localQueues.get(dir);
  if (!queue) localQueues.set(dir, (queue = createLimiter(1)));
  try {
    return await queue(fn, signal);
  } catch (err) {
    // An abort while queued is honoured at once; the queue order still holds.
    if (signal?.aborted && err === signal.reason) throw new LayerError(`io budget ${dir}: waiting aborted`, { cause: err });
    throw err;
  } finally {
    if (queue.size === 0) localQueues.delete(dir);
  }
}

export class IoBudget extends EventEmitter<IoBudgetEvents> {
  readonly dir: string;
  readonly maxBytes: number;
  readonly maxConcurrent: number;
  private readonly pollMs: number;

  constructor(opts: BudgetOptions) {
    super();
    this.dir = opts.dir;
    this.maxBytes = opts.maxBytes ?? 2 * 1024 ** 3;
    // Unpacking waits on the disk as much as on a CPU: two per core keeps both
    // busy without the contention of unbounded parallelism.
    this.maxConcurrent = opts.maxConcurrent ?? 2 * Math.max(1, os.availableParallelism());
    this.pollMs = opts.pollMs ?? 200;
    if (!(this.maxBytes > 0) || !(this.maxConcurrent >= 1))
      throw new LayerError(`io budget ${this.dir}: maxBytes and maxConcurrent must be positive`);
  }

  /** Wait until `bytes` fit in the budget, then hold them until release(). */
  async acquire(bytes: number, opts: { label?: string; signal?: AbortSignal } = {}): Promise<BudgetTicket> {
    return inLocalQueue(path.resolve(this.dir), opts.signal, () => this.#admit(bytes, opts));
  }

  async #admit(bytes: number, opts: { label?: string; signal?: AbortSignal }): Promise<BudgetTicket> {
    const label = opts.label ?? `unpack#${++counter}`;
    if (!(bytes >= 0)) throw new LayerError(`io budget ${this.dir}: bad byte count ${bytes} for ${label}`);
    await fsp.mkdir(this.dir, { recursive: true });
    const started = Date.now();
    const id = `${process.pid}-${selfStartTime()}-${++counter}`;
    let myFile: string | undefined;
    let admitted = false;
    let waitedEmitted = false;

    let wake: (() => void) | undefined;
    let watcher: FSWatcher | undefined;
    try {
      watcher = watch(this.dir, () => wake?.());
      watcher.unref();
    } catch {
      watcher = undefined; // polling alone still works
    }
    try {
      for (;;) {
        if (opts.signal?.aborted) throw new LayerError(`io budget ${this.dir}: waiting for ${label} aborted`);
        await withLock(path.join(this.dir, '.mutex'), async () => {
          const slots = await this.readSlots();
          if (myFile === undefined) {
            const maxTicket = slots.reduce((m, s) => Math.max(m, s.ticket), 0);
            const ticket = Math.max(maxTicket + 1, Date.now() * 1000);
            myFile = `q-${ticket}-${id}.json`;
            await fsp.writeFile(path.join(this.dir, myFile), JSON.stringify({ bytes, label, pid: process.pid }));
            slots.push({ file: myFile, state: 'q', ticket, bytes });
          }
          const running = slots.filter((s) => s.state === 'r');
          const oldestWaiter = slots.filter((s) => s.state === 'q').sort((a, b) => a.ticket - b.ticket)[0];
          const inFlight = running.reduce((sum, s) => sum + s.bytes, 0);
          const fits =
            running.length === 0 ||
            (running.length + 1 <= this.maxConcurrent && inFlight + bytes <= this.maxBytes);
          if (oldestWaiter?.file === myFile && fits) {
            const runFile = `r-${myFile.slice(2)}`;
            await fsp.rename(path.join(this.dir, myFile), path.join(this.dir, runFile));
            myFile = runFile;
            admitted = true;
          }
        });
        if (admitted) break;
        if (!waitedEmitted) {
          waitedEmitted = true;
          this.emit('wait', { label, bytes });
        }
        await new Promise<void>((resolve) => {
          const t = setTimeout(resolve, this.pollMs * (0.75 + Math.random() / 2));
          wake = () => {
            clearTimeout(t);
            // Small delay so a burst of directory events becomes one check.
            setTimeout(resolve, 5);
          };
        });
        wake = undefined;
      }
    } catch (err) {
      if (myFile) await fsp.rm(path.join(this.dir, myFile), { force: true });
      throw err;
    } finally {
      watcher?.close();
    }

    this.emit('acquire', { label, bytes, waitedMs: Date.now() - started });
    const file = path.join(this.dir, myFile!);
    let released: Promise<void> | undefined;
    return {
      label,
      bytes,
      progress: (done: number) => this.emit('progress', { label, done, total: bytes }),
      release: () => {
        released ??= (async () => {
          await fsp.rm(file, { force: true });
          this.emit('release', { label, bytes });
        })();
        return released;
      },
    };
  }

  /** Current machine-wide usage (stale slots of dead processes excluded). */
  async usage(): Promise<BudgetUsage> {
    await fsp.mkdir(this.dir, { recursive: true });
    return withLock(path.join(this.dir, '.mutex'), async () => {
      const slots = await this.readSlots();
      const running = slots.filter((s) => s.state === 'r');
      return {
        running: running.length,
        runningBytes: running.reduce((sum, s) => sum + s.bytes, 0),
        waiting: slots.length - running.length,
      };
    });
  }

  /** Read slot files, deleting those whose process is gone. Call under the mutex. */
  private async readSlots(): Promise<Slot[]> {
    const out: Slot[] = [];
    for (const file of await fsp.readdir(this.dir)) {
      const m = /^([qr])-(\d+)-(\d+)-(\d+)-\d+\.json$/.exec(file);
      if (!m) continue;
      const [, state, ticket, pid, start] = m;
      const full = path.join(this.dir, file);
      if (!processIsAlive(Number(pid), start!)) {
        await fsp.rm(full, { force: true });
        continue;
      }
      let bytes = 0;
      try {
        bytes = Number((JSON.parse(await fsp.readFile(full, 'utf8')) as { bytes: number }).bytes) || 0;
      } catch (err) {
        if (codeOf(err) === 'ENOENT') continue;
        throw err;
      }
      out.push({ file, state: state as 'q' | 'r', ticket: Number(ticket), bytes });
    }
    return out;
  }
}
