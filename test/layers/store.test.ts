import { execFileSync } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, statSync, symlinkSync, utimesSync, writeFileSync, chmodSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { packDirectory } from '../../lib/files/index.js';
import { defaultStoreRoot, openStore } from '../../lib/layers/index.js';
import { py, tmpDir, writeTree } from './helpers.js';

const t = tmpDir('store');
afterAll(() => t.cleanup());

function allWritable(dir: string): string[] {
  return execFileSync('find', [dir, '-perm', '/222', '!', '-type', 'l'], { encoding: 'utf8' }).split('\n').filter(Boolean);
}

describe('layer store', () => {
  it('default root follows XDG_CACHE_HOME, then ~/.cache', () => {
    const old = process.env.XDG_CACHE_HOME;
    process.env.XDG_CACHE_HOME = '/x/cache';
    expect(defaultStoreRoot()).toBe('/x/cache/minisandbox/store');
    delete process.env.XDG_CACHE_HOME;
    expect(defaultStoreRoot()).toMatch(/\/\.cache\/minisandbox\/store$/);
    if (old !== undefined) process.env.XDG_CACHE_HOME = old;
  });

  it('adds an archive once, read-only, with a manifest next to the tree', async () => {
    const src = path.join(t.dir, 'src1');
    writeTree(src, { 'bin/run': { content: '#!/bin/sh\n', mode: 0o4755 }, 'lib/a.py': 'a = 1\n', 'lib/empty.py': '' });
    symlinkSync('/etc', path.join(src, 'etc-link'));
    const archive = path.join(t.dir, 'one.tar.zst');
    await packDirectory(src, archive);
    const store = await openStore({ root: path.join(t.dir, 'store1') });
    const layer = await store.addArchive(archive, { name: 'one' });
    const digest = execFileSync('sha256sum', [archive], { encoding: 'utf8' }).split(' ')[0];
    expect(layer.digest).toBe(digest);
    expect(layer.path).toBe(path.join(t.dir, 'store1', 'layers', digest!, 'tree'));
    expect(layer.manifest).toMatchObject({ digest, source: 'one', sourceKind: 'archive', fileCount: 3, size: 16 });
    expect(readdirSync(layer.path).sort()).toEqual(['bin', 'etc-link', 'lib']); // no manifest inside the mounted tree
    expect(allWritable(layer.path)).toEqual([]);
    expect(statSync(path.join(layer.path, 'bin', 'run')).mode & 0o7777).toBe(0o555); // setuid stripped
    expect(lstatSync(path.join(layer.path, 'etc-link')).isSymbolicLink()).toBe(true);
    // Second add: same layer, no rebuild (created unchanged).
    const again = await store.addArchive(archive);
    expect(again.manifest.created).toBe(layer.manifest.created);
    expect((await store.get(`sha256:${digest}`))?.path).toBe(layer.path);
    expect((await store.list()).map((l) => l.digest)).toEqual([digest]);
  });

  it('a hostile archive leaves no layer and no staging behind', async () => {
    const bad = path.join(t.dir, 'bad.tar');
    py(
      `import tarfile,io,sys
with tarfile.open(sys.argv[1],'w') as tf:
    i=tarfile.TarInfo('ok'); i.size=1; tf.addfile(i, io.BytesIO(b'x'))
    i=tarfile.TarInfo('../etc/passwd'); i.size=1; tf.addfile(i, io.BytesIO(b'x'))`,
      [bad],
    );
    const root = path.join(t.dir, 'store-bad');
    const store = await openStore({ root });
    await expect(store.addArchive(bad)).rejects.toThrow(`layer archive ${bad}: member ../etc/passwd has a '..' component and escapes the layer`);
    expect(readdirSync(path.join(root, 'layers'))).toEqual([]);
    expect(readdirSync(path.join(root, 'staging'))).toEqual([]);
  });

  it('dedups identical files across layers, but not files differing only in mode or mtime; du reports the saving', async () => {
    const root = path.join(t.dir, 'store-dedup');
    const store = await openStore({ root });
    const big = 'z'.repeat(64 * 1024);
    const mk = (name: string, extra: Record<string, string>) => {
      const d = path.join(t.dir, name);
      writeTree(d, { 'shared/big.bin': big, 'shared/small.txt': 'same\n', 'mode.sh': 'echo\n', 'mtime.txt': 'm\n', ...extra });
      for (const f of ['shared/big.bin', 'shared/small.txt', 'mode.sh', 'mtime.txt']) utimesSync(path.join(d, f), 1600000000, 1600000000);
      return d;
    };
    const a = mk('dd-a', { 'only-a.txt': 'a' });
    const b = mk('dd-b', { 'only-b.txt': 'b' });
    chmodSync(path.join(b, 'mode.sh'), 0o755); // differs only in mode
    utimesSync(path.join(b, 'mtime.txt'), 1600000001, 1600000001); // differs only in mtime
    const la = await store.addDirectory(a);
    const lb = await store.addDirectory(b);
    expect(la.digest).not.toBe(lb.digest);
    const ino = (l: { path: string }, f: string) => statSync(path.join(l.path, f)).ino;
    expect(ino(la, 'shared/big.bin')).toBe(ino(lb, 'shared/big.bin'));
    expect(ino(la, 'shared/small.txt')).toBe(ino(lb, 'shared/small.txt'));
    expect(ino(la, 'mode.sh')).not.toBe(ino(lb, 'mode.sh'));
    expect(ino(la, 'mtime.txt')).not.toBe(ino(lb, 'mtime.txt'));
    expect(statSync(path.join(lb.path, 'mtime.txt')).mtimeMs).toBe(1600000001000);
    expect(lb.manifest.dedup).toMatchObject({ linked: 2 });
    const du = await store.du();
    console.log(`[du] ${JSON.stringify(du)}`);
    expect(du.layers).toBe(2);
    expect(du.savedBytes).toBeGreaterThanOrEqual(64 * 1024);
    expect(du.diskBytes).toBeLessThan(du.undedupedDiskBytes);

    // remove one layer: the other still has its files; gc then drops objects nobody uses.
    expect(await store.remove(la.digest)).toBe(true);
    expect(await store.remove(la.digest)).toBe(false);
    expect(readFileSync(path.join(lb.path, 'shared', 'big.bin'), 'utf8')).toBe(big);
    const g1 = await store.gc({ inUse: [lb.digest] });
    expect(g1.removedLayers).toEqual([]);
    expect(g1.removedObjects).toBeGreaterThan(0); // la's own files (only-a, mode.sh, mtime.txt)
    expect((await store.get(lb.digest))?.digest).toBe(lb.digest);
    const g2 = await store.gc({ inUse: [] });
    expect(g2.removedLayers).toEqual([lb.digest]);
    expect((await store.du()).objects).toBe(0);
  });

  it('directory digests are canonical: same tree, same digest; a changed mtime, another', async () => {
    const store = await openStore({ root: path.join(t.dir, 'store-dir') });
    const d1 = path.join(t.dir, 'canon');
    writeTree(d1, { 'x/y.txt': 'y', 'z.txt': 'z' });
    utimesSync(path.join(d1, 'z.txt'), 1600000000, 1600000000);
    const l1 = await store.addDirectory(d1);
    const l1b = await store.addDirectory(d1);
    expect(l1b.digest).toBe(l1.digest);
    utimesSync(path.join(d1, 'z.txt'), 1600000005, 1600000005);
    const l2 = await store.addDirectory(d1);
    expect(l2.digest).not.toBe(l1.digest);
  });

  it('gc and remove never follow symlinks out of the store, and refuse non-digest names', async () => {
    const root = path.join(t.dir, 'store-sym');
    const store = await openStore({ root });
    const victim = path.join(t.dir, 'victim');
    writeTree(victim, { 'keep.txt': 'precious' });
    // A layer whose tree holds symlinks to the victim (absolute and relative).
    const src = path.join(t.dir, 'sym-src');
    writeTree(src, { 'f.txt': 'f' });
    symlinkSync(victim, path.join(src, 'abs'));
    symlinkSync(path.relative(src, victim), path.join(src, 'rel'));
    const layer = await store.addDirectory(src);
    // And a symlink planted where a layer would be.
    const fake = 'f'.repeat(64);
    symlinkSync(victim, path.join(root, 'layers', fake));
    await expect(store.remove('../../victim')).rejects.toThrow(/layer digest "..\/..\/victim": not a sha256 hex digest/);
    expect(await store.remove(fake)).toBe(true);
    await store.gc({ inUse: [] });
    expect(readFileSync(path.join(victim, 'keep.txt'), 'utf8')).toBe('precious');
    expect(statSync(victim).mode & 0o222).not.toBe(0); // not chmodded either
    expect(existsSync(layer.dir)).toBe(false);
    expect(readdirSync(path.join(root, 'layers'))).toEqual([]);
  });

  it('pins: gc keeps what a pin names, remove refuses it, unpin lets it go; a missing layer cannot be pinned', async () => {
    const root = path.join(t.dir, 'store-pins');
    const store = await openStore({ root });
    const add = async (name: string, pin?: string) => {
      const dir = path.join(t.dir, `pin-src-${name}`);
      writeTree(dir, { [`${name}.txt`]: name });
      return store.addDirectory(dir, pin ? { pin } : {});
    };
    const [a, b, c] = [await add('a'), await add('b'), await add('c', 'app two')];
    await store.pin('app one', [a.digest], { label: 'app one (test)' });
    expect((await store.pins()).map((p) => [p.owner, p.label, p.digests])).toEqual([
      ['app one', 'app one (test)', [a.digest]],
      ['app two', 'app two', [c.digest]],
    ]);
    await expect(store.remove(a.digest)).rejects.toThrow(`remove layer ${a.digest}: in use by app one (test); unpin it first`);

    const g1 = await store.gc();
    expect(g1.removedLayers).toEqual([b.digest]);
    expect(g1.busyLayers).toEqual([]);
    expect((await store.list()).map((l) => l.digest).sort()).toEqual([a.digest, c.digest].sort());

    // Pins add up; a layer not in the store is refused by name and changes nothing.
    await store.pin('app one', [c.digest]);
    expect((await store.pins())[0]).toMatchObject({ owner: 'app one', label: 'app one (test)', digests: [a.digest, c.digest].sort() });
    await expect(store.pin('app one', [b.digest])).rejects.toThrow(`pin "app one": layer ${b.digest} is not in the store ${root}`);
    expect((await store.pins())[0]!.digests).toEqual([a.digest, c.digest].sort());
    await expect(store.pin('', [a.digest])).rejects.toThrow('pin owner "": must be a non-empty string');

    expect(await store.unpin('app one')).toBe(true);
    expect(await store.unpin('app one')).toBe(false);
    expect((await store.gc()).removedLayers).toEqual([a.digest]); // c is still app two's
    expect(await store.unpin('app two')).toBe(true);
    expect((await store.gc()).removedLayers).toEqual([c.digest]);
    expect(readdirSync(path.join(root, 'layers'))).toEqual([]);
  });

  it('hold: a reader pin (this process only) keeps layers through gc and remove, unpin lets them go; a missing layer is refused', async () => {
    const root = path.join(t.dir, 'store-hold');
    const store = await openStore({ root });
    const dir = path.join(t.dir, 'hold-src');
    writeTree(dir, { 'h.txt': 'h' });
    const a = await store.addDirectory(dir);
    const pin = await store.hold('reader 1', [a.digest], { label: 'a reader' });
    expect(pin.process?.pid).toBe(process.pid);
    expect((await store.gc()).removedLayers).toEqual([]);
    await expect(store.remove(a.digest)).rejects.toThrow(`remove layer ${a.digest}: in use by a reader; unpin it first`);
    await expect(store.hold('reader 2', ['0'.repeat(64)])).rejects.toThrow(`hold "reader 2": layer ${'0'.repeat(64)} is not in the store ${root}`);
    expect(await store.unpin('reader 1')).toBe(true);
    expect((await store.gc()).removedLayers).toEqual([a.digest]);
  });

  it('gc removes staging dirs of dead processes only', async () => {
    const root = path.join(t.dir, 'store-gc');
    const store = await openStore({ root });
    const dead = path.join(root, 'staging', `${'a'.repeat(64)}.999999-1.0bad`);
    mkdirSync(path.join(dead, 'tree', 'sub'), { recursive: true });
    writeFileSync(path.join(dead, 'tree', 'sub', 'x'), 'x');
    chmodSync(path.join(dead, 'tree', 'sub'), 0o555);
    const r = await store.gc({ inUse: [] });
    expect(r.removedStaging).toBe(1);
    expect(existsSync(dead)).toBe(false);
  });
});
