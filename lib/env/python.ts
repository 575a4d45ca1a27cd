/**
 * The base interpreter a venv is made from. A venv is not self-contained:
 * `pyvenv.cfg` names the base's bin directory (`home`) and `bin/python` is a
 * symlink to the base interpreter, so the base install must be visible at the
 * same absolute path in every sandbox that uses the venv. We therefore record
 * the interpreter's path and its install prefix, and mount that prefix
 * read-only where it was.
 */
import { spawnSync } from 'node:child_process';
import { readdirSync, realpathSync } from 'node:fs';
import { homedir } from 'node:os';
import path from 'node:path';
import { EnvError } from './errors.js';

export interface BasePython {
  /** The interpreter as venvs will name it (absolute, symlinks kept: pyenv's layout). */
  path: string;
  /** Full version, e.g. "3.11.7". */
  version: string;
  /** sys.base_prefix: the install tree that must be mounted at the same path. */
  prefix: string;
  /** sys.base_exec_prefix when it differs from prefix (rare: split installs). */
  execPrefix?: string;
}

/** Roots searched for pyenv installs, most specific first. */
export function pyenvRoots(env: NodeJS.ProcessEnv = process.env): string[] {
  const roots = [env.PYENV_ROOT, path.join(homedir(), '.pyenv'), '/root/.pyenv'];
  return [...new Set(roots.filter((r): r is string => !!r && path.isAbsolute(r)))];
}

function listDir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return []; // missing or unreadable (e.g. /root as another user): not a source
  }
}

const VERSION_SPEC = /^\d+(\.\d+){0,2}$/;

function versionMatches(full: string, wanted: string): boolean {
  return full === wanted || full.startsWith(`${wanted}.`);
}

/** Interpreter paths that might satisfy `version`, newest first: pyenv, then /usr/bin and /usr/local/bin. */
export function pythonCandidates(version: string, env: NodeJS.ProcessEnv = process.env): string[] {
  const out: string[] = [];
  for (const root of pyenvRoots(env)) {
    const versions = listDir(path.join(root, 'versions'))
      .filter((v) => /^\d+\.\d+\.\d+$/.test(v) && versionMatches(v, version))
      .sort((a, b) => b.localeCompare(a, 'en', { numeric: true }));
    for (const v of versions) out.push(path.join(root, 'versions', v, 'bin', 'python'));
  }
  for (const dir of ['/usr/local/bin', '/usr/bin']) {
    const names = listDir(dir)
      .filter((n) => /^python\d+\.\d+$/.test(n) && versionMatches(n.slice(6), version.split('.').slice(0, 2).join('.')))
      .sort((a, b) => b.localeCompare(a, 'en', { numeric: true }));
    for (const n of names) out.push(path.join(dir, n));
  }
  return [...new Set(out)];
}

const PROBE = [
  'import sys, json, sysconfig',
  'print(json.dumps({"version": "%d.%d.%d" % sys.version_info[:3], "prefix": sys.base_prefix,',
  ' "execPrefix": sys.base_exec_prefix, "venv": sys.prefix != sys.base_prefix,',
  ' "hasVenv": __import__("importlib.util").util.find_spec("venv") is not None}))',
].join('\n');

/** Runs the interpreter to learn its version and prefix; the reason when it is unusable. */
export function probePython(interpreter: string): BasePython | string {
  const r = spawnSync(interpreter, ['-I', '-c', PROBE], { encoding: 'utf8', timeout: 20_000 });
  if (r.error) return `cannot run it: ${r.error.message}`;
  if (r.status !== 0) return `it exited with ${r.status}: ${r.stderr.trim().split('\n').pop() ?? ''}`;
  let info: { version: string; prefix: string; execPrefix: string; venv: boolean; hasVenv: boolean };
  try {
    info = JSON.parse(r.stdout) as typeof info;
  } catch {
    return `unexpected output ${JSON.stringify(r.stdout.slice(0, 200))}`;
  }
  if (info.venv) return 'it is itself a venv; give the base interpreter';
  if (!info.hasVenv) return 'it has no venv module';
  const prefix = realpathSync(info.prefix);
  const execPrefix = realpathSync(info.execPrefix);
  return { path: interpreter, version: info.version, prefix, ...(execPrefix !== prefix ? { execPrefix } : {}) };
}

/**
 * A base interpreter from an absolute path or a version ("3", "3.11",
 * "3.11.7"), looked up among pyenv installs and /usr{,/local}/bin/pythonX.Y.
 * Every candidate is run: a path can exist but be unreadable to this user.
 */
export function resolvePython(spec: string, env: NodeJS.ProcessEnv = process.env): BasePython {
  if (path.isAbsolute(spec)) {
    const found = probePython(spec);
    if (typeof found === 'string') throw new EnvError(`python ${spec}: not usable as a venv base: ${found}`);
    return found;
  }
  if (!VERSION_SPEC.test(spec)) throw new EnvError(`python ${JSON.stringify(spec)}: not an absolute path or a version like '3.11'`);
  const tried: string[] = [];
  for (const candidate of pythonCandidates(spec, env)) {
    const found = probePython(candidate);
    if (typeof found !== 'string' && versionMatches(found.version, spec)) return found;
    tried.push(`${candidate} (${typeof found === 'string' ? found : `is ${found.version}`})`);
  }
  throw new EnvError(
    `python ${spec}: no usable interpreter found in ${[...pyenvRoots(env).map((r) => `${r}/versions`), '/usr/local/bin', '/usr/bin'].join(', ')}` +
      (tried.length ? `; tried ${tried.join(', ')}` : ''),
  );
}
