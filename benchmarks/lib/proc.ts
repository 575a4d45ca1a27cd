/**
 * Host command helpers for the benchmarks' setup steps (finding and
 * installing tools, talking to the docker CLI). Not used inside timed loops.
 */
import { spawn } from 'node:child_process';
import { accessSync, constants } from 'node:fs';
import { delimiter, join } from 'node:path';

export interface ExecResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  /** Killed because it outran timeoutMs. */
  timedOut?: boolean;
}

export interface ExecOptions {
  /** SIGKILL the command after this long. */
  timeoutMs?: number;
  env?: NodeJS.ProcessEnv;
  /** Written to the command's stdin (otherwise stdin is /dev/null). */
  input?: string;
  /** SIGKILL the command when this aborts (an interrupted run must not leave e.g. a `docker save` writing). */
  signal?: AbortSignal;
}

/** Run a command to completion, capturing output; never throws for a non-zero exit. */
export function exec(file: string, args: readonly string[], opts: ExecOptions = {}): Promise<ExecResult> {
  return new Promise((resolve) => {
    const child = spawn(file, args, { stdio: [opts.input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'], env: opts.env ?? process.env });
    let stdout = '';
    let stderr = '';
    let timedOut = false;
    // Both are pipes (stdio above); only stdin may be absent.
    child.stdout!.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = opts.timeoutMs
      ? setTimeout(() => {
          timedOut = true;
          child.kill('SIGKILL');
        }, opts.timeoutMs)
      : undefined;
    const kill = () => child.kill('SIGKILL');
    if (opts.signal?.aborted) kill();
    else opts.signal?.addEventListener('abort', kill, { once: true });
    const done = (r: ExecResult) => {
      clearTimeout(timer);
      opts.signal?.removeEventListener('abort', kill);
      resolve(timedOut ? { ...r, timedOut } : r);
    };
    // A missing binary is reported like a failed command, so callers need one code path.
    child.on('error', (err) => done({ code: 127, signal: null, stdout, stderr: stderr + String(err) }));
    child.on('close', (code, signal) => done({ code, signal, stdout, stderr }));
    if (child.stdin) {
      // A command that exits without reading its input must not fail the write.
      child.stdin.on('error', () => undefined);
      child.stdin.end(opts.input);
    }
  });
}

/** exec, throwing on anything but exit 0: the error names `what` (default: the command) and gives the end of stderr. */
export async function execOk(file: string, args: readonly string[], opts: ExecOptions & { what?: string } = {}): Promise<ExecResult> {
  const r = await exec(file, args, opts);
  if (r.code === 0) return r;
  const how = r.timedOut ? `timed out after ${opts.timeoutMs} ms` : r.signal ? `killed by ${r.signal}` : `exit ${r.code}`;
  throw new Error(`${opts.what ?? [file, ...args].join(' ')} failed (${how}): ${lastLines(r.stderr || r.stdout, 3)}`);
}

export function isExecutable(path: string): boolean {
  try {
    accessSync(path, constants.X_OK);
    return true;
  } catch {
    return false;
  }
}

/** Absolute path of an executable found in PATH (plus the sbin dirs root has), or undefined. */
export function which(name: string): string | undefined {
  const dirs = [...(process.env.PATH ?? '').split(delimiter), '/usr/local/sbin', '/usr/sbin', '/sbin'];
  return dirs.filter(Boolean).map((dir) => join(dir, name)).find(isExecutable);
}

/**
 * apt-get install, refreshing the package lists first (a fresh VM has none).
 * Returns an error message, or undefined on success.
 */
export async function aptInstall(packages: readonly string[], log: (msg: string) => void): Promise<string | undefined> {
  if (!which('apt-get')) return 'apt-get not available';
  if (process.getuid?.() !== 0) return 'not root: cannot apt-get install';
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  log(`apt-get install -y ${packages.join(' ')} ...`);
  const update = await exec('apt-get', ['update', '-q'], { env, timeoutMs: 300_000 });
  if (update.code !== 0) return `apt-get update failed: ${lastLines(update.stderr)}`;
  const install = await exec('apt-get', ['install', '-y', '-q', ...packages], { env, timeoutMs: 900_000 });
  if (install.code !== 0) return `apt-get install failed: ${lastLines(install.stderr || install.stdout)}`;
  return undefined;
}

export function lastLines(text: string, n = 5): string {
  return text.trim().split('\n').slice(-n).join('\n');
}
