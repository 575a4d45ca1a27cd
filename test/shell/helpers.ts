import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import type { PtyChannel, PtyExitInfo } from '../../lib/shell/pty.js';
import { ShellSession, type ShellSessionOptions } from '../../lib/shell/session.js';
import { shQuote } from '../../lib/shell/text.js';

/**
 * A session on a real pty (script(1)) running a bash without rc files, for
 * deterministic output; without readline, as Sandbox.shell runs it, unless
 * `readline` (a shell on a pty made elsewhere).
 */
export function startTestSession(options: ShellSessionOptions & { readline?: boolean } = {}): Promise<ShellSession> {
  const { readline, ...rest } = options;
  return ShellSession.start(scriptPty(['bash', ...(readline ? [] : ['--noediting']), '--norc', '--noprofile']), rest);
}

/**
 * A real pty without the sandbox: util-linux `script -qfec CMD /dev/null`
 * allocates a pty, runs CMD on it (via `$SHELL -c`) and relays the master
 * through its own stdin/stdout pipes. `-f` flushes every write (latency),
 * `-e` propagates the child's exit status, `-q` silences the banners and the
 * typescript goes to /dev/null. The terminal is 80x24, pexpect's default (a
 * fresh pty from script(1) is 0x0).
 */
function scriptPty(argv: readonly string[]): PtyChannel {
  // script runs the string with $SHELL -c; force /bin/sh because an
  // unprivileged user's SHELL may be nologin or unset.
  const inner = `stty cols 80 rows 24 2>/dev/null; exec ${argv.map(shQuote).join(' ')}`;
  const child = spawn('/usr/bin/script', ['-q', '-f', '-e', '-c', inner, '/dev/null'], {
    env: { ...process.env, TERM: 'xterm', SHELL: '/bin/sh' },
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
