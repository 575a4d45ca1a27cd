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
}

/** Run a command to completion, capturing output; never throws for a non-zero exit. */
export function exec(
  file: string,
  args: readonly string[],
  opts: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {},
): Promise<ExecResult> {
  return new Promise((resolve) => {
    const child = spawn(file, args, { stdio: ['ignore', 'pipe', 'pipe'], env: opts.env ?? process.env });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    const timer = opts.timeoutMs ? setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs) : undefined;
    // A missing binary is reported like a failed command, so callers need one code path.
    child.on('error', (err) => {
      clearTimeout(timer);
      resolve({ code: 127, signal: null, stdout, stderr: stderr + String(err) });
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr });
    });
  });
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
