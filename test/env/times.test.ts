/**
 * Fixed times in layers (lib/layers/times.ts): every entry at LAYER_EPOCH,
 * byte-compiled files still valid for Python, and identical files of two
 * builds stored once.
 */
import { spawnSync } from 'node:child_process';
import { lstatSync, mkdirSync, readdirSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { buildEnv, createEnvSandbox } from '../../lib/env/index.js';
import { LAYER_EPOCH, normalizeTimes, openStore } from '../../lib/layers/index.js';
import { tempDir } from '../helpers.js';
import { basePython, writePackage } from './fixtures.js';

const { python, reason } = basePython();
if (reason) console.warn(`[times] SKIP: ${reason}`);

function walk(dir: string): string[] {
  const out: string[] = [];
  for (const name of readdirSync(dir)) {
    const p = path.join(dir, name);
    out.push(p);
    if (lstatSync(p).isDirectory()) out.push(...walk(p));
  }
  return out;
}

/** What `python -v` says about importing `mod` from `dir` without writing bytecode: which cache it used, or why not. */
function importVerbose(dir: string, mod: string): string {
  const r = spawnSync(python!.path, ['-v', '-B', '-c', `import ${mod}`], { cwd: dir, env: { PYTHONPATH: dir }, encoding: 'utf8' });
  expect(r.status, r.stderr).toBe(0);
  return r.stderr.split('\n').filter((l) => l.includes(mod)).join('\n');
}

describe.skipIf(!python)('normalizeTimes', () => {
  const tmp = tempDir('msbx-times-');
  afterAll(() => tmp.remove());

  it('sets every entry to LAYER_EPOCH and keeps timestamp, checked and unchecked .pyc files valid', async () => {
    const tree = path.join(tmp.path, 'tree');
    mkdirSync(path.join(tree, 'pkg'), { recursive: true });
    const modes = { 'stamp.py': 'TIMESTAMP', 'checked.py': 'CHECKED_HASH', 'unchecked.py': 'UNCHECKED_HASH', 'pkg/__init__.py': 'TIMESTAMP' };
    for (const f of Object.keys(modes)) writeFileSync(path.join(tree, f), `VALUE = ${JSON.stringify(f)}\n`);
    symlinkSync('/nonexistent/target', path.join(tree, 'dangling'));
    // Sources written "at build time", an hour ago: the timestamp .pyc files record that time.
    const hourAgo = Date.now() / 1000 - 3600;
    for (const [f, mode] of Object.entries(modes)) {
      utimesSync(path.join(tree, f), hourAgo, hourAgo);
      const c = spawnSync(python!.path, ['-c', `import py_compile as p; p.compile(${JSON.stringify(f)}, invalidation_mode=p.PycInvalidationMode.${mode}, doraise=True)`], { cwd: tree, encoding: 'utf8' });
      expect(c.status, c.stderr).toBe(0);
    }
    expect(importVerbose(tree, 'stamp')).toContain('matches');

    const r = await normalizeTimes(tree);
    expect(r.pycRewritten).toBe(2); // the two timestamp-based ones; hash-based ones need nothing
    for (const p of [tree, ...walk(tree)]) expect([p, Math.round(lstatSync(p).mtimeMs / 1000)]).toEqual([p, LAYER_EPOCH]);
    // Each import uses its cached bytecode: no "bytecode is stale".
    for (const m of ['stamp', 'checked', 'unchecked', 'pkg']) {
      const said = importVerbose(tree, m);
      expect(said, m).toMatch(/matches|code object from/);
      expect(said, m).not.toMatch(/stale/);
    }
  });

  it('two envs holding the same package, built at different times, store its files once', async () => {
    const store = await openStore({ root: path.join(tmp.path, 'store') });
    const pkg = path.join(tmp.path, 'shared-pkg');
    const body = 'X = 1\n' + '# padding\n'.repeat(2000);
    writePackage(pkg, { name: 'shared-pkg', packages: ['shared_pkg'], files: { 'shared_pkg/__init__.py': body, 'shared_pkg/more.py': body + '# more\n' } });
    const build = (step: string, normalizeTimes: boolean) =>
      buildEnv({ python: python!.path, steps: [{ package: pkg }, { run: step }] }, { store, keepArchives: false, normalizeTimes });
    const sharedFiles = async (a: string, b: string) => {
      const ino = (p: string) => lstatSync(p).ino;
      const files = walk(a).filter((p) => lstatSync(p).isFile() && lstatSync(p).size > 0);
      return files.filter((p) => ino(p) === ino(path.join(b, path.relative(a, p)))).length;
    };

    const oldA = await build('echo a', false);
    await new Promise((r) => setTimeout(r, 1100)); // another second: another mtime for every file
    const oldB = await build('echo b', false);
    const newA = await build('echo a', true);
    await new Promise((r) => setTimeout(r, 1100));
    const newB = await build('echo b', true);
    const installed = (l: typeof oldA) => path.join(l.venv.path, 'lib', readdirSync(path.join(l.venv.path, 'lib'))[0]!, 'site-packages', 'shared_pkg');

    // With the builds' own times the package's files are separate copies, with one time they are the same inodes.
    expect(await sharedFiles(installed(oldA), installed(oldB))).toBe(0);
    const files = walk(installed(newA)).filter((p) => lstatSync(p).isFile()).length;
    expect(files).toBeGreaterThanOrEqual(4); // two modules and their .pyc
    expect(await sharedFiles(installed(newA), installed(newB))).toBe(files);
    expect(newB.venv.manifest.dedup!.savedBytes).toBeGreaterThan(2 * body.length);

    // The shared .pyc files are valid in the sandbox: importing writes no new bytecode.
    await using sb = await createEnvSandbox(newB);
    const r = await sb.exec(['python', '-v', '-c', 'import shared_pkg.more']);
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stderr).toMatch(/shared_pkg\/__pycache__\/more\.[^ ]*\.pyc matches/);
    expect(r.stderr).not.toMatch(/stale|# wrote/);
  }, 300_000);
});
