/**
 * The base interpreter a task's venv is made from, and what the sandbox
 * must show of it. A venv is only a pyvenv.cfg plus a symlink to the base
 * interpreter, so every sandbox of the task must see the base installation
 * (its prefix) at the very same path: it is bound read-only there.
 */
import { spawnSync } from 'node:child_process';
import { findPython } from '../python.js';
import type { Task } from '../tasks.js';

export interface BasePython {
  /** Interpreter path, valid on the host and (bound at the same path) in sandboxes. */
  path: string;
  /** Full version, e.g. "3.11.7". */
  version: string;
  /** sys.base_prefix: the tree to bind (e.g. /root/.pyenv/versions/3.11.7). */
  prefix: string;
  /** Base has pip: the venv can skip ensurepip (3.7 s and 26 MB per venv) and use it. */
  hasPip: boolean;
  /** Base has pytest, the one test runner available without an index. */
  hasPytest: boolean;
}

/** Trees the default sandbox root already shows read-only: no bind needed there. */
const HOST_VISIBLE = ['/usr', '/bin', '/lib', '/lib64', '/sbin'];

export function needsBind(prefix: string): boolean {
  return !HOST_VISIBLE.some((dir) => prefix === dir || prefix.startsWith(`${dir}/`));
}

const cache = new Map<string, BasePython | string>();

/**
 * The interpreter for `task.python`. Offline, a test runner cannot be
 * installed, so when the test command uses pytest an interpreter that has
 * it is preferred (the venv sees it through --system-site-packages).
 * Returns an error message when no interpreter fits.
 */
export function resolveBasePython(task: Pick<Task, 'python' | 'test_cmd'>): BasePython | string {
  const wantsPytest = /\bpytest\b/.test(task.test_cmd);
  const key = `${task.python}|${wantsPytest}`;
  const cached = cache.get(key);
  if (cached !== undefined) return cached;
  const found =
    (wantsPytest ? findPython({ version: task.python, modules: ['pytest'] }) : undefined) ?? findPython({ version: task.python });
  let result: BasePython | string;
  if (!found) {
    result = `no Python ${task.python} interpreter found (looked in PYENV_ROOT, ~/.pyenv, /root/.pyenv and PATH; an unreadable /root hides /root/.pyenv from other users)`;
  } else {
    result = describe(found.path, found.version) ?? `Python ${task.python} at ${found.path}: could not read sys.base_prefix`;
  }
  cache.set(key, result);
  return result;
}

function describe(path: string, version: string): BasePython | undefined {
  const script = [
    'import sys, importlib.util as u',
    "print(sys.base_prefix)",
    "print(int(u.find_spec('pip') is not None))",
    "print(int(u.find_spec('pytest') is not None))",
  ].join('\n');
  const r = spawnSync(path, ['-c', script], { encoding: 'utf8', timeout: 20_000 });
  if (r.status !== 0) return undefined;
  const [prefix, pip, pytest] = r.stdout.trim().split('\n');
  if (!prefix?.startsWith('/')) return undefined;
  return { path, version, prefix, hasPip: pip === '1', hasPytest: pytest === '1' };
}
