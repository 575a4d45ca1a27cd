import { execFileSync } from 'node:child_process';
import { accessSync, constants, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync, chmodSync, statSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { fixShebang, LayerError, openStore, relocateTree, type Layer } from '../../lib/layers/index.js';
import { sysPython, tmpDir, writeTree } from './helpers.js';

const PYENV_PY = '/root/.pyenv/versions/3.11.7/bin/python3.11';
const WHEEL = '/usr/lib/python3/dist-packages/wheel';
function skipReason(): string | undefined {
  try {
    accessSync(PYENV_PY, constants.X_OK);
  } catch {
    return `pyenv Python 3.11.7 not executable by this user (${PYENV_PY}); venv relocation tests skipped`;
  }
  if (!existsSync(WHEEL)) return `Debian python3-wheel (${WHEEL}) missing: cannot build local packages offline`;
  return undefined;
}
const reason = skipReason();
if (reason) console.warn(`[relocate] SKIP: ${reason}`);
const hasGcc = (() => {
  try {
    execFileSync('gcc', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();

describe('shebang rewriting (no Python venv needed)', () => {
  const t = tmpDir('shebang');
  afterAll(() => t.cleanup());

  it('keeps short plain shebangs and switches to the /bin/sh wrapper past 127 bytes or with a space', () => {
    const short = Buffer.from('#!/a/bin/python\nprint(1)\n');
    expect(fixShebang(short).equals(short)).toBe(true);
    const long = `/${'p'.repeat(130)}/bin/python`;
    expect(fixShebang(Buffer.from(`#!${long}\nprint(1)\n`)).toString()).toBe(
      `#!/bin/sh\n'''exec' ${long} "$0" "$@"\n' '''\nprint(1)\n`,
    );
    expect(fixShebang(Buffer.from('#!/a b/python\nx\n')).toString()).toBe(`#!/bin/sh\n'''exec' "/a b/python" "$0" "$@"\n' '''\nx\n`);
  });

  it('a relocated script whose new shebang would exceed 127 bytes still runs', async () => {
    const longRoot = path.join(t.dir, 'l'.repeat(140));
    mkdirSync(path.join(longRoot, 'bin'), { recursive: true });
    symlinkSync(sysPython, path.join(longRoot, 'bin', 'python'));
    writeTree(longRoot, { 'bin/tool': { content: '#!/old/prefix/bin/python\nimport sys\nprint("tool ok", sys.argv[1:])\n', mode: 0o755 } });
    const r = await relocateTree(longRoot, { from: '/old/prefix', to: longRoot, files: [{ path: 'bin/tool', kind: 'text' }] });
    expect(r.rewritten).toEqual(['bin/tool']);
    expect(readFileSync(path.join(longRoot, 'bin', 'tool'), 'utf8')).toMatch(/^#!\/bin\/sh\n'''exec' /);
    expect(execFileSync(path.join(longRoot, 'bin', 'tool'), ['a b'], { encoding: 'utf8' })).toBe("tool ok ['a b']\n");
  });

  it('binary strings: same-length NUL padding, refusal when the new prefix is longer', async () => {
    const d = path.join(t.dir, 'bin');
    mkdirSync(d);
    const bin = Buffer.concat([Buffer.from('\x7fELF\0\0'), Buffer.from('/old/prefix/lib:/usr/lib\0'), Buffer.from('tail\0/old/prefixed-not-me\0')]);
    writeFileSync(path.join(d, 'x.so'), bin);
    await expect(
      relocateTree(d, { from: '/old/prefix', to: '/much/longer/prefix', files: [{ path: 'x.so', kind: 'binary' }] }),
    ).rejects.toThrow(/relocate .*x\.so: new prefix \/much\/longer\/prefix \(19 bytes\) is longer than \/old\/prefix \(11 bytes\)/);
    expect(readFileSync(path.join(d, 'x.so')).equals(bin)).toBe(true); // untouched
    await relocateTree(d, { from: '/old/prefix', to: '/new', files: [{ path: 'x.so', kind: 'binary' }] });
    const out = readFileSync(path.join(d, 'x.so'));
    expect(out.length).toBe(bin.length);
    expect(out.toString('latin1')).toContain('/new/lib:/usr/lib\0\0\0\0\0\0\0\0tail\0/old/prefixed-not-me\0');
  });
});

describe.skipIf(reason !== undefined)('venv relocation with a real venv (pyenv 3.11.7)', () => {
  const t = tmpDir('venv');
  // Built at a long path so a shorter target fits the ELF RUNPATH in place.
  const build = path.join(t.dir, 'build-root-padded-so-binaries-can-shrink');
  const venv = path.join(build, 'venv');
  const moved = path.join(t.dir, 'moved');
  let layer: Layer;
  const pyEnv = () => ({ ...process.env, PYTHONPATH: path.join(t.dir, 'wheelpath'), PIP_NO_INDEX: '1', PIP_DISABLE_PIP_VERSION_CHECK: '1' });
  const pip = (...args: string[]) =>
    execFileSync(path.join(venv, 'bin', 'python'), ['-m', 'pip', 'install', '-q', '--no-index', '--no-build-isolation', '--no-deps', ...args], {
      env: pyEnv(),
      cwd: build,
      stdio: ['ignore', 'pipe', 'pipe'],
    });

  beforeAll(async () => {
    mkdirSync(path.join(t.dir, 'wheelpath'));
    // wheel's code *and* its metadata: setuptools finds bdist_wheel through
    // wheel's distutils.commands entry point.
    symlinkSync(WHEEL, path.join(t.dir, 'wheelpath', 'wheel'));
    for (const meta of readdirSync(path.dirname(WHEEL)).filter((n) => /^wheel-.*\.(egg|dist)-info$/.test(n)))
      symlinkSync(path.join(path.dirname(WHEEL), meta), path.join(t.dir, 'wheelpath', meta));
    const pyproject = '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n';
    const ext = hasGcc
      ? `ext_modules=[Extension("demo_app._cext", ["demo_app/_cext.c"], runtime_library_dirs=[${JSON.stringify(path.join(venv, 'lib'))}])],`
      : '';
    writeTree(path.join(build, 'src'), {
      'demo_app/pyproject.toml': pyproject,
      'demo_app/setup.py': `from setuptools import setup, Extension\nsetup(name="demo_app", version="0.1", packages=["demo_app"], ${ext}\n  entry_points={"console_scripts": ["demo-app=demo_app:main"]})\n`,
      'demo_app/demo_app/__init__.py': 'def main():\n    print("demo-app ok")\n',
      'demo_app/demo_app/_cext.c':
        '#include <Python.h>\nstatic struct PyModuleDef m = {PyModuleDef_HEAD_INIT, "_cext", NULL, -1, NULL};\nPyMODINIT_FUNC PyInit__cext(void) { return PyModule_Create(&m); }\n',
      'edit_src/pyproject.toml': pyproject,
      'edit_src/setup.py': 'from setuptools import setup, find_packages\nsetup(name="edit_src", version="0.1", package_dir={"": "src"}, packages=find_packages("src"),\n  entry_points={"console_scripts": ["edit-src=edit_src:main"]})\n',
      'edit_src/src/edit_src/__init__.py': 'def main():\n    print("edit-src ok", __file__)\n',
      'edit_flat/pyproject.toml': pyproject,
      'edit_flat/setup.py': 'from setuptools import setup\nsetup(name="edit_flat", version="0.1", packages=["edit_flat"],\n  entry_points={"console_scripts": ["edit-flat=edit_flat:main"]})\n',
      'edit_flat/edit_flat/__init__.py': 'def main():\n    print("edit-flat ok", __file__)\n',
      'legacy/setup.py': 'from setuptools import setup\nsetup(name="legacy_pkg", version="0.1", py_modules=["legacy_mod"],\n  entry_points={"console_scripts": ["legacy-cli=legacy_mod:main"]})\n',
      'legacy/legacy_mod.py': 'def main():\n    print("legacy ok", __file__)\n',
    });
    execFileSync(PYENV_PY, ['-m', 'venv', venv], { stdio: 'ignore' });
    pip('./src/demo_app');
    pip('-e', './src/edit_src');
    pip('-e', './src/edit_flat');
    pip('--no-use-pep517', '-e', './src/legacy');
    // A console script in distlib's /bin/sh wrapper form (what pip writes for
    // long or spaced paths), to check that form is rewritten too.
    writeTree(venv, {
      'bin/wrapped-tool': {
        content: `#!/bin/sh\n'''exec' ${venv}/bin/python "$0" "$@"\n' '''\nfrom demo_app import main\nmain()\n`,
        mode: 0o755,
      },
    });
    // Import everything once so __pycache__ holds .pyc of the finder module:
    // the stale-.pyc trap needs them present.
    execFileSync(path.join(venv, 'bin', 'python'), ['-c', 'import edit_src, edit_flat, legacy_mod, demo_app'], { stdio: 'ignore' });
    const store = await openStore({ root: path.join(t.dir, 'store') });
    layer = await store.addDirectory(build, { prefix: build, name: 'test-venv' });
    // The build location disappears: anything still pointing there breaks.
    rmSync(build, { recursive: true, force: true });
  }, 240_000);
  afterAll(() => t.cleanup());

  it('records the files that embed the build prefix (never .pyc)', () => {
    const files = layer.manifest.prefixFiles!;
    const names = files.map((f) => `${f.kind}:${f.path}`);
    console.log(`[relocate] ${files.length} files embed the prefix: ${names.join(', ')}`);
    expect(layer.manifest.prefix).toBe(build);
    const has = (re: RegExp) => expect(names.some((n) => re.test(n)), re.source).toBe(true);
    has(/^text:venv\/pyvenv\.cfg$/);
    has(/^text:venv\/bin\/activate$/);
    has(/^text:venv\/bin\/demo-app$/);
    has(/^text:venv\/bin\/wrapped-tool$/);
    has(/^text:venv\/lib\/python3\.11\/site-packages\/__editable__\.edit_src-0\.1\.pth$/);
    has(/^text:venv\/lib\/python3\.11\/site-packages\/__editable___edit_flat_0_1_finder\.py$/);
    has(/^text:venv\/lib\/python3\.11\/site-packages\/demo_app-0\.1\.dist-info\/direct_url\.json$/);
    has(/^text:venv\/lib\/python3\.11\/site-packages\/legacy[_-]pkg\.egg-link$/);
    if (hasGcc) has(/^binary:venv\/lib\/python3\.11\/site-packages\/demo_app\/_cext.*\.so$/);
    expect(names.filter((n) => n.endsWith('.pyc'))).toEqual([]);
  });

  it('refuses a longer prefix before touching anything when a binary embeds the prefix', async () => {
    if (!hasGcc) return;
    const longer = path.join(t.dir, 'a-much-longer-destination-path-than-the-build-root-had-x');
    execFileSync('cp', ['-a', layer.path, longer]);
    execFileSync('chmod', ['-R', 'u+w', longer]);
    const before = readFileSync(path.join(longer, 'venv', 'pyvenv.cfg'));
    await expect(relocateTree(longer, { from: build, to: longer, files: layer.manifest.prefixFiles! })).rejects.toThrow(LayerError);
    await expect(relocateTree(longer, { from: build, to: longer, files: layer.manifest.prefixFiles! })).rejects.toThrow(
      /_cext.*\.so: new prefix .* is longer than .*ELF RPATH\/RUNPATH/,
    );
    expect(readFileSync(path.join(longer, 'venv', 'pyvenv.cfg')).equals(before)).toBe(true);
  });

  it('after moving and relocating, every console script runs and every editable package imports from the new place', async () => {
    execFileSync('cp', ['-a', layer.path, moved]);
    execFileSync('chmod', ['-R', 'u+w', moved]);
    const site = path.join(moved, 'venv', 'lib', 'python3.11', 'site-packages');
    const finderPyc = () => readdirSync(path.join(site, '__pycache__')).filter((n) => n.startsWith('__editable___edit_flat_0_1_finder.'));
    expect(finderPyc().length).toBeGreaterThan(0);
    const pipPyc = path.join(site, 'pip', '__pycache__', readdirSync(path.join(site, 'pip', '__pycache__'))[0]!);
    const pipPycBefore = readFileSync(pipPyc);
    const bin = path.join(moved, 'venv', 'bin');

    // Before relocation the scripts are broken (their interpreter path is gone).
    expect(() => execFileSync(path.join(bin, 'demo-app'), { stdio: 'pipe' })).toThrow();

    const r = await relocateTree(moved, { from: build, to: moved, files: layer.manifest.prefixFiles! });
    console.log(`[relocate] rewrote ${r.rewritten.length} files, removed ${r.pycRemoved.length} stale .pyc: ${r.pycRemoved.join(', ')}`);
    expect(finderPyc()).toEqual([]); // the rewritten finder's cached bytecode is gone
    expect(readFileSync(pipPyc).equals(pipPycBefore)).toBe(true); // .pyc never rewritten

    const run = (cmd: string, args: string[] = []) => execFileSync(cmd, args, { encoding: 'utf8', env: { ...process.env, PYTHONPATH: '' } });
    expect(run(path.join(bin, 'demo-app'))).toBe('demo-app ok\n');
    expect(run(path.join(bin, 'wrapped-tool'))).toBe('demo-app ok\n');
    expect(run(path.join(bin, 'edit-src'))).toBe(`edit-src ok ${path.join(moved, 'src', 'edit_src', 'src', 'edit_src', '__init__.py')}\n`);
    expect(run(path.join(bin, 'edit-flat'))).toBe(`edit-flat ok ${path.join(moved, 'src', 'edit_flat', 'edit_flat', '__init__.py')}\n`);
    expect(run(path.join(bin, 'legacy-cli'))).toBe(`legacy ok ${path.join(moved, 'src', 'legacy', 'legacy_mod.py')}\n`);
    const imported = run(path.join(bin, 'python'), [
      '-c',
      'import edit_src, edit_flat, legacy_mod, demo_app, sys; print(sys.prefix); print(edit_src.__file__); print(edit_flat.__file__); print(legacy_mod.__file__)',
    ]);
    expect(imported.split('\n').filter(Boolean)).toEqual([
      path.join(moved, 'venv'),
      path.join(moved, 'src', 'edit_src', 'src', 'edit_src', '__init__.py'),
      path.join(moved, 'src', 'edit_flat', 'edit_flat', '__init__.py'),
      path.join(moved, 'src', 'legacy', 'legacy_mod.py'),
    ]);
    if (hasGcc) {
      run(path.join(bin, 'python'), ['-c', 'import demo_app._cext']);
      const so = readdirSync(path.join(site, 'demo_app')).find((n) => n.startsWith('_cext'))!;
      const dyn = run('readelf', ['-d', path.join(site, 'demo_app', so)]);
      expect(dyn).toContain(path.join(moved, 'venv', 'lib'));
      expect(dyn).not.toContain(build);
    }
    // activate points at the new place; pip still works.
    expect(readFileSync(path.join(bin, 'activate'), 'utf8')).toContain(`VIRTUAL_ENV="${path.join(moved, 'venv')}"`);
    expect(run(path.join(bin, 'python'), ['-m', 'pip', '--version'])).toContain(path.join(moved, 'venv'));
    // Modes kept (scripts executable), and the layer itself was not modified.
    expect(statSync(path.join(bin, 'demo-app')).mode & 0o111).toBe(0o111);
    expect(readFileSync(path.join(layer.path, 'venv', 'bin', 'demo-app'), 'utf8')).toContain(build);
    chmodSync(moved, 0o755);
  });
});
