/**
 * store.verify(): layers tampered with on disk, for real, after they were
 * built; each difference must be reported with what it is and where.
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, lstatSync, mkdirSync, readFileSync, rmSync, statSync, symlinkSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeEach, describe, expect, it } from 'vitest';
import { extractArchive, packDirectory } from '../../lib/files/index.js';
import { describeProblem, openStore, type Layer, type LayerStore } from '../../lib/layers/index.js';
import { py, tmpDir, writeTree } from './helpers.js';

const t = tmpDir('verify');
afterAll(() => t.cleanup());
let k = 0;

const sha256 = (data: string) => execFileSync('sha256sum', { input: data, encoding: 'utf8' }).split(' ')[0]!;
const fileSha = (file: string) => execFileSync('sha256sum', [file], { encoding: 'utf8' }).split(' ')[0]!;

/** Two layers sharing one file (dedup links them to one object), in a fresh store. */
async function twoLayers(): Promise<{ store: LayerStore; a: Layer; b: Layer }> {
  const dir = path.join(t.dir, `s${++k}`);
  for (const name of ['a', 'b']) {
    writeTree(path.join(dir, name), { 'shared.py': 'shared = 1\n', [`only-${name}.txt`]: name, 'sub/deep.txt': `deep ${name}\n` });
    symlinkSync('sub/deep.txt', path.join(dir, name, 'link'));
    // Same mtime, so dedup shares shared.py between the two layers.
    utimesSync(path.join(dir, name, 'shared.py'), 1600000000, 1600000000);
    // Whole seconds, so a test can put an mtime back exactly after a write.
    utimesSync(path.join(dir, name, `only-${name}.txt`), 1600000001, 1600000001);
    await packDirectory(path.join(dir, name), path.join(dir, `${name}.tar.zst`));
  }
  const store = await openStore({ root: path.join(dir, 'store') });
  const a = await store.addArchive(path.join(dir, 'a.tar.zst'), { name: 'a' });
  const b = await store.addArchive(path.join(dir, 'b.tar.zst'), { name: 'b' });
  return { store, a, b };
}

/** Make a store path writable, run `fn`, and give it its mode back (so only `fn`'s change shows). */
function tamper(p: string, fn: () => void): void {
  const mode = lstatSync(p).mode & 0o7777;
  chmodSync(p, mode | 0o200);
  fn();
  chmodSync(p, mode);
}

describe('store.verify', () => {
  let store: LayerStore;
  let a: Layer;
  let b: Layer;
  beforeEach(async () => {
    ({ store, a, b } = await twoLayers());
  });

  it('finds freshly built layers as built, with a recorded listing', async () => {
    expect(a.manifest.treeDigest).toBe(sha256(readFileSync(path.join(a.dir, 'listing.jsonl'), 'utf8')));
    const checks = await store.verify();
    expect(checks.map((c) => [c.digest, c.status, c.files, c.problems])).toEqual(
      [a, b].map((l) => [l.digest, 'ok', 3, []]).sort((x, y) => String(x[0]).localeCompare(String(y[0]))),
    );
  });

  it('reports a file whose content changed, with both hashes, even when its size, mode and mtime did not', async () => {
    const f = path.join(a.path, 'only-a.txt');
    tamper(f, () => writeFileSync(f, 'X'));
    utimesSync(f, 1600000001, 1600000001);
    const [check] = await store.verify([a.digest]);
    expect(check!.status).toBe('mismatch');
    expect(check!.problems).toEqual([{ path: 'only-a.txt', what: 'content', expected: sha256('a'), actual: sha256('X') }]);
    expect(describeProblem(check!.problems[0]!)).toBe(`only-a.txt: content sha256 ${sha256('X')}, expected ${sha256('a')}`);
  });

  it('reports mode, missing, added and symlink-target changes, and leaves the other layer alone', async () => {
    chmodSync(path.join(a.path, 'sub', 'deep.txt'), 0o644);
    tamper(path.join(a.path, 'sub'), () => {
      unlinkSync(path.join(a.path, 'sub', 'deep.txt'));
      writeFileSync(path.join(a.path, 'sub', 'planted.sh'), 'evil');
    });
    tamper(a.path, () => {
      unlinkSync(path.join(a.path, 'link'));
      symlinkSync('/etc/shadow', path.join(a.path, 'link'));
    });
    const checks = await store.verify();
    const ca = checks.find((c) => c.digest === a.digest)!;
    expect(ca.problems.map(describeProblem)).toEqual([
      'link: target /etc/shadow, expected sub/deep.txt',
      'sub/deep.txt: missing (a file when built)',
      'sub/planted.sh: not in the layer when built (a file was added)',
    ]);
    expect(checks.find((c) => c.digest === b.digest)!.status).toBe('ok');
  });

  it('reports a mode change', async () => {
    chmodSync(path.join(b.path, 'only-b.txt'), 0o4755);
    const [check] = await store.verify([b.digest]);
    expect(check!.problems).toEqual([{ path: 'only-b.txt', what: 'mode', expected: '444', actual: '4755' }]);
  });

  it('reports a shared (deduplicated) file in every layer that holds it', async () => {
    expect(statSync(path.join(a.path, 'shared.py')).ino).toBe(statSync(path.join(b.path, 'shared.py')).ino);
    const f = path.join(a.path, 'shared.py');
    tamper(f, () => writeFileSync(f, 'shared = 2\n'));
    utimesSync(f, 1600000000, 1600000000);
    const checks = await store.verify();
    expect(checks.map((c) => c.problems.map((p) => `${p.path} ${p.what}`))).toEqual([['shared.py content'], ['shared.py content']]);
  });

  it('reports a listing that no longer matches its manifest, and a layer too old to check', async () => {
    const listing = path.join(a.dir, 'listing.jsonl');
    tamper(listing, () => writeFileSync(listing, readFileSync(listing, 'utf8').replace('"444"', '"644"')));
    const [ca] = await store.verify([a.digest]);
    expect(ca!.status).toBe('mismatch');
    expect(ca!.problems.map(describeProblem)).toEqual([expect.stringMatching(/^listing\.jsonl: sha256 [0-9a-f]{64}, but manifest\.json records [0-9a-f]{64}$/)]);
    const manifest = path.join(b.dir, 'manifest.json');
    tamper(b.dir, () =>
      tamper(manifest, () => {
        const m = JSON.parse(readFileSync(manifest, 'utf8')) as Record<string, unknown>;
        delete m.treeDigest;
        writeFileSync(manifest, JSON.stringify(m));
      }),
    );
    const [cb] = await store.verify([b.digest]);
    expect(cb).toMatchObject({ status: 'unverifiable', reason: expect.stringMatching(/^no tree digest in manifest\.json/) });
  });

  it('refuses a layer that is not in the store, by name', async () => {
    const missing = 'f'.repeat(64);
    await expect(store.verify([missing])).rejects.toThrow(`verify: layer ${missing} is not in the store ${store.root}`);
    await expect(store.verify(['nope'])).rejects.toThrow(/not a sha256 hex digest/);
  });
});

describe('store.verify of layers hashed during their unpack', () => {
  it('records what is on disk for members that replace each other, and still catches a file changed after publishing', async () => {
    const dir = path.join(t.dir, 'overlap');
    mkdirSync(dir, { recursive: true });
    const archive = path.join(dir, 'tricky.tar');
    py(
      String.raw`
import io, sys, tarfile
with tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT) as tf:
    def f(name, data):
        t = tarfile.TarInfo(name); t.size = len(data); t.mtime = 1600000000; t.mode = 0o644
        tf.addfile(t, io.BytesIO(data))
    f('a.txt', b'first'); f('a.txt', b'second, kept')
    f('b', b'replaced by a symlink')
    t = tarfile.TarInfo('b'); t.type = tarfile.SYMTYPE; t.linkname = 'a.txt'; tf.addfile(t)
    f('c', b'linked')
    t = tarfile.TarInfo('h'); t.type = tarfile.LNKTYPE; t.linkname = 'c'; tf.addfile(t)
`,
      [archive],
    );
    const store = await openStore({ root: path.join(dir, 'store'), budget: false });
    const layer = await store.addArchive(archive);
    const listed = readFileSync(path.join(layer.dir, 'listing.jsonl'), 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as unknown[]);
    for (const e of listed) if (e[1] === 'f') expect(e[5], String(e[0])).toBe(fileSha(path.join(layer.path, String(e[0]))));
    expect(listed.find((e) => e[0] === 'a.txt')![5]).toBe(sha256('second, kept'));
    expect(listed.find((e) => e[0] === 'b')![1]).toBe('l');
    expect((await store.verify())[0]!.status).toBe('ok');
    const f = path.join(layer.path, 'a.txt');
    tamper(f, () => writeFileSync(f, 'SECOND, kept'));
    utimesSync(f, 1600000000, 1600000000);
    const [check] = await store.verify();
    expect(check!.problems).toEqual([{ path: 'a.txt', what: 'content', expected: sha256('second, kept'), actual: sha256('SECOND, kept') }]);
  });
});

describe('extractArchive with expectDigest', () => {
  it('refuses an archive whose sha256 is not the expected one, before unpacking anything', async () => {
    const dir = path.join(t.dir, 'expect');
    writeTree(path.join(dir, 'src'), { 'f.txt': 'good' });
    const archive = path.join(dir, 'l.tar.zst');
    await packDirectory(path.join(dir, 'src'), archive);
    const good = fileSha(archive);
    mkdirSync(path.join(dir, 'ok'));
    await extractArchive(archive, path.join(dir, 'ok'), { expectDigest: `sha256:${good}` });
    expect(readFileSync(path.join(dir, 'ok', 'f.txt'), 'utf8')).toBe('good');
    // Another valid archive in its place: it would unpack fine, but it is not the layer.
    writeFileSync(path.join(dir, 'src', 'f.txt'), 'evil');
    rmSync(archive);
    await packDirectory(path.join(dir, 'src'), archive);
    const evil = fileSha(archive);
    mkdirSync(path.join(dir, 'refused'));
    await expect(extractArchive(archive, path.join(dir, 'refused'), { expectDigest: good })).rejects.toThrow(
      `layer archive ${archive}: sha256 is ${evil}, not the expected ${good}: the archive changed after it was stored; nothing was unpacked`,
    );
    expect(execFileSync('ls', ['-A', path.join(dir, 'refused')], { encoding: 'utf8' })).toBe('');
  });
});
