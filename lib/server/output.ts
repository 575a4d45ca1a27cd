/**
 * /execute's command with bounded output. Each stream keeps its first and
 * last maxOutputBytes/2 bytes and only counts the middle (the shell
 * session's rule, with its marker), so a flood costs the server a fixed
 * amount of memory. The command is not killed at the cap, unlike execa's
 * maxBuffer: a long test run still ends by itself, and its exit code and
 * its last lines (the summary an agent or a log parser reads) survive.
 */
import type { ExitInfo, Sandbox } from '../sandbox/index.js';
import { BoundedBuffer, truncationMarker } from '../shell/index.js';
import { pyDecode } from './python.js';

/**
 * How long output may still arrive after the command has exited; the same
 * grace as Sandbox#exec, for the same reason: a background process the
 * command left may hold the pipes open forever.
 */
const AFTER_EXIT_GRACE_MS = 50;

export interface BoundedExecResult extends ExitInfo {
  stdout: BoundedBuffer;
  stderr: BoundedBuffer;
  timedOut: boolean;
}

function drain(stream: NodeJS.ReadableStream | null, into: BoundedBuffer): Promise<void> {
  if (!stream) return Promise.resolve();
  return new Promise((resolve) => {
    stream.on('data', (chunk: Buffer) => into.append(chunk));
    stream.on('error', () => {});
    stream.on('close', () => resolve());
  });
}

/** Runs `argv` in the sandbox with stdin on /dev/null. Rejects as Sandbox#exec does (ExecError, SetupError). */
export async function execBounded(
  sandbox: Sandbox,
  argv: string[],
  opts: { cwd?: string; timeout?: number; maxOutputBytes: number },
): Promise<BoundedExecResult> {
  const proc = sandbox.spawn(argv, { cwd: opts.cwd, timeout: opts.timeout, stdin: 'ignore' });
  const stdout = new BoundedBuffer({ maxOutputBytes: opts.maxOutputBytes });
  const stderr = new BoundedBuffer({ maxOutputBytes: opts.maxOutputBytes });
  const streams = Promise.all([drain(proc.stdout, stdout), drain(proc.stderr, stderr)]);
  const exit = await proc.exited;
  const settled = await Promise.race([streams.then(() => true), new Promise<false>((r) => setTimeout(r, AFTER_EXIT_GRACE_MS, false))]);
  if (!settled) {
    proc.stdout?.destroy();
    proc.stderr?.destroy();
  }
  await streams;
  return { ...exit, stdout, stderr, timedOut: proc.timedOut };
}

/** A stream as /execute returns it: UTF-8 with backslashreplace, the marker where the middle was cut. */
export function decodeKept(buffer: BoundedBuffer): string {
  const { head, dropped, tail } = buffer.kept();
  const text = pyDecode(head, 'utf-8', 'backslashreplace');
  return dropped === 0 ? text : text + truncationMarker(dropped) + pyDecode(tail, 'utf-8', 'backslashreplace');
}
