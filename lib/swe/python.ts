/**
 * Locating a Python interpreter for a task's `python` version without a
 * network or a package manager: pyenv installs first (that is how the hosts
 * provide several versions side by side), then PATH. Every candidate is
 * actually run, because a path can exist yet be unreadable to the current
 * user (e.g. /root/.pyenv when tests run unprivileged) or lack a module.
 */
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';

export interface FindPythonOptions {
  /** "3.11" or "3.11.7"; any version when absent. */
  version?: string;
  /** Modules that must import, e.g. ["pytest"]. */
  modules?: string[];
  /** Environment to read PYENV_ROOT / PATH from (default process.env). */
  env?: NodeJS.ProcessEnv;
}

export interface PythonInterpreter {
  path: string;
  /** Full version, e.g. "3.11.7". */
  version: string;
}

function pyenvRoots(env: NodeJS.ProcessEnv): string[] {
  const roots = [env.PYENV_ROOT, join(homedir(), '.pyenv'), '/root/.pyenv', '/usr/local/pyenv', '/opt/pyenv'];
  return [...new Set(roots.filter((r): r is string => !!r))];
}

function listDir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return []; // missing or unreadable: just not a source of candidates
  }
}

function matchesVersion(full: string, wanted: string | undefined): boolean {
  return wanted === undefined || full === wanted || full.startsWith(`${wanted}.`);
}

/** Candidate interpreter paths, most specific first. */
export function pythonCandidates(options: FindPythonOptions = {}): string[] {
  const env = options.env ?? process.env;
  const candidates: string[] = [];
  for (const root of pyenvRoots(env)) {
    const versions = listDir(join(root, 'versions'))
      .filter((v) => /^\d+\.\d+/.test(v) && matchesVersion(v, options.version))
      .sort((a, b) => b.localeCompare(a, 'en', { numeric: true }));
    for (const v of versions) candidates.push(join(root, 'versions', v, 'bin', 'python'));
  }
  const names = options.version ? [`python${options.version}`, 'python3', 'python'] : ['python3', 'python'];
  for (const dir of (env.PATH ?? '').split(delimiter).filter(Boolean)) {
    for (const name of names) candidates.push(join(dir, name));
  }
  return [...new Set(candidates)];
}

/** Runs `path` to learn its version and check modules; undefined if unusable. */
export function probePython(path: string, modules: string[] = []): PythonInterpreter | undefined {
  const imports = modules.map((m) => `import ${m}`).join('; ');
  const script = `${imports}${imports ? '; ' : ''}import sys; print('%d.%d.%d' % sys.version_info[:3])`;
  const run = spawnSync(path, ['-c', script], { encoding: 'utf8', timeout: 20_000 });
  if (run.status !== 0 || run.error) return undefined;
  const version = run.stdout.trim();
  return /^\d+\.\d+\.\d+$/.test(version) ? { path, version } : undefined;
}

/** First working interpreter matching the options, or undefined. */
export function findPython(options: FindPythonOptions = {}): PythonInterpreter | undefined {
  for (const candidate of pythonCandidates(options)) {
    const found = probePython(candidate, options.modules);
    if (found && matchesVersion(found.version, options.version)) return found;
  }
  return undefined;
}
