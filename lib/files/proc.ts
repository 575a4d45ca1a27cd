import { spawn, type SpawnOptions } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { FileError } from './errors.js';

export interface RunResult {
  stdout: string;
  stderr: string;
}

/**
 * Run a command to completion and collect its output. Rejects with the
 * command line, exit status and stderr so the caller's error says why.
 */
export function run(
  cmd: string,
  args: readonly string[],
  opts: SpawnOptions & { what?: string; input?: string } = {},
): Promise<RunResult> {
  const { what, input, ...spawnOpts } = opts;
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { ...spawnOpts, stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
    // A child that exits without reading its input makes our write fail
    // with EPIPE; its exit status is what matters.
    child.stdin?.on('error', () => undefined);
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout?.on('data', (b: Buffer) => out.push(b));
    child.stderr?.on('data', (b: Buffer) => err.push(b));
    child.on('error', (e) =>
      reject(new FileError(`${what ?? cmd}: cannot run ${cmd}: ${e.message}`, { cause: e })),
    );
    child.on('close', (code, signal) => {
      const stdout = Buffer.concat(out).toString('utf8');
      const stderr = Buffer.concat(err).toString('utf8');
      if (code === 0) resolve({ stdout, stderr });
      else
        reject(
          new FileError(
            `${what ?? cmd}: ${cmd} ${args.join(' ')} failed (${signal ?? `exit ${code}`}): ${stderr.trim()}`,
          ),
        );
    });
    if (input !== undefined) child.stdin?.end(input);
  });
}

/**
 * Start time of a process in clock ticks since boot (field 22 of
 * /proc/PID/stat), or undefined if the process does not exist. A pid plus
 * its start time identifies a process even after the pid is reused.
 */
function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // comm (field 2) may contain spaces and parentheses: parse after the last ')'.
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // rest[0] is field 3 (state); field 22 is rest[19].
    return rest[19];
  } catch {
    return undefined;
  }
}

/** True if `pid` is alive and is still the process that started at `startTime`. */
export function processIsAlive(pid: number, startTime: string): boolean {
  const now = processStartTime(pid);
  return now !== undefined && now === startTime;
}

let selfStart: string | undefined;
/** This process's start time (cached). */
export function selfStartTime(): string {
  selfStart ??= processStartTime(process.pid) ?? '0';
  return selfStart;
}
