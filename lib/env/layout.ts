/**
 * What every sandbox of an env (and the build sandbox) needs besides the
 * layers: the base interpreter at its original path, and the variables an
 * activated venv has.
 */
import path from 'node:path';
import { policy } from '../sandbox/index.js';
import type { BindMount } from '../sandbox/index.js';
import { EnvError } from './errors.js';
import type { BasePython } from './python.js';

/** True if the 'host' root already shows `p` (read-only): /usr/..., /bin/... */
function shownByHostRoot(p: string): boolean {
  return policy.HOST_ROOT_DIRS.some((d) => p === d || p.startsWith(`${d}/`));
}

/**
 * Read-only binds of the base install at its own path, so the venv's
 * `pyvenv.cfg home` and its `bin/python` symlink resolve inside the sandbox.
 * Nothing for a system Python under /usr: the host root shows it already.
 */
export function basePythonMounts(python: BasePython, root: 'host' | 'empty' = 'host'): BindMount[] {
  const dirs = [python.prefix, ...(python.execPrefix ? [python.execPrefix] : [])];
  const interpDir = path.dirname(python.path);
  if (!dirs.some((d) => interpDir === d || interpDir.startsWith(`${d}/`)) && !(root === 'host' && shownByHostRoot(interpDir)))
    throw new EnvError(`python ${python.path}: lies outside its prefix ${python.prefix}; venvs made from it would not resolve in a sandbox (give the interpreter inside the prefix, e.g. ${python.prefix}/bin/python3)`);
  return dirs
    .filter((d) => root === 'empty' || !shownByHostRoot(d))
    .map((d): BindMount => ({ type: 'bind', source: d, target: d, readOnly: true }));
}

/** An activated venv's variables: its bin first on PATH, VIRTUAL_ENV, no user site. */
export function venvVariables(venvPath: string): Record<string, string> {
  return {
    PATH: `${venvPath}/bin:${policy.DEFAULT_PATH}`,
    VIRTUAL_ENV: venvPath,
    PYTHONNOUSERSITE: '1',
  };
}
