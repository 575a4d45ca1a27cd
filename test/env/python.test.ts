/**
 * The one Python finder: pyenv roots, then PATH; every candidate run.
 * Real interpreters of this machine, no mocks.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, symlinkSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { EnvError, findPython, probePython, pythonCandidates, pythonSearchPath, resolvePython } from '../../lib/env/index.js';
import { tempDir } from '../helpers.js';
import { basePython } from './fixtures.js';

const { python, reason } = basePython();
if (reason) console.warn(`[python] SKIP: ${reason}`);

describe.skipIf(!python)('finding interpreters', () => {
  const tmp = tempDir('msbx-python-');
  afterAll(() => tmp.remove());
  const minor = () => python!.version.split('.').slice(0, 2).join('.');

  it('probes version, prefix and pip, and says why a candidate does not fit', () => {
    const found = probePython(python!.path);
    expect(found).toMatchObject({ path: python!.path, version: python!.version, prefix: python!.prefix });
    expect(typeof (found as { hasPip: unknown }).hasPip).toBe('boolean');
    expect(probePython(python!.path, ['no_such_module_xyz'])).toBe('it has no no_such_module_xyz module');
    expect(probePython('/nonexistent/python3')).toMatch(/^cannot run it: .*ENOENT/);
    expect(() => probePython(python!.path, ['os; import shutil'])).toThrow(EnvError);
    // A venv is not a base.
    const venv = path.join(tmp.path, 'venv');
    expect(spawnSync(python!.path, ['-m', 'venv', '--without-pip', venv]).status).toBe(0);
    expect(probePython(path.join(venv, 'bin', 'python'))).toBe('it is itself a venv; give the base interpreter');
  });

  it('looks in PATH after pyenv, the most specific name first', () => {
    const bin = path.join(tmp.path, 'bin');
    mkdirSync(bin);
    for (const name of ['python', 'python3', `python${minor()}`]) symlinkSync(python!.path, path.join(bin, name));
    const env = { PATH: bin, PYENV_ROOT: path.join(tmp.path, 'no-pyenv') };
    const fromPath = pythonCandidates(minor(), env).filter((c) => c.startsWith(bin));
    expect(fromPath).toEqual([`${bin}/python${minor()}`, `${bin}/python3`, `${bin}/python`]);
    expect(pythonCandidates('2.7', env).filter((c) => c.startsWith(bin))).toEqual([`${bin}/python`]);
    expect(pythonSearchPath(env)).toContain(bin);
    expect(pythonSearchPath(env)[0]).toBe(path.join(tmp.path, 'no-pyenv', 'versions'));
  });

  it('finds by version and module, or explains where it looked', () => {
    expect(findPython({ version: python!.version })?.version).toBe(python!.version);
    expect(findPython({ version: minor(), modules: ['no_such_module_xyz'] })).toBeUndefined();
    expect(() => findPython({ version: 'latest' })).toThrow(/not an absolute path or a version/);
    expect(() => resolvePython('1.2')).toThrow(/^python 1\.2: no usable interpreter found in .*versions/);
    expect(() => resolvePython(minor(), { modules: ['no_such_module_xyz'] })).toThrow(
      new RegExp(`python ${minor().replace('.', '\\.')} with no_such_module_xyz: no usable interpreter found in .*; tried .*it has no no_such_module_xyz module`),
    );
    expect(() => resolvePython(python!.path, { modules: ['no_such_module_xyz'] })).toThrow(`python ${python!.path}: not usable as a venv base with no_such_module_xyz: it has no no_such_module_xyz module`);
  });
});
