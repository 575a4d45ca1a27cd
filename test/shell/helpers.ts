import { spawnScriptPty } from '../../lib/shell/pty.js';
import { ShellSession, type ShellSessionOptions } from '../../lib/shell/session.js';

/** A session on a real pty (script(1)) running a bash without rc files, for deterministic output. */
export function startTestSession(options: ShellSessionOptions = {}): Promise<ShellSession> {
  const channel = spawnScriptPty({ command: ['bash', '--norc', '--noprofile'], env: { ...process.env, TERM: 'xterm' } });
  return ShellSession.start(channel, options);
}
