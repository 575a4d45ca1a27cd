/**
 * A process running in a fresh sandbox: streams, exit, signals, and the
 * timeout/abort plumbing that kills the whole tree.
 */
import { closeSync, writeSync } from 'node:fs';
import { Socket } from 'node:net';
import { constants as osConstants } from 'node:os';
import type { Readable, Writable } from 'node:stream';
import { ReadStream } from 'node:tty';
import { decodeErrorRecord, native, type ExitWatch, type NativeOp, type NativeSpawnResult } from '../native/index.js';
import { ConfigError, ExecError, MountError, NamespaceError, SetupError, SpawnerError, describeErrno } from './errors.js';
import type { SpawnOptions } from './options.js';
import { buildPlan } from './plan.js';

export interface ExitInfo {
  /** The exit code, or null when the process was killed by a signal. */
  exitCode: number | null;
  signal: NodeJS.Signals | null;
}

const signalNames = new Map<number, NodeJS.Signals>();
for (const [name, num] of Object.entries(osConstants.signals)) signalNames.set(num, name as NodeJS.Signals);

export function signalNumber(signal: NodeJS.Signals | number): number {
  if (typeof signal === 'number') return signal;
  const n = osConstants.signals[signal];
  if (n === undefined) throw new ConfigError(`unknown signal '${signal}'`, 'signal');
  return n;
}

/** The pseudo-terminal's master side, for `pty: true`. */
export interface Terminal extends Socket {
  resize(cols: number, rows: number): void;
}

function readSocket(fd: number): Socket {
  return new Socket({ fd, readable: true, writable: false });
}

function openTerminal(fd: number): Terminal {
  // A pty master is a TTY to libuv, which net.Socket({ fd }) refuses; a TTY
  // handle reads and writes it without a thread per stream.
  const t = new ReadStream(fd) as unknown as Terminal;
  t.resize = (cols, rows) => native.resizePty(fd, cols, rows);
  // EIO on the master only means every slave fd is closed: end of output.
  t.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code === 'EIO') t.push(null);
  });
  return t;
}

/** What a process handle needs to know about how it was started. */
export interface ProcessContext {
  /** Describes plan op i for error messages. */
  describeOp(index: number): string;
  ops: readonly NativeOp[];
  argv0: string;
  cwd: string;
  timeout?: number;
  signal?: AbortSignal;
}

/** Calls into the addon, turning its errors into the library's. */
export function callNative(fn: () => NativeSpawnResult): NativeSpawnResult {
  try {
    return fn();
  } catch (e) {
    const err = e as Error & { code?: string };
    if (err instanceof TypeError) throw new ConfigError(err.message);
    if (err.code === SpawnerError.code) throw new SpawnerError(`cannot create the sandbox: ${err.message}`, { cause: err });
    throw new NamespaceError(`cannot create the sandbox: ${err.message}`, err.code);
  }
}

/** Turns the child's error record into the typed error it stands for. */
function setupError(built: ProcessContext, argv0: string, cwd: string, buf: Buffer): SetupError {
  const rec = decodeErrorRecord(buf);
  const why = describeErrno(rec.errno) + (rec.detail ? `: ${rec.detail}` : '');
  if (rec.step.startsWith('op-')) {
    const part = rec.step === 'op-source' ? 'source: ' : rec.step === 'op-target' ? 'target: ' : '';
    const op = built.ops[rec.op];
    // overlayfs reports most refusals only to the kernel log, not to us.
    const hint = op?.kind === 'overlay' && rec.step === 'op-mount' && !rec.detail ? ' (overlayfs gives its reason in the kernel log: dmesg)' : '';
    return new MountError(`${built.describeOp(rec.op)}: ${part}${why}${hint}`, rec.step, rec.errno, rec.detail);
  }
  if (rec.step === 'exec') {
    const hint = rec.errno === 2 ? ' (not found in the sandbox; check PATH and the mounts)' : '';
    return new ExecError(`exec ${argv0}: ${why}${hint}`, rec.step, rec.errno, rec.detail);
  }
  if (rec.step === 'chdir') return new SetupError(`chdir ${cwd}: ${why}`, rec.step, rec.errno, rec.detail);
  return new SetupError(`sandbox setup, step ${rec.step}: ${why}`, rec.step, rec.errno, rec.detail);
}

export class SandboxProcess implements AsyncDisposable {
  /** Host pid of the sandbox's PID 1 (or of the process, without a PID namespace). */
  readonly pid: number;
  readonly stdin: Writable | null;
  readonly stdout: Readable | null;
  readonly stderr: Readable | null;
  /** Resolves once the command is exec'd; rejects with the setup error. */
  readonly ready: Promise<void>;
  /**
   * Resolves when the command has exited (its status comes from PID 1 at
   * once; PID 1 then ends and the kernel kills whatever the command left
   * and tears the namespaces down), or when the sandbox was killed.
   * Rejects if setup failed.
   */
  readonly exited: Promise<ExitInfo>;
  timedOut = false;
  isCanceled = false;
  /** Set once the process has exited; signals are no longer sent. */
  exitInfo: ExitInfo | null = null;

  #terminal: Terminal | null = null;
  readonly #pidfd: number | null;
  /** Exec'd into a running sandbox: signals go through its monitor. */
  #controlFd: number | null;
  readonly #watch: ExitWatch | null;
  #timer: NodeJS.Timeout | undefined;
  #abortCleanup: (() => void) | undefined;

  /** Use spawn() or Sandbox#spawn(); this wraps what the addon returned. */
  constructor(res: NativeSpawnResult, ctx: ProcessContext) {
    this.pid = res.pid ?? -1;
    this.#pidfd = res.pidfd;
    this.#controlFd = res.controlFd;
    this.stdin = res.stdin !== null ? new Socket({ fd: res.stdin, readable: false, writable: true }) : null;
    this.stdout = res.stdout !== null ? readSocket(res.stdout) : null;
    this.stderr = res.stderr !== null ? readSocket(res.stderr) : null;
    const terminalReady =
      res.ptySocket === null
        ? Promise.resolve()
        : new Promise<void>((resolve) =>
            native.receiveFd(res.ptySocket!, (_errno, fd) => {
              // Without a terminal the error record says why; nothing to add.
              if (fd !== null) this.#terminal = openTerminal(fd);
              resolve();
            }),
          );
    // A sandboxed reader that exits early must not crash us with EPIPE.
    this.stdin?.on('error', () => {});

    const execDone = new Promise<void>((resolve, reject) => {
      const chunks: Buffer[] = [];
      const errSock = readSocket(res.errFd);
      errSock.on('data', (c: Buffer) => chunks.push(c));
      errSock.on('error', () => {});
      errSock.on('close', () => {
        const buf = Buffer.concat(chunks);
        if (buf.length >= native.errorRecordSize) reject(setupError(ctx, ctx.argv0, ctx.cwd, buf));
        else resolve();
      });
    });
    this.ready = Promise.all([execDone, terminalReady]).then(() => {});
    this.ready.catch(() => {});

    let onExit!: (info: ExitInfo) => void;
    const exit = new Promise<ExitInfo>((resolve) => (onExit = resolve));
    const finish = (info: ExitInfo) => {
      this.exitInfo = info;
      this.#clearTriggers();
      // The monitor is gone: its control channel serves no more (kill()
      // sends nothing once exitInfo is set).
      if (this.#controlFd !== null) closeSync(this.#controlFd);
      this.#controlFd = null;
      onExit(info);
    };
    if (res.pidfd !== null) {
      this.#watch = native.watchExit(
        res.pidfd,
        res.statusFd,
        (code, sig) => finish({ exitCode: code, signal: sig === null ? null : (signalNames.get(sig) ?? null) }),
        res.viaSpawner,
      );
    } else {
      // Nothing was started: the error record tells why.
      this.#watch = null;
      finish({ exitCode: 127, signal: null });
    }
    this.exited = this.ready.then(
      () => exit,
      async (err) => {
        await exit;
        throw err;
      },
    );
    this.exited.catch(() => {});

    if (ctx.timeout !== undefined) {
      this.#timer = setTimeout(() => {
        this.timedOut = true;
        this.killTree();
      }, ctx.timeout);
    }
    if (ctx.signal) {
      const signal = ctx.signal;
      const onAbort = () => {
        this.isCanceled = true;
        this.killTree();
      };
      if (signal.aborted) onAbort();
      else {
        signal.addEventListener('abort', onAbort, { once: true });
        this.#abortCleanup = () => signal.removeEventListener('abort', onAbort);
      }
    }
  }

  /** The process's pidfd (PID 1's, for a new sandbox) while it runs; null once it has exited. */
  get pidfd(): number | null {
    return this.exitInfo ? null : this.#pidfd;
  }

  /** The pseudo-terminal's master (with `pty`), available once `ready` resolves. */
  get terminal(): Terminal | null {
    return this.#terminal;
  }

  #clearTriggers(): void {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#abortCleanup?.();
    this.#abortCleanup = undefined;
  }

  /**
   * Sends a signal. With a PID namespace (the default) PID 1 forwards it to
   * every process in the sandbox; SIGKILL ends the whole tree at once.
   * Returns false when the sandbox has already exited.
   */
  kill(signal: NodeJS.Signals | number = 'SIGTERM'): boolean {
    if (this.exitInfo || this.#pidfd === null) return false;
    const signo = signalNumber(signal);
    if (this.#controlFd !== null) return this.#control(signo === osConstants.signals.SIGKILL ? native.controlKillTree : signo);
    return native.signal(this.#pidfd, signo);
  }

  /**
   * Kills the process and every process it started. In a fresh sandbox that
   * is SIGKILL to its PID 1 (the kernel does the rest); in a running sandbox
   * the command's monitor stops and kills its whole subtree, and only that.
   */
  killTree(): boolean {
    return this.kill('SIGKILL');
  }

  #control(byte: number): boolean {
    try {
      writeSync(this.#controlFd!, Buffer.from([byte]));
      return true;
    } catch {
      return false; // the monitor is gone
    }
  }

  /** Let Node exit while this sandbox still runs (it dies with Node). */
  unref(): void {
    this.#watch?.unref();
    for (const s of [this.stdout, this.stderr, this.terminal] as const) (s as Socket | null)?.unref();
  }

  ref(): void {
    this.#watch?.ref();
    for (const s of [this.stdout, this.stderr, this.terminal] as const) (s as Socket | null)?.ref();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.killTree();
    await this.exited.catch(() => {});
  }
}

/** Starts a command in a new sandbox. Throws ConfigError on bad options. */
export function spawn(opts: SpawnOptions): SandboxProcess {
  const built = buildPlan(opts);
  const res = callNative(() => native.spawn(built.plan));
  return new SandboxProcess(res, {
    describeOp: built.describeOp,
    ops: built.allOps,
    argv0: built.plan.argv[0]!,
    cwd: built.plan.cwd,
    timeout: opts.timeout,
    signal: opts.signal,
  });
}
