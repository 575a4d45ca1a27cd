/** The CLI as users run it: the built entry point in a real Node process. */
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'vitest';

export const CLI = fileURLToPath(new URL('../../dist/lib/cli/main.js', import.meta.url));

export interface CliResult {
  status: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the CLI (or another copy of it, `script`) with `args`, to its end. */
export function cli(args: string[], opts: { env?: NodeJS.ProcessEnv; cwd?: string; timeout?: number; script?: string } = {}): CliResult {
  const r = spawnSync(process.execPath, [opts.script ?? CLI, ...args], { encoding: 'utf8', timeout: opts.timeout ?? 20_000, env: opts.env ?? process.env, ...(opts.cwd ? { cwd: opts.cwd } : {}) });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/**
 * An environment whose every default location (the store under
 * XDG_CACHE_HOME, the state directory, HOME) is inside `dir`: a command that
 * creates anything there shows up in `everything(dir)`.
 */
export function confinedEnv(dir: string, extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  return {
    PATH: process.env.PATH,
    HOME: join(dir, 'home'),
    XDG_CACHE_HOME: join(dir, 'cache'),
    MINISANDBOX_STATE_DIR: join(dir, 'state'),
    TMPDIR: join(dir, 'tmp'),
    ...extra,
  };
}

/** Every path under `dir`, relative to it. */
export function everything(dir: string): string[] {
  return readdirSync(dir, { recursive: true, encoding: 'utf8' }).sort();
}

/** A failure as the error boundary prints it: the exit code, one message line, no stack. */
export function expectError(r: CliResult, status: number, message: string): void {
  expect(r.status, r.stderr).toBe(status);
  expect(r.stderr).toContain(message);
  expect(r.stderr).not.toMatch(/^\s+at /m);
  expect(r.stderr.trimEnd().split('\n').at(-1)).toMatch(/^minisandbox[ :]/);
}
