/** The server's pure parts: zip checking, multipart parsing, Python decoding, replay cache. */
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ReplayCache, jsonReply } from '../../lib/server/http.js';
import { parseMultipart } from '../../lib/server/multipart.js';
import { pyDecode, pyRepr } from '../../lib/server/python.js';
import { BadZipError, ZipRefusedError, checkZipIsSafe } from '../../lib/server/zip.js';
import { tempDir } from '../helpers.js';

const dir = tempDir('msbx-server-unit-');
afterAll(() => dir.remove());
const limits = { maxEntries: 100, maxUncompressedBytes: 1 << 20 };

function pyZip(name: string, entries: Array<[string, string]>): Buffer {
  const path = join(dir.path, name);
  const code = 'import sys, json, zipfile\nz = zipfile.ZipFile(sys.argv[1], "w")\nfor n, d in json.loads(sys.argv[2]): z.writestr(n, d)\nz.close()';
  execFileSync('python3', ['-c', code, path, JSON.stringify(entries)]);
  return readFileSync(path);
}

describe('zip checks', () => {
  it('accepts ordinary entries', () => {
    expect(checkZipIsSafe(pyZip('ok.zip', [['a/b.txt', 'x'], ['c/', '']]), limits).map((e) => e.name)).toEqual(['a/b.txt', 'c/']);
  });

  it('refuses absolute paths, .. components (also with backslashes) and bombs', () => {
    expect(() => checkZipIsSafe(pyZip('abs.zip', [['/etc/x', 'x']]), limits)).toThrow(ZipRefusedError);
    expect(() => checkZipIsSafe(pyZip('dots.zip', [['a/../../x', 'x']]), limits)).toThrow(/outside the target/);
    expect(() => checkZipIsSafe(pyZip('bs.zip', [['a\\..\\..\\x', 'x']]), limits)).toThrow(ZipRefusedError);
    expect(() => checkZipIsSafe(pyZip('big.zip', [['big', 'x'.repeat(2000)]]), { ...limits, maxUncompressedBytes: 1000 })).toThrow(/more than/);
  });

  it('refuses symbolic links (zip -y)', () => {
    const src = join(dir.path, 'links');
    execFileSync('mkdir', ['-p', src]);
    symlinkSync('/etc', join(src, 'etc-link'));
    const zip = join(dir.path, 'links.zip');
    execFileSync('zip', ['-qry', zip, '.'], { cwd: src });
    expect(() => checkZipIsSafe(readFileSync(zip), limits)).toThrow(/symbolic link/);
  });

  it('says BadZip for non-zips', () => {
    expect(() => checkZipIsSafe(Buffer.from('hello'), limits)).toThrow(BadZipError);
    const file = join(dir.path, 'garbage');
    writeFileSync(file, Buffer.alloc(100, 7));
    expect(() => checkZipIsSafe(readFileSync(file), limits)).toThrow(BadZipError);
  });
});

describe('multipart', () => {
  it('splits fields and keeps binary content intact', async () => {
    const form = new FormData();
    const bytes = new Uint8Array([13, 10, 45, 45, 0, 255]);
    form.append('file', new Blob([bytes]), 'a "quoted".bin');
    form.append('target_path', '/work/x');
    const req = new Request('http://x', { method: 'POST', body: form });
    const boundary = /boundary=(.*)$/.exec(req.headers.get('content-type')!)![1]!;
    const fields = parseMultipart(Buffer.from(await req.arrayBuffer()), boundary);
    expect([...fields.get('file')!.data]).toEqual([...bytes]);
    expect(fields.get('target_path')!.data.toString()).toBe('/work/x');
  });
});

describe('python helpers', () => {
  it('decodes as bytes.decode does', () => {
    const bad = Buffer.from([0x61, 0xff, 0x62, 0xe2, 0x82]);
    expect(pyDecode(bad, null, 'backslashreplace')).toBe('a\\xffb\\xe2\\x82');
    expect(pyDecode(bad, 'utf-8', 'ignore')).toBe('ab');
    expect(() => pyDecode(bad, 'utf8', null)).toThrow("'utf-8' codec can't decode byte 0xff in position 1: invalid start byte");
    expect(() => pyDecode(bad, 'klingon', null)).toThrow('unknown encoding: klingon');
    expect(pyDecode(Buffer.from([0xe9]), 'latin-1', null)).toBe('é');
  });

  it('reprs strings and lists like Python', () => {
    expect(pyRepr("it's")).toBe(`"it's"`);
    expect(pyRepr('a\nb\\')).toBe("'a\\nb\\\\'");
    expect(pyRepr(['ls', '-l'])).toBe("['ls', '-l']");
  });
});

describe('replay cache', () => {
  it('is a bounded LRU that shares in-flight replies', async () => {
    const cache = new ReplayCache(2);
    let runs = 0;
    const produce = async () => jsonReply(200, { n: ++runs });
    const [a, b] = await Promise.all([cache.run('k1', produce), cache.run('k1', produce)]);
    expect(a).toBe(b);
    await cache.run('k2', produce);
    await cache.run('k3', produce); // evicts k1
    expect(cache.size).toBe(2);
    expect(JSON.parse((await cache.run('k1', produce)).body)).toEqual({ n: 4 });
  });
});
