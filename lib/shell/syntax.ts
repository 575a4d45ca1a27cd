/**
 * Syntax check of a command before it is typed into the session, as SWE-ReX
 * does with `bash -n`. It runs on the host (parsing needs no sandbox): a
 * command that does not parse would otherwise leave the interactive shell
 * waiting for more input (an unclosed quote), which only a timeout reveals.
 *
 * Spawning `bash -n` per command costs several milliseconds, more than the
 * rest of an agent's step, so one long-lived checker bash per bash path
 * parses the commands (see CHECKER_SCRIPT). It answers only "parses
 * cleanly"; anything else (an error, a warning) is answered by a spawned
 * `bash -n`, so the messages, exit codes and `ok` of failures are bash's
 * own, whatever its version or locale. Failures are rare in a rollout.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import type { Socket } from 'node:net';

export interface SyntaxCheckResult {
  ok: boolean;
  exitCode: number | null;
  stdout: string;
  stderr: string;
}

const CLEAN: SyntaxCheckResult = { ok: true, exitCode: 0, stdout: '', stderr: '' };

// Words that can make an otherwise plain command line fail to parse.
const RESERVED = new Set(
  'if then else elif fi case esac for select while until do done in function time coproc { } ! [[ ]]'.split(' '),
);

/** A check that takes longer than this kills the checker: parsing is never that slow. */
const CHECK_TIMEOUT_MS = 30_000;

/**
 * True when the text cannot contain a syntax error: one line of plain words
 * (no quotes, operators, expansions or reserved words), which needs no round
 * trip to bash at all.
 */
export function isTriviallyValid(command: string): boolean {
  if (!/^[A-Za-z0-9_./=:,@%+ -]*$/.test(command)) return false;
  return command.split(' ').every((w) => !RESERVED.has(w));
}

export async function checkBashSyntax(command: string, bashPath = 'bash'): Promise<SyntaxCheckResult> {
  if (isTriviallyValid(command)) return CLEAN;
  const text = checkedText(command);
  if (await checkerFor(bashPath).parsesCleanly(text)) return CLEAN;
  return spawnBashN(text, bashPath);
}

/** The persistent checker's answer alone: true when bash parses the command without any message. */
export function parsesCleanly(command: string, bashPath = 'bash'): Promise<boolean> {
  return checkerFor(bashPath).parsesCleanly(checkedText(command));
}

/**
 * What is checked is what will run: the session's ansiCQuote drops NUL bytes
 * (bash strings cannot hold them), and bash reads the command as a line.
 */
function checkedText(command: string): Buffer {
  const text = command.replace(/\0/g, '');
  return Buffer.from(text.endsWith('\n') ? text : text + '\n', 'utf8');
}

/** `bash -O extglob -n` on the text, spawned: the authoritative answer, and the benchmark's peer. */
export function spawnBashN(text: Buffer | string, bashPath = 'bash'): Promise<SyntaxCheckResult> {
  return new Promise((resolve, reject) => {
    // The script comes on stdin, so no heredoc delimiter can clash with it.
    // extglob is on in most interactive shells (bash-completion enables it),
    // so accept its patterns rather than report a false syntax error.
    const child = spawn(bashPath, ['-O', 'extglob', '-n'], { stdio: ['pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (d: Buffer) => out.push(d));
    child.stderr.on('data', (d: Buffer) => err.push(d));
    child.stdin.on('error', () => {}); // bash may exit before reading everything
    child.on('error', reject);
    child.on('close', (code) => {
      resolve({
        ok: code === 0,
        exitCode: code,
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
      });
    });
    child.stdin.end(text);
  });
}

/**
 * The checker: a non-interactive bash that loops over requests on stdin (a
 * decimal byte count line, then the text). Its first line is a random nonce
 * that no command can know: it comes on stdin (not in argv or the
 * environment, which /proc shows), the commands never run, and only their
 * parse errors reach us.
 *
 * Each request is checked by a subshell forked while the checker is idle
 * (after the previous answer), so neither the fork nor the exit of that
 * subshell (each ~1 ms on a loaded VM) is on the path of a check that comes
 * while the checker is idle, as an agent's next command does. (Checks back
 * to back wait for the previous subshell's exit and the next fork.) The
 * subshell evals CHILD, whose lines run one at a time:
 * - a throwaway parse and run of `:`: the subshell's first writes to memory
 *   it shares with the checker copy pages (copy-on-write faults, slow on a
 *   VM), and this takes most of them before the request comes, not after;
 * - it reads the request (LC_ALL=C, so that `read -N` counts bytes; -N on a
 *   pipe reads in blocks, a 100 KB command is a few reads);
 * - `set -e`, then an inner eval of "set -n", a newline, and the command. In
 *   a non-interactive bash, `set -n` makes every later command parse-only
 *   (evalstring.c disposes each parsed command unexecuted, and
 *   execute_command returns at once); the newline makes it a command of its
 *   own, executed before any of the command's text is parsed.
 * - an empty line: a command ending in a backslash-newline continues into
 *   the outer eval's next line (bash keeps that state across evals);
 * - a line that is a syntax error naming the nonce. The outer eval parses it
 *   only after the inner eval returned 0, that is, when the whole command
 *   parsed; any parse error before it ends the subshell first (under `set -e`
 *   bash exits at its first parser message, and a failed eval exits too).
 * So the subshell's output is exactly that error, SENTINEL, when the command
 * parses cleanly, and its arrival is the answer, before the subshell exits.
 * Output that differs (an error, a warning before the sentinel) means "ask
 * bash -n". After the subshell exits, the checker prints a done line with
 * its status, which ends the request's output. Exit 125 is the subshell's
 * way of saying that stdin ended: Node is gone, so the checker exits.
 */
const CHILD = String.raw`builtin eval $': "warm" $up\n: up'
IFS= builtin read -r n || builtin exit 125
cmd=
if (( n > 0 )); then IFS= builtin read -r -N "$n" cmd || builtin exit 125; fi
builtin set -e
builtin eval $'builtin set -n\n'"$cmd"

{ :; } __MSCHK_NONCE_parsed`;

const CHECKER_SCRIPT = String.raw`builtin unset TMOUT
IFS= builtin read -r nonce || builtin exit 0
child=${shSingleQuote(CHILD).replace('NONCE', `'"$nonce"'`)}
while :; do
  ( builtin eval "$child" ) 2>&1
  st=$?
  (( st == 125 )) && break
  builtin printf '\n__MSCHK_%s_done %s\n' "$nonce" "$st"
done`;

function shSingleQuote(text: string): string {
  return `'${text.replace(/'/g, `'\\''`)}'`;
}

/**
 * The checker's environment is Node's (as `bash -n`'s was), except what
 * would run code or change the loop: BASH_ENV (a non-interactive bash
 * sources it at startup; ENV likewise in posix mode) and exported functions
 * (they could shadow the loop's own words). `--norc --noprofile` keep rc
 * files out should bash ever be started as a login or interactive shell.
 */
function checkerEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, LC_ALL: 'C' };
  delete env.BASH_ENV;
  delete env.ENV;
  for (const name of Object.keys(env)) if (name.startsWith('BASH_FUNC_')) delete env[name];
  return env;
}

interface Job {
  text: Buffer;
  resolve: (clean: boolean) => void;
  reject: (error: Error) => void;
  settled: boolean;
  retried: boolean;
}

/**
 * Probe sent first to every checker process: its output is that process's
 * SENTINEL (bash's own wording of the sentinel error), and `exit 7` must not
 * run (the done status would be 7).
 */
const PROBE = Buffer.from('exit 7\n');

/** One checker process and its FIFO of checks. */
class Process {
  readonly nonce = randomBytes(16).toString('hex');
  readonly child: ChildProcess;
  private readonly doneMarker: string;
  private out = '';
  private stderr = '';
  private sentinel: string | null = null;
  private active: Job | null = null;
  private timer: NodeJS.Timeout | null = null;
  dead = false;

  constructor(
    private readonly bashPath: string,
    private readonly queue: Job[],
    private readonly onDeath: (p: Process) => void,
  ) {
    this.doneMarker = `\n__MSCHK_${this.nonce}_done `;
    this.child = spawn(bashPath, ['--norc', '--noprofile', '-O', 'extglob', '-c', CHECKER_SCRIPT, bashPath], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: checkerEnv(),
      detached: true, // its own process group, so that a kill also ends the subshell it forked
    });
    this.child.stdin!.on('error', () => {}); // reported by 'close'
    this.child.stdout!.setEncoding('latin1'); // byte for byte: the sentinel is compared exactly
    this.child.stdout!.on('data', (d: string) => this.onData(d));
    this.child.stderr!.setEncoding('utf8');
    this.child.stderr!.on('data', (d: string) => (this.stderr = (this.stderr + d).slice(-2000)));
    this.child.on('error', (e) => this.die(e));
    // On 'exit', not 'close': a subshell it had forked may hold the pipes open.
    this.child.on('exit', (code, signal) => this.die(null, code, signal));
    this.child.stdin!.write(`${this.nonce}\n`);
    const probe: Job = {
      text: PROBE,
      settled: false,
      retried: true,
      resolve: () => {},
      reject: (e) => this.die(e),
    };
    this.start(probe);
  }

  get pid(): number | undefined {
    return this.child.pid;
  }

  /** Takes the next queued check, if the process is free. */
  pump(): void {
    if (this.dead || this.active || this.sentinel === null) return;
    const job = this.queue.shift();
    if (job) this.start(job);
    else this.setRef(false);
  }

  private start(job: Job): void {
    this.active = job;
    this.setRef(true);
    this.timer = setTimeout(() => {
      this.fail(job, new Error(`bash syntax check (${this.bashPath}) took over ${CHECK_TIMEOUT_MS / 1000} s; the checker was killed`));
      this.kill();
    }, CHECK_TIMEOUT_MS);
    this.child.stdin!.write(`${job.text.length}\n`);
    this.child.stdin!.write(job.text);
  }

  private onData(data: string): void {
    if (this.dead) return;
    this.out += data;
    const job = this.active;
    if (!job) return; // nothing was asked: ignore
    const at = this.out.indexOf(this.doneMarker);
    if (at >= 0) {
      const end = this.out.indexOf('\n', at + this.doneMarker.length);
      if (end < 0) return;
      const output = this.out.slice(0, at);
      const status = Number(this.out.slice(at + this.doneMarker.length, end));
      this.out = this.out.slice(end + 1);
      this.finish(job, output, status);
      return;
    }
    // Answer as soon as the output is known to be, or not to be, the
    // sentinel alone; the subshell's exit and the done line come later.
    if (this.sentinel === null || job.settled) return;
    if (this.out === this.sentinel) this.settle(job, true);
    else if (!this.sentinel.startsWith(this.out) && !this.out.startsWith(this.sentinel)) this.settle(job, false);
  }

  private finish(job: Job, output: string, status: number): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.active = null;
    if (job.text === PROBE) {
      if (status === 7 || !output.includes(`__MSCHK_${this.nonce}_parsed`)) {
        this.die(new Error(`cannot serve as the syntax checker (probe status ${status}, output ${JSON.stringify(output)})`));
        return;
      }
      this.sentinel = output;
    } else if (!job.settled) {
      this.settle(job, output === this.sentinel);
    }
    this.pump();
  }

  private settle(job: Job, clean: boolean): void {
    job.settled = true;
    job.resolve(clean);
  }

  private fail(job: Job, error: Error): void {
    if (job.settled) return;
    job.settled = true;
    job.reject(error);
  }

  /**
   * The process is gone (or unusable). A check it had taken and not answered
   * is retried once on a fresh checker: its death was not the command's
   * doing (parsing happens in a subshell), but a second death fails it. A
   * process that dies before its probe answered cannot work at all (not bash,
   * a bad path): what waits fails, rather than start it again and again.
   */
  private die(error: Error | null, code?: number | null, signal?: NodeJS.Signals | null): void {
    if (this.dead) return;
    this.dead = true;
    if (this.timer) clearTimeout(this.timer);
    this.kill();
    const job = this.active;
    this.active = null;
    const stderr = this.stderr.trim();
    const why = new Error(
      `bash syntax checker (${this.bashPath}) ${error ? error.message : `exited (${signal ?? `code ${code}`})`}${stderr ? `: ${stderr}` : ''}`,
    );
    if (this.sentinel === null) {
      for (const queued of this.queue.splice(0)) this.fail(queued, why);
    } else if (job && !job.settled) {
      if (job.retried) this.fail(job, why);
      else {
        job.retried = true;
        this.queue.unshift(job);
      }
    }
    this.onDeath(this);
  }

  kill(): void {
    if (this.child.pid === undefined || this.child.exitCode !== null || this.child.signalCode !== null) return;
    try {
      process.kill(-this.child.pid, 'SIGKILL');
    } catch {
      this.child.kill('SIGKILL');
    }
  }

  /** Ref'd only while a check is pending: an idle checker never keeps Node alive. */
  private setRef(on: boolean): void {
    for (const h of [this.child, this.child.stdin, this.child.stdout, this.child.stderr] as (ChildProcess | Socket | null)[]) {
      if (h) {
        if (on) h.ref();
        else h.unref();
      }
    }
  }
}

/** The checks of one bash path: a FIFO served by one checker process at a time. */
class Checker {
  private readonly queue: Job[] = [];
  private process: Process | null = null;

  constructor(private readonly bashPath: string) {}

  get pid(): number | undefined {
    return this.process?.pid;
  }

  kill(): void {
    this.process?.kill();
  }

  parsesCleanly(text: Buffer): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.queue.push({ text, resolve, reject, settled: false, retried: false });
      this.ensureProcess().pump();
    });
  }

  private ensureProcess(): Process {
    if (!this.process || this.process.dead) {
      this.process = new Process(this.bashPath, this.queue, (p) => {
        if (this.process !== p) return;
        this.process = null;
        if (this.queue.length) this.ensureProcess().pump();
      });
    }
    return this.process;
  }
}

const checkers = new Map<string, Checker>();

function checkerFor(bashPath: string): Checker {
  // Killed when Node exits: a checker would otherwise end only when it
  // reads the end of its stdin, a moment after Node is gone, and whoever
  // waited for Node's exit (a test, a supervisor) could still see it.
  if (!checkers.size) process.once('exit', () => checkers.forEach((c) => c.kill()));
  let c = checkers.get(bashPath);
  if (!c) checkers.set(bashPath, (c = new Checker(bashPath)));
  return c;
}

/** The pid of the checker process for a bash path, if one runs (for tests and diagnostics). */
export function syntaxCheckerPid(bashPath = 'bash'): number | undefined {
  return checkers.get(bashPath)?.pid;
}
