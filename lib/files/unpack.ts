import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, constants, openSync, promises as fsp, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Worker } from 'node:worker_threads';
import { FileError } from './errors.js';
import { tarCheckSource, type TarCheck, type TarCheckOptions, type TarMemberWatch } from './tarCheck.js';

/**
 * The layer extractor's data path (extractArchive): an archive file into
 * `tar -x`, every member checked by TarCheck before tar sees it, and each
 * regular file's content hashed on the way.
 *
 *   archive fd --> zstd -dc --FIFO--> worker thread --FIFO--> tar -x
 *                                     (TarCheck, sha256)
 *
 * Why this shape (measured on a 337 MB, 19.6k-entry venv archive on tmpfs;
 * benchmarks/store.ts): the streams version (Node reads the archive and
 * writes it to zstd, reads zstd's output in 64 KiB chunks through a
 * Transform, writes it to tar) cost the main thread 0.7-0.9 s of CPU for a
 * 0.7 s `tar --zstd -xf`, on a machine whose two cores tar and zstd
 * already keep busy. Here:
 *  - zstd reads the archive itself (its stdin is the archive's own open
 *    file): the compressed bytes never pass through Node;
 *  - the decompressed bytes pass through one worker thread with blocking
 *    reads and gathered writes (writev of the checked ranges, no copy, no
 *    stream machinery, no event loop), and the caller's event loop stays free;
 *  - the worker hashes each regular file's data as it passes, so finishing
 *    (lib/layers/finish.ts) need not read the tree again.
 *
 * The worker's ends are named pipes in a private directory (0700, removed
 * as soon as they are open): Node has no pipe(2), and a child's stdio pipe
 * is a libuv socket a worker cannot read with blocking calls. No check is
 * weaker: the worker runs TarCheck's own source (tarCheckSource), tar reads
 * only what it writes, and a refusal stops the worker before tar sees the
 * refused member's header, as with TarChecker in a stream.
 */

/** A regular file's content as it was written by tar: sha256 (hex) and size. */
export interface FileDigest {
  sha256: string;
  size: number;
}

export interface CheckedUnpackSpec {
  /** The archive, open for reading at offset 0: zstd / gzip / the worker read it through this fd (its offset moves). */
  fd: number;
  compression: 'zstd' | 'gzip' | 'none';
  /** Arguments of `tar -x -f -` (where, and how). */
  tarArgs: string[];
  /** For TarCheck's messages. */
  archiveName: string;
  checkOptions?: TarCheckOptions;
  label: string;
  /** Hash each regular file member's data (FileDigest by member path, 'a/b/c'). */
  hashFiles?: boolean;
  /** Archive bytes read so far (polled from the fd's offset). */
  onProgress?: (done: number) => void;
  signal?: AbortSignal;
}

export interface CheckedUnpackResult {
  members: number;
  /**
   * With hashFiles: the content of every path that the archive leaves as a
   * regular file, by path relative to the destination ('a/b/c', UTF-8). A
   * path whose bytes are not UTF-8 is left out (the caller reads it).
   */
  digests?: Map<string, FileDigest>;
}

// ---------------------------------------------------------------------------
// The worker's side: runs from its source text (see workerSource), so it uses
// nothing of this module but its parameters.

interface UnpackRequest {
  id: number;
  archiveName: string;
  opts: TarCheckOptions;
  inFd: number;
  outFd: number;
  hash: boolean;
}
type UnpackReply =
  | { id: number; ok: { members: number; digests?: Array<[string, string, number]> } }
  | { id: number; error: { message: string; refusal: boolean; code?: string } };

interface UnpackWorkerHelpers {
  fs: typeof import('node:fs');
  crypto: typeof import('node:crypto');
  parentPort: import('node:worker_threads').MessagePort;
  TarCheck: typeof TarCheck;
}

function unpackWorkerMain({ fs, crypto, parentPort, TarCheck }: UnpackWorkerHelpers): void {
  // One input buffer, reused: everything the checker keeps past a chunk it copies.
  const input = Buffer.allocUnsafe(1 << 20);
  /** writev's limit is IOV_MAX (1024) buffers: flush well before. */
  const MAX_PENDING = 256;

  const run = (m: UnpackRequest): { members: number; digests?: Array<[string, string, number]> } => {
    // Checked bytes to write, as views of `input` (or the checker's own
    // buffers); neighbouring views of one buffer are merged, so a chunk of
    // plain data members goes out in one or a few iovecs.
    let pending: Buffer[] = [];
    const flush = (): void => {
      let at = 0;
      while (at < pending.length) {
        let n = fs.writevSync(m.outFd, at === 0 ? pending : pending.slice(at));
        while (n > 0) {
          const b = pending[at]!;
          if (n >= b.length) {
            n -= b.length;
            at++;
          } else {
            pending[at] = b.subarray(n);
            n = 0;
          }
        }
      }
      pending = [];
    };
    const out = (b: Buffer): void => {
      if (b.length === 0) return;
      const last = pending[pending.length - 1];
      if (last && last.buffer === b.buffer && last.byteOffset + last.length === b.byteOffset) {
        pending[pending.length - 1] = Buffer.from(last.buffer, last.byteOffset, last.length + b.length);
        return;
      }
      pending.push(b);
      if (pending.length >= MAX_PENDING) flush();
    };
    const refuse = (message: string): Error => Object.assign(new Error(message), { refusal: true });

    // Content hashes: the last regular file member (or hard link to one) at
    // each path; a symlink replacing it removes it.
    const digests = new Map<string, [string, number]>();
    let hash: import('node:crypto').Hash | undefined;
    let current = '';
    let currentSize = 0;
    const watch: TarMemberWatch = {
      file(name, size) {
        current = name;
        currentSize = size;
        hash = crypto.createHash('sha256');
      },
      data(bytes) {
        hash!.update(bytes);
      },
      done() {
        digests.set(current, [hash!.digest('hex'), currentSize]);
        hash = undefined;
      },
      link(name, target) {
        const d = digests.get(target);
        if (d) digests.set(name, d);
        else digests.delete(name);
      },
      gone(name) {
        digests.delete(name);
      },
    };

    const check = new TarCheck(m.archiveName, m.opts, out, () => undefined, refuse, m.hash ? watch : undefined);
    for (;;) {
      const got = fs.readSync(m.inFd, input, 0, input.length, null);
      if (got === 0) break;
      check.consume(input.subarray(0, got));
      flush();
    }
    check.finish();
    flush();
    if (!m.hash) return { members: check.members };
    // Member names are byte strings (latin1 form); a name that is not UTF-8
    // would not match the name readdir gives, so it is left out.
    const list: Array<[string, string, number]> = [];
    for (const [name, [sha, size]] of digests) {
      const utf8 = Buffer.from(name, 'latin1').toString('utf8');
      if (Buffer.from(utf8, 'utf8').toString('latin1') === name) list.push([utf8, sha, size]);
    }
    return { members: check.members, digests: list };
  };

  parentPort.on('message', (m: UnpackRequest) => {
    let reply: UnpackReply;
    try {
      reply = { id: m.id, ok: run(m) };
    } catch (err) {
      const e = err as { message?: string; refusal?: boolean; code?: string };
      reply = { id: m.id, error: { message: String(e?.message ?? err), refusal: e?.refusal === true, ...(e?.code ? { code: e.code } : {}) } };
    }
    parentPort.postMessage(reply);
  });
}

let source: string | undefined;
function workerSource(): string {
  source ??= `import fs from 'node:fs';
import crypto from 'node:crypto';
import { parentPort } from 'node:worker_threads';
${tarCheckSource()}
(${unpackWorkerMain.toString()})({ fs, crypto, parentPort, TarCheck });
`;
  return source;
}

// ---------------------------------------------------------------------------
// Workers: one per unpack in progress (each is busy for the whole unpack),
// kept while in use; idle ones do not keep the process alive and are
// stopped after IDLE_MS: starting a worker (a new V8 isolate) costs tens
// of milliseconds, which a run of small layers would otherwise pay each time.

const IDLE_MS = 10_000;

class UnpackWorker {
  readonly worker: Worker;
  private pending: { id: number; resolve: (v: UnpackReply) => void; reject: (e: unknown) => void } | undefined;
  private nextId = 0;
  dead = false;
  idleSince = 0;

  constructor() {
    // A data: URL is always an ES module, whatever --input-type the process was started with.
    this.worker = new Worker(new URL(`data:text/javascript,${encodeURIComponent(workerSource())}`), { name: 'minisandbox-unpack' });
    this.worker.on('message', (r: UnpackReply) => {
      const p = this.pending;
      if (!p || p.id !== r.id) return;
      this.pending = undefined;
      this.worker.unref();
      p.resolve(r);
    });
    const fail = (err: unknown): void => {
      this.dead = true;
      this.pending?.reject(new FileError(`unpack worker failed: ${(err as Error)?.message ?? err}`, { cause: err }));
      this.pending = undefined;
    };
    this.worker.on('error', fail);
    this.worker.on('exit', (code) => fail(new Error(`exited with code ${code}`)));
    // Unreferenced once its listeners are on: adding a 'message' listener
    // references the worker's port again, and a worker never called would
    // then keep the process alive until the idle timeout.
    this.worker.unref();
  }

  call(req: Omit<UnpackRequest, 'id'>): Promise<UnpackReply> {
    if (this.dead) return Promise.reject(new FileError('unpack worker failed: it has exited'));
    const id = this.nextId++;
    this.worker.ref();
    return new Promise((resolve, reject) => {
      this.pending = { id, resolve, reject };
      this.worker.postMessage({ ...req, id });
    });
  }
}

const idle: UnpackWorker[] = [];
let idleTimer: NodeJS.Timeout | undefined;

function takeWorker(): UnpackWorker {
  for (;;) {
    const w = idle.pop();
    if (!w) return new UnpackWorker();
    if (!w.dead) return w;
  }
}

function giveBack(w: UnpackWorker): void {
  if (w.dead) return;
  w.idleSince = Date.now();
  idle.push(w);
  if (idleTimer) return;
  idleTimer = setInterval(() => {
    const now = Date.now();
    for (let i = idle.length - 1; i >= 0; i--) {
      if (now - idle[i]!.idleSince >= IDLE_MS) void idle.splice(i, 1)[0]!.worker.terminate();
    }
    if (idle.length === 0) {
      clearInterval(idleTimer);
      idleTimer = undefined;
    }
  }, IDLE_MS / 2);
  idleTimer.unref();
}

/** For tests and benchmarks: stop the idle unpack workers now (they stop by themselves after IDLE_MS). */
export function stopUnpackWorkers(): void {
  if (idleTimer) clearInterval(idleTimer);
  idleTimer = undefined;
  for (const w of idle.splice(0)) void w.worker.terminate();
}

// ---------------------------------------------------------------------------

/** The read and write ends of a named pipe, both blocking, the pipe's name already gone. */
function openFifo(p: string): { r: number; w: number } {
  // A FIFO's open waits for the other end, except a non-blocking read open;
  // with that reader there the write open returns at once, and then so does
  // a blocking read open (the ends must block: tar and the worker read and
  // write them with ordinary blocking calls).
  const probe = openSync(p, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const w = openSync(p, constants.O_WRONLY);
    try {
      return { r: openSync(p, constants.O_RDONLY), w };
    } catch (err) {
      closeSync(w);
      throw err;
    }
  } finally {
    closeSync(probe);
  }
}

function exitOf(child: ChildProcess, name: string, label: string, stderr: () => string): Promise<void> {
  return new Promise((resolve, reject) => {
    child.on('error', (e) => reject(new FileError(`${label}: cannot run ${name}: ${e.message}`)));
    child.on('close', (code, sig) => {
      if (code === 0) resolve();
      else reject(new FileError(`${label}: ${name} failed (${sig ?? `exit ${code}`}): ${stderr().trim()}`));
    });
  });
}

/** The archive's fd offset (bytes its readers have consumed), from /proc; undefined if it cannot be read. */
function offsetOf(fd: number): number | undefined {
  try {
    const m = /^pos:\s*(\d+)/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, 'latin1'));
    return m ? Number(m[1]) : undefined;
  } catch {
    return undefined;
  }
}

export async function checkedUnpack(spec: CheckedUnpackSpec): Promise<CheckedUnpackResult> {
  const { label } = spec;
  if (spec.signal?.aborted) throw new FileError(`${label}: extraction aborted`);
  // The decompressor (or the worker) reads the archive from the fd's offset.
  if (offsetOf(spec.fd) !== undefined && offsetOf(spec.fd) !== 0) throw new FileError(`${label}: the archive's file offset is not at its start`);

  const fifos = await fsp.mkdtemp(path.join(os.tmpdir(), 'msbx-unpack-'));
  const open: number[] = [];
  const closeFd = (fd: number): void => {
    const i = open.indexOf(fd);
    if (i === -1) return;
    open.splice(i, 1);
    closeSync(fd);
  };
  const children: ChildProcess[] = [];
  const killAll = (): void => {
    for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  };
  let progressTimer: NodeJS.Timeout | undefined;
  let worker: UnpackWorker | undefined;
  try {
    const compressed = spec.compression !== 'none';
    const names = compressed ? ['dec', 'tar'] : ['tar'];
    await new Promise<void>((resolve, reject) => {
      const mk = spawn('mkfifo', ['-m', '600', ...names.map((n) => path.join(fifos, n))], { stdio: ['ignore', 'ignore', 'pipe'] });
      let err = '';
      mk.stderr.on('data', (b: Buffer) => (err += b.toString()));
      mk.on('error', (e) => reject(new FileError(`${label}: cannot run mkfifo: ${e.message}`)));
      mk.on('close', (code) => (code === 0 ? resolve() : reject(new FileError(`${label}: mkfifo failed (exit ${code}): ${err.trim()}`))));
    });
    const toTar = openFifo(path.join(fifos, 'tar'));
    open.push(toTar.r, toTar.w);
    const fromDec = compressed ? openFifo(path.join(fifos, 'dec')) : undefined;
    if (fromDec) open.push(fromDec.r, fromDec.w);
    await fsp.rm(fifos, { recursive: true, force: true });

    const stderrOf = new Map<ChildProcess, string>();
    const start = (cmd: string, args: string[], stdin: number, stdout: number | 'ignore'): ChildProcess => {
      const child = spawn(cmd, args, { stdio: [stdin, stdout, 'pipe'] });
      children.push(child);
      stderrOf.set(child, '');
      child.stderr?.on('data', (b: Buffer) => stderrOf.set(child, (stderrOf.get(child) ?? '') + b.toString()));
      return child;
    };
    const steps: Array<Promise<unknown>> = [];
    const tar = start('tar', ['-x', '-f', '-', ...spec.tarArgs], toTar.r, 'ignore');
    steps.push(exitOf(tar, 'tar -x', label, () => stderrOf.get(tar) ?? ''));
    closeFd(toTar.r);
    if (fromDec) {
      const name = spec.compression === 'zstd' ? 'zstd' : 'gzip';
      const dec = start(name, ['-dc', '-q'], spec.fd, fromDec.w);
      steps.push(exitOf(dec, `${name} -dc`, label, () => stderrOf.get(dec) ?? ''));
      closeFd(fromDec.w);
    }

    if (spec.onProgress) {
      const report = spec.onProgress;
      let last = 0;
      progressTimer = setInterval(() => {
        const at = offsetOf(spec.fd);
        if (at !== undefined && at !== last) report((last = at));
      }, 100);
      progressTimer.unref();
    }
    const onAbort = (): void => killAll();
    spec.signal?.addEventListener('abort', onAbort, { once: true });
    if (spec.signal?.aborted) killAll();

    worker = takeWorker();
    const w = worker;
    const checked = w
      .call({ archiveName: spec.archiveName, opts: spec.checkOptions ?? {}, inFd: fromDec ? fromDec.r : spec.fd, outFd: toTar.w, hash: spec.hashFiles === true })
      .finally(() => {
        // tar sees the end of its input; a decompressor still writing gets EPIPE.
        closeFd(toTar.w);
        if (fromDec) closeFd(fromDec.r);
      });
    // Any failure stops the others: no process is left waiting on a pipe.
    const all = [checked.then((r) => ('error' in r ? Promise.reject(r) : r)), ...steps];
    for (const p of all) p.catch(killAll);
    const settled = await Promise.allSettled(all);
    spec.signal?.removeEventListener('abort', onAbort);
    giveBack(w);
    worker = undefined;

    const reply = settled[0]!;
    // An abort first: the processes it killed leave a truncated stream that
    // the checker would report. Then the checker's refusal, which names the
    // member; then tar's or the decompressor's own failure; then the worker's.
    if (spec.signal?.aborted) throw new FileError(`${label}: extraction aborted`);
    if (reply.status === 'rejected' && (reply.reason as UnpackReply & { error?: { refusal: boolean } }).error?.refusal)
      throw new FileError((reply.reason as { error: { message: string } }).error.message);
    for (const s of settled.slice(1)) if (s.status === 'rejected') throw s.reason;
    if (reply.status === 'rejected') {
      const r = reply.reason as { error?: { message: string } };
      if (r.error) throw new FileError(`${label}: ${r.error.message}`);
      throw r;
    }
    const ok = (reply.value as Extract<UnpackReply, { ok: unknown }>).ok;
    return {
      members: ok.members,
      ...(ok.digests ? { digests: new Map(ok.digests.map(([name, sha256, size]) => [name, { sha256, size }])) } : {}),
    };
  } finally {
    if (progressTimer) clearInterval(progressTimer);
    killAll();
    for (const fd of [...open]) closeFd(fd);
    await fsp.rm(fifos, { recursive: true, force: true }).catch(() => undefined);
    // A worker still in a call (an exception before it settled) is not reused.
    if (worker) void worker.worker.terminate();
  }
}
