/**
 * Finding the machine's Python interpreters, the one place that does it:
 * venvs (buildEnv), SWE tasks (lib/swe) and the tests all ask here.
 *
 * A venv is not self-contained: `pyvenv.cfg` names the base's bin directory
 * (`home`) and `bin/python` is a symlink to the base interpreter, so the base
 * install must be visible at the same absolute path in every sandbox that
 * uses the venv. We therefore record the interpreter's path and its install
 * prefix, and mount that prefix read-only where it was.
 *
 * Where: pyenv installs first (that is how hosts provide several versions
 * side by side), then the directories of PATH. Every candidate is run,
 * because a path can exist yet be unusable: unreadable to this user
 * (`/root/.pyenv` when `/root` is 0700), a venv itself, or without a module
 * the caller needs.
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
  /**
   * The base has pip: a venv that sees the base's packages can use it
   * instead of installing its own. Always probed; absent only in env
   * manifests written before it was recorded.
   */
  hasPip?: boolean;
}

export interface PythonQuery {
  /** "3", "3.11" or "3.11.7"; any version when absent. */
  version?: string;
  /** Modules the interpreter must have, e.g. ['pytest']. */
  modules?: string[];
  /** Where PYENV_ROOT and PATH come from (default process.env). */
  env?: NodeJS.ProcessEnv;
}

/** Used when PATH is unset (`env -i`): where a system Python lives. */
const FALLBACK_PATH = '/usr/local/bin:/usr/bin:/bin';

/** Roots searched for pyenv installs, most specific first. */
export function pyenvRoots(env: NodeJS.ProcessEnv = process.env): string[] {
  const roots = [env.PYENV_ROOT, path.join(homedir(), '.pyenv'), '/root/.pyenv', '/usr/local/pyenv', '/opt/pyenv'];
  return [...new Set(roots.filter((r): r is string => !!r && path.isAbsolute(r)))];
}

function pathDirs(env: NodeJS.ProcessEnv): string[] {
  return [...new Set((env.PATH || FALLBACK_PATH).split(path.delimiter).filter((d) => path.isAbsolute(d)))];
}

/** Every place searched, for messages that say where an interpreter was not found. */
export function pythonSearchPath(env: NodeJS.ProcessEnv = process.env): string[] {
  return [...pyenvRoots(env).map((r) => path.join(r, 'versions')), ...pathDirs(env)];
}

function listDir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch {
    return []; // missing or unreadable (e.g. /root as another user): not a source
  }
}

/** Why a pyenv root gave no candidates although it exists: the usual cause of "not found" for a second user. */
function unreadable(roots: string[]): string {
  const hidden = roots.filter((r) => {
    try {
      readdirSync(path.join(r, 'versions'));
      return false;
    } catch (err) {
      return (err as NodeJS.ErrnoException).code === 'EACCES';
    }
  });
  return hidden.length ? `; ${hidden.join(', ')} cannot be read by this user (for /root/.pyenv: chmod o+x /root)` : '';
}

const VERSION_SPEC = /^\d+(\.\d+){0,2}$/;

function versionMatches(full: string, wanted: string | undefined): boolean {
  return wanted === undefined || full === wanted || full.startsWith(`${wanted}.`);
}

/** Could a version named only to `named` (e.g. "3.11" of python3.11) be `wanted`? */
function compatible(named: string, wanted: string | undefined): boolean {
  return wanted === undefined || named === '' || versionMatches(named, wanted) || versionMatches(wanted, named);
}

const newestFirst = (a: string, b: string) => b.localeCompare(a, 'en', { numeric: true });

/**
 * Interpreter paths that might satisfy `version`, most specific first:
 * pyenv's versions (newest first), then per PATH directory `pythonX.Y`,
 * `pythonX` and `python`. Nothing is run here; see findPython.
 */
export function pythonCandidates(version?: string, env: NodeJS.ProcessEnv = process.env): string[] {
  const out: string[] = [];
  for (const root of pyenvRoots(env)) {
    for (const v of listDir(path.join(root, 'versions')).filter((v) => /^\d+\.\d+\.\d+$/.test(v) && versionMatches(v, version)).sort(newestFirst))
      out.push(path.join(root, 'versions', v, 'bin', 'python'));
  }
  for (const dir of pathDirs(env)) {
    const names = listDir(dir).filter((n) => /^python(\d+(\.\d+)?)?$/.test(n) && compatible(n.slice(6), version));
    // python3.11 before python3 before python: the more a name promises, the likelier it fits.
    names.sort((a, b) => b.split('.').length - a.split('.').length || b.length - a.length || newestFirst(a, b));
    for (const n of names) out.push(path.join(dir, n));
  }
  return [...new Set(out)];
}

const MODULE_NAME = /^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*$/;

/** -I: no PYTHON* variables, no user site; what a sandbox will see of the interpreter. */
function probeScript(modules: string[]): string {
  return [
    'import sys, json, importlib.util as u',
    'def has(m):',
    '    try: return u.find_spec(m) is not None',
    '    except Exception: return False',
    'print(json.dumps({"version": "%d.%d.%d" % sys.version_info[:3], "prefix": sys.base_prefix,',
    ' "execPrefix": sys.base_exec_prefix, "venv": sys.prefix != sys.base_prefix,',
    ` "modules": {m: has(m) for m in ["venv", "pip", ${modules.map((m) => JSON.stringify(m)).join(', ')}]}}))`,
  ].join('\n');
}

/**
 * Runs the interpreter to learn its version and prefix, and checks that it
 * can be a venv's base and has `modules`; the reason when it cannot.
 */
export function probePython(interpreter: string, modules: string[] = []): BasePython | string {
  const bad = modules.find((m) => !MODULE_NAME.test(m));
  if (bad !== undefined) throw new EnvError(`python module ${JSON.stringify(bad)}: not a module name`);
  const r = spawnSync(interpreter, ['-I', '-c', probeScript(modules)], { encoding: 'utf8', timeout: 20_000 });
  if (r.error) return `cannot run it: ${r.error.message}`;
  if (r.status !== 0) return `it exited with ${r.status ?? r.signal}: ${r.stderr.trim().split('\n').pop() ?? ''}`;
  let info: { version: string; prefix: string; execPrefix: string; venv: boolean; modules: Record<string, boolean> };
  try {
    info = JSON.parse(r.stdout) as typeof info;
  } catch {
    return `unexpected output ${JSON.stringify(r.stdout.slice(0, 200))}`;
  }
  if (info.venv) return 'it is itself a venv; give the base interpreter';
  const missing = ['venv', ...modules].filter((m) => !info.modules[m]);
  if (missing.length > 0) return `it has no ${missing.join(', ')} module${missing.length > 1 ? 's' : ''}`;
  const prefix = realpathSync(info.prefix);
  const execPrefix = realpathSync(info.execPrefix);
  return { path: interpreter, version: info.version, prefix, ...(execPrefix !== prefix ? { execPrefix } : {}), hasPip: info.modules.pip === true };
}

/** The first candidate that fits, and what was wrong with the others. */
function search(query: PythonQuery): { found?: BasePython; tried: string[] } {
  const tried: string[] = [];
  for (const candidate of pythonCandidates(query.version, query.env)) {
    const found = probePython(candidate, query.modules);
    if (typeof found !== 'string' && versionMatches(found.version, query.version)) return { found, tried };
    tried.push(`${candidate} (${typeof found === 'string' ? found : `is ${found.version}`})`);
  }
  return { tried };
}

function checkVersion(version: string | undefined): void {
  if (version !== undefined && !VERSION_SPEC.test(version)) throw new EnvError(`python ${JSON.stringify(version)}: not an absolute path or a version like '3.11'`);
}

/** The first usable interpreter for `query`, or undefined when there is none. */
export function findPython(query: PythonQuery = {}): BasePython | undefined {
  checkVersion(query.version);
  return search(query).found;
}

/**
 * A base interpreter from an absolute path or a version ("3", "3.11",
 * "3.11.7"); throws EnvError naming every place searched and why each
 * candidate did not fit.
 */
export function resolvePython(spec: string, opts: Omit<PythonQuery, 'version'> = {}): BasePython {
  const wants = opts.modules?.length ? ` with ${opts.modules.join(', ')}` : '';
  if (path.isAbsolute(spec)) {
    const found = probePython(spec, opts.modules);
    if (typeof found === 'string') throw new EnvError(`python ${spec}: not usable as a venv base${wants}: ${found}`);
    return found;
  }
  checkVersion(spec);
  const { found, tried } = search({ ...opts, version: spec });
  if (found) return found;
  throw new EnvError(
    `python ${spec}${wants}: no usable interpreter found in ${pythonSearchPath(opts.env).join(', ')}` +
      (tried.length ? `; tried ${tried.join(', ')}` : '') +
      unreadable(pyenvRoots(opts.env)),
  );
}
