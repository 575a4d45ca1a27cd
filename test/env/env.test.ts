/**
 * Real venvs from the machine's Python: built in a sandbox, packed, stored,
 * stacked into sandboxes (overlay, and the extraction baseline), relocated,
 * and isolated.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createExtractedEnvSandbox } from '../../lib/env/extractBaseline.js';
import { buildEnv, buildRepo, createEnvSandbox, EnvError, listEnvs, loadEnv, removeEnv, type Env, type EnvSandbox } from '../../lib/env/index.js';
import { digestDirectory, openStore, type LayerStore } from '../../lib/layers/index.js';
import { tempDir } from '../helpers.js';
import { basePython, buildWheel, canCompile, gitRepo, writePackage } from './fixtures.js';

const { python, reason } = basePython();
if (reason) console.warn(`[env] SKIP: ${reason}`);
const compiles = python ? canCompile(python) : false;
if (python && !compiles) console.warn(`[env] no gcc or no Python.h for ${python.path}: the C extension part is skipped`);

/** Apparent bytes of a tree (du -sb), as the issue asks. */
function duBytes(p: string): number {
  // Overlay leaves work/work at mode 000 (unreadable to a non-root owner):
  // du still prints the total of what it could read, which is what we want.
  return Number(spawnSync('du', ['-sb', p], { encoding: 'utf8' }).stdout.split('\t')[0]);
}

/** Runs a command in the sandbox and returns its stdout, failing with its stderr. */
async function out(sb: EnvSandbox, cmd: string): Promise<string> {
  const r = await sb.exec(cmd);
  if (r.exitCode !== 0) throw new Error(`${cmd}: exit ${r.exitCode}: ${r.stderr}`);
  return r.stdout.trim();
}

describe.skipIf(!python)('environments from the machine Python', () => {
  const tmp = tempDir('msbx-env-');
  let store: LayerStore;
  let env: Env;
  let commit: string;
  const repoSrc = path.join(tmp.path, 'repo-src');
  const treeDigests = new Map<string, string>();

  beforeAll(async () => {
    store = await openStore({ root: path.join(tmp.path, 'store') });
    const hello = path.join(tmp.path, 'hello-pkg');
    writePackage(hello, {
      name: 'hello-pkg',
      packages: ['hello_pkg'],
      scripts: { 'hello-env': 'hello_pkg.cli:main' },
      ...(compiles ? { cext: { 'hello_pkg._speed': 'csrc/speed.c' } } : {}),
      files: {
        'hello_pkg/__init__.py': 'GREETING = "hello from hello_pkg"\n',
        'hello_pkg/cli.py': 'import sys\nfrom hello_pkg import GREETING\n\ndef main():\n    print(GREETING, sys.prefix)\n',
        'csrc/speed.c': [
          '#include <Python.h>',
          'static PyObject *twice(PyObject *self, PyObject *arg) { long v = PyLong_AsLong(arg); return PyLong_FromLong(2 * v); }',
          'static PyMethodDef methods[] = {{"twice", twice, METH_O, NULL}, {NULL, NULL, 0, NULL}};',
          'static struct PyModuleDef mod = {PyModuleDef_HEAD_INIT, "_speed", NULL, -1, methods};',
          'PyMODINIT_FUNC PyInit__speed(void) { return PyModule_Create(&mod); }',
          '',
        ].join('\n'),
      },
    });
    const wheelSrc = path.join(tmp.path, 'wheel-pkg');
    writePackage(wheelSrc, { name: 'wheel-pkg', packages: ['wheel_pkg'], files: { 'wheel_pkg/__init__.py': 'VALUE = 42\n' } });
    buildWheel(python!.path, wheelSrc, path.join(tmp.path, 'wheels'));
    commit = gitRepo(repoSrc, {
      name: 'testbed-mod',
      sourceRoot: 'src',
      packages: ['testbed_mod'],
      files: { 'src/testbed_mod/__init__.py': 'def answer():\n    return "original"\n', 'README.md': 'repo\n', 'data/keep.txt': 'keep\n' },
    });
    env = await buildEnv(
      {
        name: 'demo',
        python: python!.path,
        repo: { source: repoSrc, commit },
        steps: [
          { package: hello },
          { editable: '.' },
          { wheels: path.join(tmp.path, 'wheels') },
          { run: 'echo built > "$VIRTUAL_ENV/built-marker" && test "$(pwd)" = /testbed' },
        ],
      },
      { store },
    );
    for (const l of [env.venv, env.repo!]) treeDigests.set(l.digest, (await digestDirectory(l.path)).digest);
  }, 300_000);

  afterAll(() => tmp.remove());

  it('records the interpreter, the layers and their archives, and loads back by id', async () => {
    expect(env.python.path).toBe(python!.path);
    expect(env.python.version).toMatch(/^3\.\d+\.\d+$/);
    expect(env.python.prefix).toBe(python!.prefix);
    expect(env.venvPath).toBe('/opt/venv');
    expect(env.repoPath).toBe('/testbed');
    expect(env.venv.manifest.prefix).toBe('/opt/venv');
    const venvPrefixFiles = env.venv.manifest.prefixFiles!.map((f) => f.path);
    expect(venvPrefixFiles).toContain('bin/hello-env');
    expect(venvPrefixFiles).toContain('pyvenv.cfg');
    expect(env.manifest.venv.repoPrefixFiles.map((f) => f.path).some((p) => p.endsWith('__editable__.testbed-mod.pth'))).toBe(true);
    expect(existsSync(env.archives.venv!)).toBe(true);
    expect(existsSync(env.archives.repo!)).toBe(true);
    expect(env.manifest.repo?.commit).toBe(commit);
    const again = await loadEnv(env.id, { store });
    expect(again.venv.digest).toBe(env.venv.digest);
    expect(again.repo?.digest).toBe(env.repo?.digest);
    expect((await listEnvs({ store })).map((e) => e.id)).toEqual([env.id]);
    await expect(loadEnv('env-000000000000000000000000', { store })).rejects.toThrow(/cannot read/);
  });

  it('overlay mode: console script, imports, editable repo and sys.prefix work at the build paths', async () => {
    await using sb = await createEnvSandbox(env);
    expect(await out(sb, 'hello-env')).toBe('hello from hello_pkg /opt/venv');
    expect(await out(sb, `python -c 'import sys; print(sys.prefix)'`)).toBe('/opt/venv');
    expect(await out(sb, 'pwd; echo $VIRTUAL_ENV; command -v python')).toBe('/testbed\n/opt/venv\n/opt/venv/bin/python');
    expect(await out(sb, `python -c 'import testbed_mod, wheel_pkg; print(testbed_mod.__file__, testbed_mod.answer(), wheel_pkg.VALUE)'`)).toBe(
      '/testbed/src/testbed_mod/__init__.py original 42',
    );
    expect(await out(sb, 'cat /opt/venv/built-marker')).toBe('built');
    if (compiles) expect(await out(sb, `python -c 'from hello_pkg import _speed; print(_speed.twice(21))'`)).toBe('42');
    // The editable install follows edits of the repo.
    await sb.sandbox.writeFile('/testbed/src/testbed_mod/__init__.py', 'def answer():\n    return "patched"\n');
    expect(await out(sb, `python -c 'import testbed_mod; print(testbed_mod.answer())'`)).toBe('patched');
    expect(await out(sb, 'git status --porcelain --untracked-files=no')).toBe('M src/testbed_mod/__init__.py');
  });

  for (const mode of ['extract', 'overlay'] as const) {
    it(`relocation (${mode}): venv and repo work at other paths`, async () => {
      const moved = { venvPath: '/srv/elsewhere/venv', repoPath: '/code/project' };
      await using sb = await (mode === 'extract' ? createExtractedEnvSandbox(env, moved) : createEnvSandbox(env, moved));
      expect(sb.setup.rewritten.venv).toContain('bin/hello-env');
      expect(await out(sb, 'hello-env')).toBe('hello from hello_pkg /srv/elsewhere/venv');
      expect(await out(sb, `python -c 'import sys; print(sys.prefix)'`)).toBe('/srv/elsewhere/venv');
      expect(await out(sb, 'pwd; echo $VIRTUAL_ENV')).toBe('/code/project\n/srv/elsewhere/venv');
      expect(await out(sb, `python -c 'import testbed_mod, wheel_pkg; print(testbed_mod.__file__, wheel_pkg.VALUE)'`)).toBe(
        '/code/project/src/testbed_mod/__init__.py 42',
      );
      if (compiles) expect(await out(sb, `python -c 'from hello_pkg import _speed; print(_speed.twice(4))'`)).toBe('8');
      expect(await out(sb, 'test ! -e /opt/venv && test ! -e /testbed && echo gone')).toBe('gone');
    });
  }

  it('two sandboxes on one env: changes, deletions and renames stay in the sandbox that made them', async () => {
    await using a = await createEnvSandbox(env);
    await using b = await createEnvSandbox(env);
    const site = (await out(a, `python -c 'import hello_pkg, os; print(os.path.dirname(hello_pkg.__file__))'`)).trim();
    await out(a, `echo changed > /testbed/README.md`);
    await out(a, `rm /testbed/data/keep.txt ${site}/cli.py`);
    // rename(2) of a directory that comes from the lower layer: EXDEV under
    // overlay with userxattr (no redirect_dir); mv falls back to copy+delete.
    expect(await out(a, `python -c 'import os
try:
    os.rename("/testbed/src/testbed_mod", "/testbed/src/moved_mod")
except OSError as e:
    print(e.errno)'`)).toBe('18');
    await out(a, 'mv /testbed/src/testbed_mod /testbed/src/moved_mod && mv /opt/venv/bin/hello-env /opt/venv/bin/renamed');
    expect(await out(a, 'ls /testbed/src; cat /testbed/README.md; ls /opt/venv/bin | grep -c renamed')).toBe('moved_mod\nchanged\n1');

    expect(await out(b, 'cat /testbed/README.md /testbed/data/keep.txt; ls /testbed/src')).toBe('repo\nkeep\ntestbed_mod');
    expect(await out(b, 'hello-env')).toBe('hello from hello_pkg /opt/venv');
    for (const l of [env.venv, env.repo!]) expect((await digestDirectory(l.path)).digest).toBe(treeDigests.get(l.digest));
    // Each sandbox holds only what it changed; the env itself is one copy in the store.
    expect(duBytes(a.sandbox.privateDir)).toBeLessThan(1 << 20);
    expect(duBytes(b.sandbox.privateDir)).toBeLessThan(1 << 20);
  });

  it('the extraction baseline keeps its writes in its private copy and removes it at close', async () => {
    const sb = await createExtractedEnvSandbox(env);
    await out(sb, 'echo mine > /testbed/README.md && rm -r /opt/venv/bin/hello-env');
    const other = await createEnvSandbox(env);
    expect(await out(other, 'cat /testbed/README.md; test -e /opt/venv/bin/hello-env && echo present')).toBe('repo\npresent');
    await other.close();
    const dirs = readdirSync(path.dirname(sb.sandbox.privateDir)).filter((n) => n.startsWith('sbx-env'));
    await sb.close();
    const after = readdirSync(path.dirname(sb.sandbox.privateDir)).filter((n) => n.startsWith('sbx-env'));
    expect(after.length).toBe(dirs.length - 1);
    for (const l of [env.venv, env.repo!]) expect((await digestDirectory(l.path)).digest).toBe(treeDigests.get(l.digest));
  });

  it('the store holds one copy: a repo packed again is the same layer, and sandboxes add nothing to the store', async () => {
    const before = await store.du();
    const layersBefore = (await store.list()).length;
    const repo = await buildRepo(repoSrc, commit, { store });
    const again = await buildRepo(repoSrc, commit, { store });
    expect(again.layer.digest).toBe(repo.layer.digest);
    expect((await store.list()).length).toBeLessThanOrEqual(layersBefore + 1);
    const sbs = await Promise.all([1, 2, 3].map(() => createEnvSandbox(env)));
    await Promise.all(sbs.map((s) => out(s, 'python -c "import hello_pkg" && touch /testbed/new-file')));
    await Promise.all(sbs.map((s) => s.close()));
    const after = await store.du();
    expect(after.diskBytes - before.diskBytes).toBeLessThan(repo.archiveBytes! * 20 + (1 << 20));
    // Three sandboxes did not make three copies of the venv.
    expect(duBytes(path.join(store.root, 'layers', env.venv.digest))).toBeGreaterThan(0);
    expect(after.layers).toBe((await store.list()).length);
  });
});

describe.skipIf(!python)("the fast path: the base's packages, no archives, one env for many commits", () => {
  const tmp = tempDir('msbx-env-fast-');
  afterAll(() => tmp.remove());

  it('builds without ensurepip or archives and mounts another commit of the repo', async () => {
    const store = await openStore({ root: path.join(tmp.path, 'store') });
    const repoSrc = path.join(tmp.path, 'repo-src');
    const files = (answer: string) => ({
      name: 'testbed-mod',
      sourceRoot: 'src' as const,
      packages: ['testbed_mod'],
      files: { 'src/testbed_mod/__init__.py': `def answer():\n    return "${answer}"\n` },
    });
    const setup = gitRepo(repoSrc, files('setup'));
    writePackage(repoSrc, files('later'));
    const later = spawnSync('sh', ['-c', 'git add -A && git -c user.name=t -c user.email=t@t commit -qm later && git rev-parse HEAD'], { cwd: repoSrc, encoding: 'utf8' }).stdout.trim();
    const env = await buildEnv(
      // `pip install` (not python -m pip): the venv's own pip command must reach the base's pip.
      { python: python!.path, repo: { source: repoSrc, commit: setup }, steps: [{ run: 'pip install -q --no-build-isolation --no-deps -e .' }], systemSitePackages: true },
      { store, keepArchives: false, keepRepo: false },
    );
    expect(env.manifest.systemSitePackages).toBe(true);
    expect(env.archives).toEqual({});
    expect(env.manifest.venv.archive).toBeUndefined();
    expect(readdirSync(path.join(store.root, 'envs')).filter((n) => n === 'archives' || n.endsWith('.tar.zst'))).toEqual([]);
    expect(env.repo).toBeUndefined();
    expect(env.repoPath).toBe('/testbed');
    // No ensurepip when the base has pip: the venv holds no pip of its own.
    expect(readdirSync(path.join(env.venv.path, 'lib', readdirSync(path.join(env.venv.path, 'lib'))[0]!, 'site-packages')).some((n) => n.startsWith('pip'))).toBe(!python!.hasPip);

    const repo = await buildRepo(repoSrc, later, { store, keepArchive: false });
    expect(repo.archive).toBeUndefined();
    await using sb = await createEnvSandbox(env, { repo: repo.layer });
    expect(await out(sb, `pwd; python -c 'import testbed_mod; print(testbed_mod.answer())'`)).toBe('/testbed\nlater');
    expect(await out(sb, 'git rev-parse HEAD')).toBe(later);
  }, 300_000);
});

describe.skipIf(!python)('the recipe index: a recipe is built once', () => {
  const tmp = tempDir('msbx-env-index-');
  afterAll(() => tmp.remove());

  it('returns the env built before for the same recipe, and builds again when an input, the recipe or --rebuild says so', async () => {
    const store = await openStore({ root: path.join(tmp.path, 'store') });
    const pkg = path.join(tmp.path, 'pkg');
    writePackage(pkg, { name: 'index-pkg', packages: ['index_pkg'], files: { 'index_pkg/__init__.py': 'V = 1\n' } });
    const recipe = { python: python!.path, steps: [{ package: pkg }, { run: 'echo one' }], systemSitePackages: true };
    const opts = { store, keepArchives: false };

    const first = await buildEnv({ ...recipe, name: 'first' }, opts);
    expect(first.reused).toBeUndefined();
    const layers = (await store.list()).length;
    // The name and the step timeout are not part of the recipe's key.
    const again = await buildEnv({ ...recipe, name: 'again', stepTimeoutMs: 60_000 }, opts);
    expect([again.id, again.reused]).toEqual([first.id, true]);
    expect((await store.list()).length).toBe(layers);
    expect((await listEnvs({ store })).map((e) => e.id)).toEqual([first.id]);

    // Concurrent builds of a new recipe: one builds, the other waits for it and reuses it.
    const racing = { ...recipe, steps: [...recipe.steps, { run: 'echo racing' }] };
    const [a, b] = await Promise.all([buildEnv(racing, opts), buildEnv(racing, opts)]);
    expect(a.id).toBe(b.id);
    expect([a.reused, b.reused].filter(Boolean)).toEqual([true]);

    // Another step, or the same package with other content, is another recipe.
    const otherStep = await buildEnv({ ...recipe, steps: [{ package: pkg }, { run: 'echo two' }] }, opts);
    expect(otherStep.reused).toBeUndefined();
    writeFileSync(path.join(pkg, 'index_pkg', '__init__.py'), 'V = 2\n');
    const changed = await buildEnv(recipe, opts);
    expect(changed.reused).toBeUndefined();
    await using sb = await createEnvSandbox(changed);
    expect(await out(sb, `python -c 'import index_pkg; print(index_pkg.V)'`)).toBe('2');

    // rebuild: built again, and the index now names the new build.
    const rebuilt = await buildEnv(recipe, { ...opts, rebuild: true });
    expect(rebuilt.reused).toBeUndefined();
    expect((await buildEnv(recipe, opts)).manifest.created).toBe(rebuilt.manifest.created);

    // An env removed since is built again, not handed out half-gone.
    await removeEnv(rebuilt.id, { store });
    const afterRemove = await buildEnv(recipe, opts);
    expect(afterRemove.reused).toBeUndefined();
    expect((await loadEnv(afterRemove.id, { store })).id).toBe(afterRemove.id);
  }, 300_000);
});

describe.skipIf(!python)('stepVariables: build-step variables outside the recipe', () => {
  const tmp = tempDir('msbx-env-stepvars-');
  afterAll(() => tmp.remove());

  it('reach every step, are not part of the key (another value reuses the env), and may not shadow recipe.env', async () => {
    const store = await openStore({ root: path.join(tmp.path, 'store') });
    const recipe = { python: python!.path, steps: [{ run: 'echo "index=$PIP_INDEX_URL" > /opt/venv/seen' }], systemSitePackages: true, network: 'host' as const };
    const first = await buildEnv(recipe, { store, keepArchives: false, stepVariables: { PIP_INDEX_URL: 'http://127.0.0.1:40001/simple' } });
    expect(first.reused).toBeUndefined();
    await using sb = await createEnvSandbox(first);
    expect(await out(sb, 'cat /opt/venv/seen')).toBe('index=http://127.0.0.1:40001/simple');

    const otherPort = await buildEnv(recipe, { store, keepArchives: false, stepVariables: { PIP_INDEX_URL: 'http://127.0.0.1:40002/simple' } });
    expect([otherPort.id, otherPort.reused]).toEqual([first.id, true]);
    const none = await buildEnv(recipe, { store, keepArchives: false });
    expect([none.id, none.reused]).toEqual([first.id, true]);

    await expect(buildEnv({ ...recipe, env: { PIP_INDEX_URL: 'x' } }, { store, stepVariables: { PIP_INDEX_URL: 'y' } })).rejects.toThrow(
      /stepVariables\.PIP_INDEX_URL: recipe\.env sets it too/,
    );
    await expect(buildEnv(recipe, { store, stepVariables: { 'A=B': 'y' } })).rejects.toThrow(/stepVariables\.A=B: must be a name with a string value/);
  }, 300_000);
});

describe.skipIf(!python)('env build errors', () => {
  const tmp = tempDir('msbx-env-err-');
  afterAll(() => tmp.remove());

  it('a failing step names the step and shows its output', async () => {
    const store = await openStore({ root: path.join(tmp.path, 'store') });
    await expect(buildEnv({ python: python!.path, steps: [{ run: 'echo boom >&2; exit 3' }] }, { store })).rejects.toThrow(
      /step 0 \(run "echo boom >&2; exit 3"\) failed \(exit 3\):\nboom/,
    );
    // Nothing half-built is left: no env, no build directory.
    expect(await listEnvs({ store })).toEqual([]);
    expect(readdirSync(path.join(store.root, 'envs', 'build'))).toEqual([]);
  }, 120_000);

  it('a missing local package fails before anything is built', async () => {
    const store = await openStore({ root: path.join(tmp.path, 'store2') });
    await expect(buildEnv({ python: python!.path, steps: [{ package: path.join(tmp.path, 'nope') }] }, { store })).rejects.toThrow(EnvError);
  });
});

describe('recipe and interpreter checks (no build)', () => {
  const tmp = tempDir('msbx-env-chk-');
  afterAll(() => tmp.remove());
  it('refuses bad recipes with the field and the reason', async () => {
    const store = await openStore({ root: path.join(tmp.path, 'store') });
    const bad: [object, RegExp][] = [
      [{ python: 'three' }, /recipe.python|not an absolute path or a version/],
      [{ python: '3.11', venvPath: 'rel/venv' }, /recipe.venvPath: .* must be an absolute path/],
      [{ python: '3.11', venvPath: '/tmp/venv' }, /inside \/tmp, which the sandbox itself provides/],
      [{ python: '3.11', steps: [{ editable: '.' }] }, /editable install needs recipe.repo/],
      [{ python: '3.11', steps: [{ frobnicate: 1 }] }, /is not one of/],
      [{ python: '/nonexistent/python3' }, /python \/nonexistent\/python3: not usable as a venv base: cannot run it/],
      [{ python: '1.2' }, /python 1.2: no usable interpreter found/],
      [{ python: '3.11', network: 'lan' }, /recipe.network: "lan" must be 'none' or 'host'/],
      [{ python: '3.11', systemSitePackages: 'yes' }, /recipe.systemSitePackages: "yes" must be true or false/],
      [{ python: '3.11', stepTimeoutMs: -1 }, /recipe.stepTimeoutMs: -1 must be a positive number/],
    ];
    for (const [recipe, re] of bad) await expect(buildEnv(recipe as never, { store })).rejects.toThrow(re);
    await expect(loadEnv('../../etc/passwd', { store })).rejects.toThrow(/not an env id/);
  });
});
