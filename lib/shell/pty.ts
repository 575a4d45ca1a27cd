/**
 * A duplex byte channel to the master side of a pseudo-terminal.
 *
 * The shell session only needs this much, so it works the same on top of the
 * native sandbox spawner (which hands over a pty master) and on top of the
 * `script(1)` fallback below (used by the tests and on hosts without the addon).
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';

export interface PtyExitInfo {
  exitCode: number | null;
  signal: string | null;
}

export interface PtyChannel {
  /** Bytes typed into the terminal (control characters such as \x03 included). */
  write(data: string | Buffer): void;
  /** Terminal output; returns an unsubscribe function. */
  onData(listener: (chunk: Buffer) => void): () => void;
  /** Called once when the process on the pty is gone (immediately if it already is). */
  onExit(listener: (info: PtyExitInfo) => void): void;
  kill(signal?: NodeJS.Signals): void;
  resize?(cols: number, rows: number): void;
}

export interface ScriptPtyOptions {
  /** Command run on the pty: a shell string, or argv (quoted for /bin/sh). Default: `bash` like SWE-ReX. */
  command?: string | readonly string[];
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  /** Initial terminal size; pexpect's defaults. A fresh pty from script(1) is 0x0 otherwise. */
  cols?: number;
  rows?: number;
  /** util-linux script binary. */
  scriptPath?: string;
}

/** Quote one word for POSIX sh. */
export function shQuote(word: string): string {
  if (/^[A-Za-z0-9_./=:@%+-]+$/.test(word)) return word;
  return `'${word.replace(/'/g, `'\\''`)}'`;
}

/**
 * Get a real pty without native code: util-linux `script -qfec CMD /dev/null`
 * allocates a pty, runs CMD on it (via `$SHELL -c`) and relays the master
 * through its own stdin/stdout pipes. `-f` flushes every write (latency),
 * `-e` propagates the child's exit status, `-q` silences the banners and the
 * typescript goes to /dev/null.
 */
export function spawnScriptPty(options: ScriptPtyOptions = {}): PtyChannel {
  const command = options.command ?? 'bash';
  const cmd = typeof command === 'string' ? command : command.map(shQuote).join(' ');
  const cols = options.cols ?? 80;
  const rows = options.rows ?? 24;
  // script runs the string with $SHELL -c; force /bin/sh because an
  // unprivileged user's SHELL may be nologin or unset.
  const inner = `stty cols ${cols} rows ${rows} 2>/dev/null; exec ${cmd}`;
  const child = spawn(options.scriptPath ?? '/usr/bin/script', ['-q', '-f', '-e', '-c', inner, '/dev/null'], {
    cwd: options.cwd,
    env: { ...(options.env ?? process.env), SHELL: '/bin/sh' },
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  return new ChildProcessPty(child);
}

class ChildProcessPty implements PtyChannel {
  private exitInfo: PtyExitInfo | null = null;
  private readonly exitListeners: Array<(info: PtyExitInfo) => void> = [];
  /** script's own diagnostics (not the pty's output), kept for debugging. */
  stderr = '';

  constructor(private readonly child: ChildProcessWithoutNullStreams) {
    // Writing after the process died raises EPIPE asynchronously; the exit
    // listener is the place that reports it, so swallow stream errors here.
    child.stdin.on('error', () => {});
    child.stdout.on('error', () => {});
    child.stderr.on('data', (d: Buffer) => {
      if (this.stderr.length < 64 * 1024) this.stderr += d.toString('utf8');
    });
    // 'close' (not 'exit') so that all output has been delivered first.
    const done = (code: number | null, signal: NodeJS.Signals | null) => {
      if (this.exitInfo) return;
      this.exitInfo = { exitCode: code, signal };
      for (const l of this.exitListeners.splice(0)) l(this.exitInfo);
    };
    child.on('close', done);
    child.on('error', () => done(null, null));
  }

  write(data: string | Buffer): void {
    if (this.exitInfo || this.child.stdin.destroyed) return;
    this.child.stdin.write(data);
  }

  onData(listener: (chunk: Buffer) => void): () => void {
    this.child.stdout.on('data', listener);
    return () => this.child.stdout.off('data', listener);
  }

  onExit(listener: (info: PtyExitInfo) => void): void {
    if (this.exitInfo) queueMicrotask(() => listener(this.exitInfo!));
    else this.exitListeners.push(listener);
  }

  kill(signal: NodeJS.Signals = 'SIGHUP'): void {
    // Killing script closes the master, so the shell gets SIGHUP from the tty.
    if (!this.exitInfo) this.child.kill(signal);
  }
}
