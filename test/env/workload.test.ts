/**
 * What an agent does in a sandbox still works under the hardened defaults
 * (the seccomp filter, a root caller's remapped ids, idmapped layers): a
 * venv whose package compiles a C extension with gcc inside the sandbox,
 * pip at run time, git, pytest, ownership changes inside the sandbox's own
 * tree. (The SWE demo, prepare and eval run under the same defaults in
 * test/swe/pipeline.cli.test.ts.)
 */
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildEnv, createEnvSandbox, type Env, type EnvSandbox } from '../../lib/env/index.js';
import { openStore } from '../../lib/layers/index.js';
import { FILE_CAPABILITIES } from '../../lib/sandbox/policy.js';
import { isRoot, tempDir } from '../helpers.js';
import { basePython, canCompile, writePackage } from './fixtures.js';
import { findPython } from '../../lib/env/index.js';

const { python, reason } = basePython();
const compiles = python ? canCompile(python) : false;
// pytest comes from the base interpreter, seen through --system-site-packages.
const withPytest = python ? findPython({ version: '3.11', modules: ['pytest'] })?.path === python.path : false;
const skip = !python ? reason : !compiles ? 'no gcc or no Python.h for the base Python' : !withPytest ? 'the base Python 3.11 has no pytest' : undefined;
if (skip) console.warn(`[workload] SKIP: ${skip}`);

describe.skipIf(!!skip)('an agent workload under the default filter and id mapping', () => {
  const tmp = tempDir('msbx-workload-');
  let env: Env;
  let sb: EnvSandbox;

  beforeAll(async () => {
    const store = await openStore({ root: path.join(tmp.path, 'store') });
    const fast = path.join(tmp.path, 'fastmath');
    writePackage(fast, {
      name: 'fastmath',
      packages: ['fastmath'],
      cext: { 'fastmath._c': 'csrc/c.c' },
      files: {
        'fastmath/__init__.py': 'from fastmath._c import add\n',
        'csrc/c.c': [
          '#include <Python.h>',
          'static PyObject *add(PyObject *s, PyObject *a) { long x, y; if (!PyArg_ParseTuple(a, "ll", &x, &y)) return NULL; return PyLong_FromLong(x + y); }',
          'static PyMethodDef m[] = {{"add", add, METH_VARARGS, NULL}, {NULL, NULL, 0, NULL}};',
          'static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "_c", NULL, -1, m};',
          'PyMODINIT_FUNC PyInit__c(void) { return PyModule_Create(&d); }',
          '',
        ].join('\n'),
      },
    });
    const later = path.join(tmp.path, 'later-pkg');
    writePackage(later, { name: 'later-pkg', packages: ['later_pkg'], files: { 'later_pkg/__init__.py': 'X = 7\n' } });
    env = await buildEnv(
      {
        name: 'workload',
        python: python!.path,
        // Built in a sandbox: gcc compiles the extension there.
        steps: [{ package: fast }],
        // pytest, and pip, from the base interpreter: the SWE pipeline's venvs.
        systemSitePackages: true,
      },
      { store },
    );
    sb = await createEnvSandbox(env, { mounts: [{ type: 'bind', source: later, target: '/src/later-pkg', readOnly: true }] });
  }, 300_000);

  afterAll(async () => {
    await sb?.close();
    tmp.remove();
  });

  async function ok(cmd: string, opts: Parameters<EnvSandbox['exec']>[1] = {}): Promise<string> {
    const r = await sb.exec(cmd, opts);
    expect({ cmd, exitCode: r.exitCode, stderr: r.exitCode === 0 ? '' : r.stderr }).toEqual({ cmd, exitCode: 0, stderr: '' });
    return r.stdout;
  }

  it('runs under the filter, as root inside, with no host root inside', async () => {
    expect(await ok('grep "^Seccomp:" /proc/self/status; id -u')).toMatch(/Seccomp:\s+2\n0\n/);
    expect(sb.sandbox.isolation.hostRootInside).toBe(false);
    expect(sb.sandbox.isolation.notIdmapped).toEqual([]);
  });

  it('imports the extension gcc built, and pip installs another package at run time', async () => {
    expect(await ok('python -c "import fastmath; print(fastmath.add(2, 3))"')).toBe('5\n');
    await ok('pip install --no-index --no-build-isolation --no-deps -q /src/later-pkg');
    // `pip` is the venv's (python -m pip with the base's pip): the package lands in the venv, not the base.
    expect(await ok('python -c "import later_pkg; print(later_pkg.X, later_pkg.__file__)"')).toMatch(new RegExp(`^7 ${env.venvPath}/lib/`));
    // And compiles C at run time too.
    await ok('printf "int main(void){return 0;}" > /tmp/t.c && gcc /tmp/t.c -o /tmp/t && /tmp/t');
  });

  it('uses git and pytest in its own tree', async () => {
    await ok('mkdir -p /work/proj/tests && cd /work/proj && git init -q && printf "from fastmath import add\\n\\ndef test_add():\\n    assert add(1, 1) == 2\\n" > tests/test_add.py');
    await ok('cd /work/proj && git add -A && git -c user.name=a -c user.email=a@b commit -qm one && echo "# x" >> tests/test_add.py && git diff --stat');
    const out = await ok('cd /work/proj && python -m pytest -q -p no:cacheprovider tests');
    expect(out).toMatch(/1 passed/);
  });

  it('changes ownership inside its own tree, as a package manager does', async () => {
    // A root caller's sandbox maps a range (apt-style users exist); a user's maps only itself.
    const other = isRoot ? '1000:1000' : '0:0';
    const out = await ok(`mkdir -p /work/pkg/share && touch /work/pkg/share/f && chown -R ${other} /work/pkg && chmod 0750 /work/pkg && stat -c '%u:%g %a' /work/pkg /work/pkg/share/f`, { capabilities: FILE_CAPABILITIES });
    expect(out).toBe(`${other} 750\n${other} 644\n`);
  });
});
