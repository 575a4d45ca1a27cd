/** Shared helpers for the SWE tests: real interpreters, real processes. */
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { findPython, pythonSearchPath, type BasePython } from '../../lib/env/python.js';

/** Python 3.11 with pytest (what the demo tasks ask for), else any Python with pytest. */
export const pytestPython: BasePython | undefined =
  findPython({ version: '3.11', modules: ['pytest'] }) ?? findPython({ modules: ['pytest'] });

/** Any Python 3 for unittest, preferring 3.11+ output format. */
export const unittestPython: BasePython | undefined = findPython({ version: '3.11' }) ?? findPython();

/** A pre-3.11 Python, whose unittest output uses the older description form. */
export const oldUnittestPython: BasePython | undefined = ['3.10', '3.9', '3.8'].reduce<
  BasePython | undefined
>((found, version) => found ?? findPython({ version }), undefined);

export const NO_PYTEST_REASON = `no Python interpreter with pytest found (looked in ${pythonSearchPath().join(', ')})`;

export interface RunResult {
  status: number | null;
  /** stdout and stderr, interleaved as written. */
  output: string;
}

/**
 * Runs a command with stderr merged into stdout (like \`2>&1\` in an eval
 * script), so the output interleaves exactly as a real log would.
 */
export function run(command: string, args: string[], options: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number }): RunResult {
  const result = spawnSync('/bin/sh', ['-c', 'exec "$0" "$@" 2>&1', command, ...args], {
    cwd: options.cwd,
    env: { ...process.env, ...options.env },
    encoding: 'utf8',
    timeout: options.timeoutMs ?? 120_000,
    maxBuffer: 64 * 1024 * 1024,
  });
  if (result.error) throw new Error(`${command} ${args.join(' ')} failed to run in ${options.cwd}: ${result.error.message}`);
  return { status: result.status, output: result.stdout };
}

export function makeTempDir(prefix: string): string {
  return mkdtempSync(join(tmpdir(), `minisandbox-swe-${prefix}-`));
}

export function removeDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}

/**
 * A directory whose `python` is `interpreter`, to put first on PATH so that
 * a task's literal test_cmd ("python -m pytest ...") runs that interpreter.
 */
export function pythonShimDir(parent: string, interpreter: string): string {
  const bin = join(parent, 'bin');
  mkdirSync(bin, { recursive: true });
  symlinkSync(interpreter, join(bin, 'python'));
  return bin;
}

/** Environment for running Python tests reproducibly (no bytecode files, unbuffered so interleaving is real). */
export function pythonEnv(extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  return { PYTHONDONTWRITEBYTECODE: '1', PYTHONUNBUFFERED: '1', PYTHONHASHSEED: '0', PIP_NO_INDEX: '1', ...extra };
}
