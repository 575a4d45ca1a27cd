/**
 * The store's finishing in workers (lib/layers/finish.ts) must store exactly
 * what the reference path of five walks stored: the same manifest fields,
 * listing.jsonl bytes, dedup decisions and objects, modes and link counts,
 * and the same errors. Each test builds the same layers with both and
 * compares what is on disk.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, cpSync, linkSync, mkdirSync, readFileSync, statSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { packDirectory } from '../../lib/files/index.js';
import { finishTree, finishTreeByWalks, stopFinishWorkers, treeListingInWorkers } from '../../lib/layers/finish.js';
import { treeListing } from '../../lib/layers/verify.js';
import { openStore, type Layer } from '../../lib/layers/index.js';
import { tmpDir, transpiledLayers, writeTree } from './helpers.js';

const t = tmpDir('finish');
afterAll(() => {
  stopFinishWorkers();
  t.cleanup();
});

const PREFIX = '/opt/build/venv';

/** A tree with what finishing must get right: modes and set-id bits, hard links, symlinks, prefix matches and near-misses, .pyc, big files, names whose UTF-16 and UTF-8 orders differ. */
function makeSource(dir: string): void {
  writeTree(dir, {
    'bin/python': { content: `#!${PREFIX}/bin/python3\n`, mode: 0o4755 },
    'bin/tool': { content: `#!/bin/sh\nexec ${PREFIX}/bin/python -m tool "$@"\n`, mode: 0o2775 },
    'lib/a.py': 'a = 1\n',
    'lib/same1.py': 'shared = True\n',
    'lib/sub/same2.py': 'shared = True\n',
    'lib/private.py': { content: 'secret = 1\n', mode: 0o600 },
    'lib/readonly.py': { content: 'x = 2\n', mode: 0o444 },
    'lib/empty.py': '',
    'lib/empty2.py': '',
    'lib/near.txt': `${PREFIX}2/not-a-match\n`,
    'lib/text.cfg': `home = ${PREFIX}\n`,
    'lib/__pycache__/a.cpython-311.pyc': `\x00\x01${PREFIX}/lib/a.py`,
    'lib/ext.so': `\x7fELF\x00\x00RUNPATH=${PREFIX}/lib\x00\x00`,
    'data/\u00e9t\u00e9.txt': 'accented\n',
    'data/\uFB01.txt': 'ligature (U+FB01, sorts after an astral name in UTF-8, before it in UTF-16)\n',
    'data/\u{1F600}.txt': 'astral\n',
    'data/Z.txt': 'upper\n',
  });
  writeFileSync(path.join(dir, 'lib/big.bin'), Buffer.alloc(3 << 20, 7)); // > the workers' 1 MiB buffer
  writeFileSync(path.join(dir, 'lib/big-prefix.bin'), Buffer.concat([Buffer.alloc(2 << 20, 1), Buffer.from(`\x00${PREFIX}/lib\x00`)]));
  linkSync(path.join(dir, 'lib/a.py'), path.join(dir, 'lib/a-hardlink.py'));
  symlinkSync(`${PREFIX}/bin/python`, path.join(dir, 'bin/python3'));
  symlinkSync('/etc', path.join(dir, 'etc-link'));
  symlinkSync('python', path.join(dir, 'bin/py'));
  mkdirSync(path.join(dir, 'shared-dir'));
  chmodSync(path.join(dir, 'shared-dir'), 0o2775);
  mkdirSync(path.join(dir, 'empty-dir'));
  // mtime is part of the dedup key: two files written one after the other
  // may fall on either side of a clock tick, so the pair meant to be merged
  // gets one time.
  const t0 = new Date('2020-01-01T00:00:00Z');
  for (const f of ['lib/same1.py', 'lib/sub/same2.py']) utimesSync(path.join(dir, f), t0, t0);
}

interface Stored {
  manifest: Record<string, unknown>;
  listing: string;
  /** Every object: name, link count, mode. */
  objects: string;
  /** Every entry of every layer: path, type, mode, link count (file size and mtime for files). */
  trees: string;
}

function snapshot(root: string, layers: Layer[]): Stored[] {
  const sh = (cmd: string): string => execFileSync('sh', ['-c', cmd], { encoding: 'utf8' });
  const objects = sh(`cd ${root}/objects && find . -type f -printf '%P %n %m\\n' | sort`);
  return layers.map((l) => {
    const { created: _c, source: _s, ...manifest } = l.manifest as unknown as Record<string, unknown>;
    return {
      manifest,
      listing: readFileSync(path.join(l.dir, 'listing.jsonl'), 'utf8'),
      objects,
      trees: sh(`cd ${l.path} && (find . -type f -printf '%P f %m %n %s %T@\\n'; find . ! -type f -printf '%P %y %m %l\\n') | sort`),
    };
  });
}

/** Adds `steps` to a fresh store finished one way, and snapshots what is stored. */
async function build(how: 'walks' | 'workers', steps: Array<{ dir: string; prefix?: string }>, dedup: { maxLinks?: number; minSize?: number } = {}): Promise<Stored[]> {
  const root = path.join(t.dir, `store-${how}-${Math.random().toString(36).slice(2)}`);
  const store = await openStore({ root, budget: false, finish: how, dedup });
  const layers: Layer[] = [];
  for (const [i, s] of steps.entries()) {
    const archive = path.join(t.dir, `${path.basename(root)}-${i}.tar.zst`);
    await packDirectory(s.dir, archive);
    layers.push(await store.addArchive(archive, { name: `layer-${i}`, ...(s.prefix ? { prefix: s.prefix } : {}) }));
    // A directory source too: the same content under another digest, linked to the first layer's objects.
    layers.push(await store.addDirectory(s.dir, { name: `dir-${i}`, ...(s.prefix ? { prefix: s.prefix } : {}) }));
  }
  return snapshot(root, layers);
}

describe('layer finishing in workers', () => {
  const src = path.join(t.dir, 'src');
  makeSource(src);
  // A second tree sharing part of the first: some files link to existing objects, some are new.
  const src2 = path.join(t.dir, 'src2');
  cpSync(src, src2, { recursive: true, verbatimSymlinks: true, preserveTimestamps: true });
  writeFileSync(path.join(src2, 'lib/a.py'), 'a = 2\n');
  writeFileSync(path.join(src2, 'lib/new.py'), 'new = 1\n');

  it('stores what the reference path stores: manifests, listing bytes, dedup decisions, objects, modes, links', async () => {
    const steps = [{ dir: src, prefix: PREFIX }, { dir: src2 }];
    const [walks, workers] = [await build('walks', steps), await build('workers', steps)];
    expect(workers.map((s) => s.manifest)).toEqual(walks.map((s) => s.manifest));
    for (const [i, w] of workers.entries()) {
      expect(w.listing).toBe(walks[i]!.listing);
      expect(w.trees).toBe(walks[i]!.trees);
    }
    expect(workers[0]!.objects).toBe(walks[0]!.objects);
    // The comparison means something: the tree has what it is meant to exercise.
    const m = workers[0]!.manifest as { prefixFiles: Array<{ path: string; kind: string }>; dedup: { files: number; linked: number } };
    expect(m.prefixFiles).toEqual([
      { path: 'bin/python', kind: 'text' },
      { path: 'bin/python3', kind: 'symlink' },
      { path: 'bin/tool', kind: 'text' },
      { path: 'lib/big-prefix.bin', kind: 'binary' },
      { path: 'lib/ext.so', kind: 'binary' },
      { path: 'lib/text.cfg', kind: 'text' },
    ]);
    expect(m.dedup.linked).toBeGreaterThan(0); // same1/same2 within the tree
    expect((workers[1]!.manifest as { dedup: { linked: number } }).dedup.linked).toBe(m.dedup.files); // the directory copy: every file linked
    const names = workers[0]!.listing.split('\n').filter(Boolean).map((l) => (JSON.parse(l) as string[])[0]!).filter((p) => p.startsWith('data/'));
    expect(names).toEqual(['data/Z.txt', 'data/\u00e9t\u00e9.txt', 'data/\uFB01.txt', 'data/\u{1F600}.txt']);
    expect(workers[0]!.listing).toContain('["bin/python","f","555",'); // write and set-id bits off
    expect(workers[0]!.listing).toContain('["lib/private.py","f","400",');
  });

  it('takes the same dedup decisions at the maxLinks and minSize limits', async () => {
    const steps = [{ dir: src }, { dir: src2 }];
    const opts = { maxLinks: 3, minSize: 8 };
    const [walks, workers] = [await build('walks', steps, opts), await build('workers', steps, opts)];
    expect(workers.map((s) => s.manifest)).toEqual(walks.map((s) => s.manifest));
    expect(workers.map((s) => s.trees)).toEqual(walks.map((s) => s.trees));
    expect(workers[0]!.objects).toBe(walks[0]!.objects);
    expect(workers[0]!.objects).toMatch(/ 3 /); // some object reached maxLinks
  });

  it('fails with the reference path\'s error: an object store on another filesystem', async () => {
    const other = execFileSync('stat', ['-f', '-c', '%T', '/dev/shm'], { encoding: 'utf8' }).trim();
    const here = execFileSync('stat', ['-f', '-c', '%T', t.dir], { encoding: 'utf8' }).trim();
    if (other === here) return void expect.soft(`${t.dir} and /dev/shm are one filesystem type`).toBeTruthy();
    const objectsDir = path.join(os.tmpdir() === '/dev/shm' ? t.dir : '/dev/shm', `msb-finish-objects-${process.pid}`);
    mkdirSync(objectsDir, { recursive: true });
    const errors: string[] = [];
    for (const f of [finishTreeByWalks, finishTree]) {
      const tree = path.join(t.dir, `exdev-${f.name}`);
      cpSync(src, tree, { recursive: true, verbatimSymlinks: true });
      const err = (await f(tree, { objectsDir, dedup: {} }).catch((e: unknown) => e)) as Error;
      expect(err.constructor.name).toBe('LayerError');
      errors.push(err.message.replace(tree, 'TREE'));
    }
    execFileSync('rm', ['-rf', objectsDir]);
    expect(errors[1]).toBe(errors[0]);
    expect(errors[0]).toMatch(/object store .* is on another filesystem/);
  });

  it.skipIf(process.getuid?.() === 0)('fails with the reference path\'s error: a file the builder cannot read (unprivileged only: root reads it)', async () => {
    const errors: Array<{ message: string; code: unknown }> = [];
    for (const f of [finishTreeByWalks, finishTree]) {
      const tree = path.join(t.dir, `unreadable-${f.name}`);
      mkdirSync(path.join(tree, 'lib'), { recursive: true });
      writeFileSync(path.join(tree, 'lib/locked.py'), 'x = 1\n');
      chmodSync(path.join(tree, 'lib/locked.py'), 0o000);
      const objectsDir = path.join(t.dir, `objects-${f.name}`);
      const err = (await f(tree, { objectsDir, dedup: {} }).catch((e: unknown) => e)) as NodeJS.ErrnoException;
      errors.push({ message: err.message.replace(tree, 'TREE'), code: err.code });
    }
    expect(errors[1]).toEqual(errors[0]);
    expect(errors[0]!.code).toBe('EACCES');
  });

  it('does not keep the process alive once finished (idle workers are unreferenced)', () => {
    const lib = transpiledLayers(path.join(t.dir, 'transpiled'));
    const tree = path.join(t.dir, 'alive-tree');
    cpSync(src, tree, { recursive: true, verbatimSymlinks: true });
    const script = `import { finishTree } from ${JSON.stringify(path.join(lib, 'layers', 'finish.js'))};
      const r = await finishTree(${JSON.stringify(tree)}, { objectsDir: ${JSON.stringify(path.join(t.dir, 'alive-objects'))}, dedup: {} });
      console.log(r.counts.files);`;
    const started = Date.now();
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe(execFileSync('sh', ['-c', `find ${tree} -type f | wc -l`], { encoding: 'utf8' }).trim());
    // The pool stops idle workers after 10 s; the process must not wait for that.
    expect(Date.now() - started).toBeLessThan(8_000);
    // A tree of one directory: most workers are never called (store verify of a small layer, as the CLI runs it).
    const small = path.join(t.dir, 'alive-small');
    writeTree(small, { 'only.txt': 'x' });
    const listing = `import { treeListingInWorkers } from ${JSON.stringify(path.join(lib, 'layers', 'finish.js'))};
      console.log((await treeListingInWorkers(${JSON.stringify(small)})).files);`;
    const t0 = Date.now();
    const r2 = spawnSync(process.execPath, ['--input-type=module', '-e', listing], { encoding: 'utf8', timeout: 20_000 });
    expect(r2.stderr).toBe('');
    expect(r2.stdout.trim()).toBe('1');
    expect(Date.now() - t0).toBeLessThan(8_000);
  });
});

describe('finishing with content hashes made during the unpack', () => {
  const src = path.join(t.dir, 'known-src');
  makeSource(src);
  const sha = (s: string) => createHash('sha256').update(s).digest('hex');
  const entryOf = (listing: string, rel: string) => listing.split('\n').find((l) => l.startsWith(`[${JSON.stringify(rel)},`));

  it('takes a known digest instead of reading the file, unless the size differs or the prefix scan reads it anyway', async () => {
    // Deliberately wrong digests: only a digest that was not read shows up in the listing.
    const fake = 'f'.repeat(64);
    const known = new Map([
      ['lib/a.py', { sha256: fake, size: 6 }], // right size: taken (read only for a prefix scan)
      ['lib/private.py', { sha256: fake, size: 999 }], // wrong size: read
      ['lib/__pycache__/a.cpython-311.pyc', { sha256: fake, size: `\x00\x01${PREFIX}/lib/a.py`.length }], // never scanned: taken
    ]);
    for (const prefix of [undefined, PREFIX]) {
      const tree = path.join(t.dir, `known-tree-${prefix ? 'scan' : 'plain'}`);
      cpSync(src, tree, { recursive: true, verbatimSymlinks: true });
      const r = await finishTree(tree, { objectsDir: path.join(t.dir, 'known-objects'), known, ...(prefix ? { prefix } : {}) });
      expect(entryOf(r.listing, 'lib/a.py')).toContain(prefix ? sha('a = 1\n') : fake);
      expect(entryOf(r.listing, 'lib/a.py')).toContain('"f","444"'); // the mode is set all the same
      expect(entryOf(r.listing, 'lib/a-hardlink.py')).toContain(sha('a = 1\n')); // not known: read
      expect(entryOf(r.listing, 'lib/private.py')).toContain(sha('secret = 1\n'));
      expect(entryOf(r.listing, 'lib/__pycache__/a.cpython-311.pyc')).toContain(fake);
      if (prefix) expect(r.prefixFiles).toContainEqual({ path: 'lib/text.cfg', kind: 'text' });
    }
  });

  it('addArchive with the hashes made during the unpack stores what reading the tree stores', async () => {
    const archive = path.join(t.dir, 'known.tar.zst');
    await packDirectory(src, archive);
    const [reread, workers] = [
      await (await openStore({ root: path.join(t.dir, 'known-store-reread'), budget: false, finish: 'reread' })).addArchive(archive, { prefix: PREFIX }),
      await (await openStore({ root: path.join(t.dir, 'known-store-workers'), budget: false })).addArchive(archive, { prefix: PREFIX }),
    ];
    const strip = (m: Record<string, unknown>) => ({ ...m, created: undefined });
    expect(strip(workers.manifest as unknown as Record<string, unknown>)).toEqual(strip(reread.manifest as unknown as Record<string, unknown>));
    expect(readFileSync(path.join(workers.dir, 'listing.jsonl'), 'utf8')).toBe(readFileSync(path.join(reread.dir, 'listing.jsonl'), 'utf8'));
  });

  it('lists a tree in the workers exactly as treeListing does, each inode read once across calls', async () => {
    const store = await openStore({ root: path.join(t.dir, 'list-store'), budget: false });
    const archive = path.join(t.dir, 'list.tar.zst');
    await packDirectory(src, archive);
    const layer = await store.addArchive(archive);
    for (const tree of [src, layer.path]) {
      const [mine, theirs] = [await treeListingInWorkers(tree), await treeListing(tree)];
      expect(mine.text).toBe(theirs.text);
      expect([mine.files, mine.bytes]).toEqual([theirs.files, theirs.bytes]);
    }
    // A cache entry wins over reading: what verify's cache across layers relies on.
    const cache = new Map<string, string>();
    await treeListingInWorkers(layer.path, { cache });
    const st = statSync(path.join(layer.path, 'lib/a.py'));
    cache.set(`${st.dev}:${st.ino}`, 'c'.repeat(64));
    const again = await treeListingInWorkers(layer.path, { cache });
    expect(again.entries.find((e) => e[0] === 'lib/a-hardlink.py')![5]).toBe('c'.repeat(64));
  });
});
