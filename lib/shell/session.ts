/**
 * A persistent interactive bash on a pty with SWE-ReX `BashSession`
 * semantics: state (cwd, variables, functions, jobs) persists between runs,
 * each run returns its output and exit code, a timeout leaves the command
 * running until `interrupt()`. See protocol.ts for the wire-level design.
 */
import {
  BashIncorrectSyntaxError,
  CommandTimeoutError,
  InterruptFailedError,
  NoExitCodeError,
  NonZeroExitCodeError,
  SessionClosedError,
  SessionNotInitializedError,
} from './errors.js';
import type { BoundedOutputLimits } from './bounded.js';
import { ChannelClosedError, Expecter, ExpectTimeoutError, type ExpectMatch, type Pattern } from './expect.js';
import { ShellProtocol } from './protocol.js';
import type { PtyChannel, PtyExitInfo } from './pty.js';
import { checkBashSyntax } from './syntax.js';
import { cleanTerminalText } from './text.js';

export type CheckMode = 'raise' | 'silent' | 'ignore';

export interface ShellSessionOptions extends BoundedOutputLimits {
  /** Files sourced at startup (SWE-ReX `startup_source`). */
  startupSource?: string[];
  /** Default 5000 ms (SWE-ReX: 1 s, plus a blind 0.3 s sleep we do not need). */
  startupTimeoutMs?: number;
  /** Exported in the shell before the startup files are sourced. */
  env?: Record<string, string>;
  /** `bash -n` on the host before each run (default true). */
  syntaxCheck?: boolean;
  /** Host bash used for the syntax check. */
  bashPath?: string;
  /** Timeout of `run` when the call gives none (default: none, as SWE-ReX). */
  defaultTimeoutMs?: number;
}

export interface RunOptions {
  timeoutMs?: number;
  /** 'raise' (default) throws on non-zero exit, 'silent' returns it, 'ignore' reports exitCode null. */
  check?: CheckMode;
  /** Literal strings (or regexes) that end the wait early, e.g. a program's prompt. */
  expect?: Array<string | RegExp>;
  /** Prefix for the NonZeroExitCodeError message. */
  errorMsg?: string;
  /** On timeout, interrupt the command before throwing CommandTimeoutError. */
  interruptOnTimeout?: boolean;
}

export interface InteractiveOptions {
  expect?: Array<string | RegExp>;
  timeoutMs?: number;
}

export interface InterruptOptions {
  timeoutMs?: number;
  retries?: number;
  expect?: Array<string | RegExp>;
}

/** Mirrors SWE-ReX's BashObservation. */
export interface BashObservation {
  output: string;
  /** null: check 'ignore', an expect string matched (command still running), or no code could be read. */
  exitCode: number | null;
  /** The expect string that matched; '' when the shell prompt ended the wait. */
  expectString: string;
  failureReason: string;
}

// Marker waits that should be instant once the shell is at its prompt.
const PROMPT_SETTLE_MS = 5000;
const SYNC_ATTEMPT_MS = 1000;
const HANG_UP_JOBS_AND_EXIT =
  '{ __ms_j=$(builtin jobs -p); [ -n "$__ms_j" ] && { builtin kill -HUP $__ms_j; builtin kill -CONT $__ms_j; }; } 2>/dev/null; builtin exit';
// Kill the job just stopped with Ctrl-Z and wait (bounded) until bash has
// reaped it, so its "Killed" notice is printed now, not in the next run.
const KILL_STOPPED_JOB =
  '__ms_p=$(jobs -p %+ 2>/dev/null); kill -9 %+ 2>/dev/null; ' +
  'for __ms_i in {1..200}; do [ -n "$__ms_p" ] && kill -0 "$__ms_p" 2>/dev/null || break; sleep 0.01; done; ' +
  'wait "$__ms_p" 2>/dev/null; unset __ms_p __ms_i; ';

function toPattern(p: string | RegExp): Pattern {
  // Bound for incremental matching of user regexes (see expect.ts).
  return typeof p === 'string' ? p : { regex: p, maxLength: 4096 };
}

function patternText(p: string | RegExp): string {
  return typeof p === 'string' ? p : p.source;
}

export class ShellSession {
  /** Output of the startup files. */
  startupOutput = '';
  private readonly protocol = new ShellProtocol();
  private readonly expecter: Expecter;
  private queue: Promise<unknown> = Promise.resolve();
  private nextId = 1;
  private nextSync = 1;
  private closed = false;
  private exitInfo: PtyExitInfo | null = null;
  private closing: Promise<void> | null = null;
  private readonly exitWaiters: Array<() => void> = [];

  private constructor(
    private readonly channel: PtyChannel,
    private readonly options: ShellSessionOptions,
  ) {
    this.expecter = new Expecter(channel, options);
    channel.onExit((info) => {
      this.exitInfo = info;
      this.closed = true; // a shell that exited (e.g. `exit`) cannot run anything else
      for (const w of this.exitWaiters.splice(0)) w();
    });
  }

  static async start(channel: PtyChannel, options: ShellSessionOptions = {}): Promise<ShellSession> {
    const session = new ShellSession(channel, options);
    try {
      await session.initialize();
    } catch (e) {
      await session.close();
      throw e;
    }
    return session;
  }

  get isClosed(): boolean {
    return this.closed;
  }

  /** Run a command to completion (or until an expect string, or the timeout). */
  run(command: string, options: RunOptions = {}): Promise<BashObservation> {
    return this.enqueue(() => this.runNow(command, options));
  }

  /** Send a line to a running program and wait for an expect string or the shell prompt. No exit code (0). */
  runInteractive(text: string, options: InteractiveOptions = {}): Promise<BashObservation> {
    return this.enqueue(() => this.interactiveNow(text, options, false));
  }

  /** Send the line that ends an interactive program, wait for the shell prompt and turn echo back off. */
  quitInteractive(text: string, options: { timeoutMs?: number } = {}): Promise<BashObservation> {
    return this.enqueue(() => this.interactiveNow(text, options, true));
  }

  /**
   * Ctrl-C up to `retries` times, each time waiting `timeoutMs` for the
   * prompt; then Ctrl-Z and `kill -9 %+`. Queued like any other call, so it
   * is meant for after a CommandTimeoutError.
   */
  interrupt(options: InterruptOptions = {}): Promise<BashObservation> {
    return this.enqueue(() => this.interruptNow(options));
  }

  /** End the shell: `exit`, then SIGHUP, then SIGKILL. Idempotent. */
  close(): Promise<void> {
    this.closed = true;
    this.closing ??= this.shutdown();
    return this.closing;
  }

  // ---------------------------------------------------------------- internals

  private enqueue<T>(op: () => Promise<T>): Promise<T> {
    if (this.closed) return Promise.reject(this.closedError());
    const next = this.queue.then(() => {
      if (this.closed) throw this.closedError();
      return op();
    });
    this.queue = next.catch(() => {});
    return next;
  }

  private closedError(output = ''): SessionClosedError {
    const why = this.exitInfo
      ? `the shell exited (code ${this.exitInfo.exitCode}, signal ${this.exitInfo.signal})`
      : 'the session is closed';
    return new SessionClosedError(`shell session not available: ${why}`, { output });
  }

  private clean(raw: string): string {
    return this.protocol.scrub(cleanTerminalText(raw));
  }

  /** expect(), with a dead shell reported as SessionClosedError. */
  private async wait(patterns: Pattern[], timeoutMs?: number): Promise<ExpectMatch> {
    try {
      return await this.expecter.expect(patterns, timeoutMs);
    } catch (e) {
      if (e instanceof ChannelClosedError) {
        this.closed = true;
        throw this.closedError(this.clean(e.before));
      }
      throw e;
    }
  }

  private async initialize(): Promise<void> {
    const timeout = this.options.startupTimeoutMs ?? 5000;
    const deadline = Date.now() + timeout;
    const left = () => Math.max(0, deadline - Date.now());
    this.channel.write(this.protocol.startupLines(this.options).join('\n') + '\n');
    try {
      await this.wait([this.protocol.beginMarker()], left()); // drops the shell's own first prompt
      const ready = await this.wait([this.protocol.readyMarker()], left());
      await this.wait([this.protocol.promptFor(0)], left());
      this.startupOutput = this.clean(ready.before);
    } catch (e) {
      if (e instanceof ExpectTimeoutError) {
        const output = this.clean(e.before);
        throw new SessionNotInitializedError(`timeout after ${timeout / 1000} seconds while starting the shell session`, {
          output,
        });
      }
      throw e;
    }
  }

  private async runNow(command: string, o: RunOptions): Promise<BashObservation> {
    const check = o.check ?? 'raise';
    if (this.options.syntaxCheck !== false) await this.checkSyntax(command);

    const id = this.nextId++;
    const expects = o.expect ?? [];
    const timeoutMs = o.timeoutMs ?? this.options.defaultTimeoutMs;
    this.channel.write(this.protocol.commandLines(command, id).join('\n') + '\n');

    let m: ExpectMatch;
    try {
      m = await this.wait(
        [...expects.map(toPattern), this.protocol.endProbe(id), this.protocol.promptFor(id)],
        timeoutMs,
      );
    } catch (e) {
      if (e instanceof ExpectTimeoutError) return this.timedOut(command, timeoutMs, e.before, o.interruptOnTimeout);
      throw e;
    }
    let output = this.clean(m.before);

    if (m.index < expects.length) {
      // The command is still running (waiting at the expected text): no exit code yet.
      return { output, exitCode: null, expectString: patternText(expects[m.index]!), failureReason: '' };
    }

    let exitCode: number | null = null;
    let failureReason = '';
    if (m.index === expects.length) {
      exitCode = Number(m.groups[0]);
      // Job notices ("[1]+ Done ...") and background output land between probe and prompt.
      try {
        const p = await this.wait([this.protocol.promptFor(id)], PROMPT_SETTLE_MS);
        output += this.clean(p.before);
      } catch (e) {
        if (!(e instanceof ExpectTimeoutError)) throw e;
        failureReason = 'timeout while waiting for the prompt after the exit code';
        if (check === 'raise') throw new CommandTimeoutError(failureReason, output);
      }
    } else {
      failureReason =
        'the shell returned to its prompt without reporting an exit code ' +
        '(the command line was aborted, or stdout was redirected away from the terminal)';
    }

    if (check === 'ignore') return { output, exitCode: null, expectString: '', failureReason: '' };
    if (exitCode === null) {
      if (check === 'raise') throw new NoExitCodeError(failureReason, output);
      return { output, exitCode, expectString: '', failureReason };
    }
    if (check === 'raise' && exitCode !== 0) {
      let msg = `Command ${JSON.stringify(command)} failed with exit code ${exitCode}. Here is the output:\n${JSON.stringify(output)}`;
      if (o.errorMsg) msg = `${o.errorMsg}: ${msg}`;
      throw new NonZeroExitCodeError(msg, output, exitCode);
    }
    return { output, exitCode, expectString: '', failureReason };
  }

  private async checkSyntax(command: string): Promise<void> {
    const r = await checkBashSyntax(command, this.options.bashPath);
    if (r.ok) return;
    throw new BashIncorrectSyntaxError(
      `Error (exit code ${r.exitCode}) while checking bash command \n${JSON.stringify(command)}\n` +
        `---- Stderr ----\n${r.stderr}\n---- Stdout ----\n${r.stdout}`,
      r.stdout,
      r.stderr,
    );
  }

  /** The command keeps running (SWE-ReX semantics) unless `interruptOnTimeout`. */
  private async timedOut(command: string, timeoutMs: number | undefined, before: string, interrupt = false): Promise<never> {
    const msg = `timeout after ${(timeoutMs ?? 0) / 1000} seconds while running command ${JSON.stringify(command)}`;
    if (!interrupt) throw new CommandTimeoutError(msg, this.clean(before));
    let result: BashObservation;
    try {
      // The timed-out wait consumed nothing, so this output includes the command's.
      result = await this.interruptNow({});
    } catch (e) {
      if (e instanceof InterruptFailedError) throw new CommandTimeoutError(`${msg}; ${e.message}`, e.output);
      throw e;
    }
    throw new CommandTimeoutError(msg, result.output, true);
  }

  private async interactiveNow(text: string, o: InteractiveOptions, quit: boolean): Promise<BashObservation> {
    const expects = quit ? [] : (o.expect ?? []);
    this.channel.write(text + '\n');
    let m: ExpectMatch;
    try {
      m = await this.wait([...expects.map(toPattern), this.protocol.anyPrompt()], o.timeoutMs);
    } catch (e) {
      if (e instanceof ExpectTimeoutError) {
        throw new CommandTimeoutError(
          `timeout after ${(o.timeoutMs ?? 0) / 1000} seconds while running command ${JSON.stringify(text)}`,
          this.clean(e.before),
        );
      }
      throw e;
    }
    let output = this.clean(m.before).trim();
    // Programs with their own line editing may echo the line back.
    if (output.startsWith(text)) output = output.slice(text.length).trim();
    const atPrompt = m.index === expects.length;
    // The program may have left echo on; also resynchronise with the shell.
    if (quit && atPrompt) await this.sync('stty -echo 2>/dev/null; ');
    const expectString = atPrompt ? '' : patternText(expects[m.index]!);
    return { output, exitCode: 0, expectString, failureReason: '' };
  }

  private async interruptNow(o: InterruptOptions): Promise<BashObservation> {
    const timeoutMs = o.timeoutMs ?? 200;
    const retries = o.retries ?? 3;
    const expects = o.expect ?? [];
    const patterns = [...expects.map(toPattern), this.protocol.anyPrompt()];
    let output = '';
    // A command may have stopped the shell itself (kill -STOP $$): no
    // Ctrl-C reaches a stopped shell, so it is continued first.
    this.channel.kill('SIGCONT');
    for (let i = 0; i < retries; i++) {
      this.channel.write('\x03');
      try {
        const m = await this.wait(patterns, timeoutMs);
        output += this.clean(m.before);
        if (m.index < expects.length) {
          return { output: output.trim(), exitCode: 0, expectString: patternText(expects[m.index]!), failureReason: '' };
        }
        output += await this.sync();
        return { output: output.trim(), exitCode: 0, expectString: '', failureReason: '' };
      } catch (e) {
        if (!(e instanceof ExpectTimeoutError)) throw e;
      }
    }
    // Ctrl-C was ignored: stop the job, then kill it from the shell.
    this.channel.write('\x1a');
    try {
      const m = await this.wait([this.protocol.anyPrompt()], timeoutMs);
      output += this.clean(m.before);
      output += await this.sync(KILL_STOPPED_JOB);
    } catch (e) {
      if (!(e instanceof ExpectTimeoutError || e instanceof InterruptFailedError)) throw e;
      throw new InterruptFailedError('Failed to interrupt session', output + this.clean(this.expecter.peek()));
    }
    return { output: output.trim(), exitCode: 0, expectString: '', failureReason: '' };
  }

  /**
   * Type a sync line and read up to its marker and the prompt after it, so
   * nothing older is left unread. Retried: a Ctrl-C that reached an idle
   * readline can discard the first attempt while it is being typed.
   */
  private async sync(prefix = ''): Promise<string> {
    let output = '';
    for (let attempt = 0; attempt < 3; attempt++) {
      const k = this.nextSync++;
      this.channel.write(this.protocol.syncLine(k, prefix) + '\n');
      try {
        const m = await this.wait([this.protocol.syncMarker(k)], SYNC_ATTEMPT_MS);
        output += this.clean(m.before);
        const p = await this.wait([this.protocol.anyPrompt()], PROMPT_SETTLE_MS);
        return output + this.clean(p.before);
      } catch (e) {
        if (!(e instanceof ExpectTimeoutError)) throw e;
      }
    }
    throw new InterruptFailedError('shell did not answer a sync line', output + this.clean(this.expecter.peek()));
  }

  private async shutdown(): Promise<void> {
    const exited = () =>
      new Promise<boolean>((resolve) => {
        if (this.exitInfo) return resolve(true);
        this.exitWaiters.push(() => resolve(true));
      });
    const within = (ms: number) =>
      Promise.race([exited(), new Promise<boolean>((r) => setTimeout(() => r(false), ms).unref())]);
    // ^U clears a half-typed line. `exit` alone would leave background jobs
    // running (bash only forwards SIGHUP to its jobs when it gets SIGHUP
    // itself), and refuses to exit while jobs are stopped: hang them up first.
    if (!this.exitInfo) this.channel.write(`\x15${HANG_UP_JOBS_AND_EXIT}\n`);
    if (!(await within(500))) {
      this.channel.kill('SIGHUP');
      if (!(await within(500))) {
        this.channel.kill('SIGKILL');
        await within(2000);
      }
    }
    this.expecter.dispose();
  }
}
