import { execFileSync } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, symlinkSync, linkSync, utimesSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { extractArchive, packDirectory, LayerError } from '../../lib/layers/index.js';
import { py, tmpDir, writeTree } from './helpers.js';

/**
 * Python's tarfile writes any member name we ask for, so it builds the
 * hostile archives. Each spec: [type, name, linkname?, data?].
 */
const MAKE_TAR = String.raw`
import io, json, sys, tarfile
out, fmt, specs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
format = {'gnu': tarfile.GNU_FORMAT, 'pax': tarfile.PAX_FORMAT, 'ustar': tarfile.USTAR_FORMAT}[fmt]
with tarfile.open(out, 'w', format=format) as tf:
    for s in specs:
        t = tarfile.TarInfo(s['name'])
        t.mtime = 1700000000
        kind = s['type']
        if kind == 'file':
            data = s.get('data', 'x').encode()
            t.size = len(data); t.mode = s.get('mode', 0o644)
            tf.addfile(t, io.BytesIO(data)); continue
        if kind == 'dir': t.type = tarfile.DIRTYPE; t.mode = 0o755
        elif kind == 'symlink': t.type = tarfile.SYMTYPE; t.linkname = s['link']
        elif kind == 'hardlink': t.type = tarfile.LNKTYPE; t.linkname = s['link']
        elif kind == 'chr': t.type = tarfile.CHRTYPE; t.devmajor = 1; t.devminor = 3
        elif kind == 'fifo': t.type = tarfile.FIFOTYPE
        tf.addfile(t)
`;

type Spec = { type: 'file' | 'dir' | 'symlink' | 'hardlink' | 'chr' | 'fifo'; name: string; link?: string; data?: string; mode?: number };

function makeTar(out: string, specs: Spec[], fmt: 'gnu' | 'pax' | 'ustar' = 'gnu'): string {
  py(MAKE_TAR, [out, fmt, JSON.stringify(specs)]);
  return out;
}

function listAll(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return execFileSync('find', [dir, '-mindepth', '1'], { encoding: 'utf8' }).split('\n').filter(Boolean);
}

describe('extractArchive: hostile archives', () => {
  const t = tmpDir('extract');
  // Layout: <t>/work/{archives,dest-N} and <t>/outside (must stay empty).
  // The archive members aim at <t>/outside via absolute paths, '..' and symlinks.
  const outside = path.join(t.dir, 'outside');
  const work = path.join(t.dir, 'work');
  let n = 0;
  beforeAll(() => {
    mkdirSync(outside);
    mkdirSync(path.join(work, 'archives'), { recursive: true });
  });
  afterAll(() => t.cleanup());

  const cases: Array<{ title: string; specs: Spec[]; member: string; reason: RegExp; fmt?: 'gnu' | 'pax' | 'ustar' }> = [
    {
      title: 'absolute name',
      specs: [{ type: 'file', name: '@OUT@/pwned' }],
      member: '@OUT@/pwned',
      reason: /absolute name/,
    },
    { title: 'leading ..', specs: [{ type: 'file', name: '../../outside/pwned' }], member: '../../outside/pwned', reason: /'\.\.' component/ },
    { title: 'inner ..', specs: [{ type: 'dir', name: 'a' }, { type: 'file', name: 'a/../../../outside/pwned' }], member: 'a/../../../outside/pwned', reason: /'\.\.' component/ },
    {
      title: '.. hidden in a pax path (ustar name looks harmless)',
      specs: [{ type: 'file', name: '../' + 'd/'.repeat(60) + 'pwned' }],
      member: '../d/',
      reason: /'\.\.' component/,
      fmt: 'pax',
    },
    {
      title: '.. in a GNU long name',
      specs: [{ type: 'file', name: 'x/'.repeat(60) + '../'.repeat(62) + 'outside/pwned' }],
      member: 'x/x/',
      reason: /'\.\.' component/,
    },
    {
      title: 'symlink to outside, then a file through it',
      specs: [{ type: 'symlink', name: 'link', link: '@OUT@' }, { type: 'file', name: 'link/pwned' }],
      member: 'link/pwned',
      reason: /goes through the symlink member link/,
    },
    {
      title: 'relative symlink chain, then a file through it',
      specs: [
        { type: 'symlink', name: 'up', link: '../..' },
        { type: 'symlink', name: 'a', link: 'up/outside' },
        { type: 'file', name: 'a/pwned' },
      ],
      member: 'a/pwned',
      reason: /goes through the symlink member a/,
    },
    {
      title: 'symlink dir component then ./ trick',
      specs: [{ type: 'symlink', name: 'd', link: '@OUT@' }, { type: 'dir', name: './d/./sub' }],
      member: './d/./sub',
      reason: /goes through the symlink member d/,
    },
    {
      title: 'file replacing a symlink (write through it)',
      specs: [{ type: 'symlink', name: 'f', link: '@OUT@/pwned' }, { type: 'file', name: 'f' }],
      member: 'f',
      reason: /replaces an earlier symlink member/,
    },
    {
      title: 'hard link to an absolute path',
      specs: [{ type: 'hardlink', name: 'h', link: '@OUT@/victim' }],
      member: 'h',
      reason: /hard link target .* is absolute and escapes the layer/,
    },
    {
      title: 'hard link with ..',
      specs: [{ type: 'hardlink', name: 'h', link: '../../outside/victim' }],
      member: 'h',
      reason: /hard link target .* '\.\.' component/,
    },
    {
      title: 'hard link through a symlink',
      specs: [{ type: 'symlink', name: 's', link: '@OUT@' }, { type: 'hardlink', name: 'h', link: 's/victim' }],
      member: 'h',
      reason: /hard link target goes through the symlink member s/,
    },
    {
      title: 'hard link to a file not in the archive',
      specs: [{ type: 'hardlink', name: 'h', link: 'etc/passwd' }],
      member: 'h',
      reason: /not an earlier file of the archive/,
    },
    // A hard link to a symlink is a second name for the symlink that the
    // checker used to count as a file: `h/x` went through it (GNU tar writes
    // through an in-tree one; only its placeholders stop an absolute one).
    {
      title: 'hard link to an in-tree symlink, then a file through it',
      specs: [{ type: 'dir', name: 'sub' }, { type: 'symlink', name: 's', link: 'sub' }, { type: 'hardlink', name: 'h', link: 's' }, { type: 'file', name: 'h/x' }],
      member: 'h',
      reason: /hard link target s is a symlink member/,
    },
    {
      title: 'hard link to a symlink to outside, then a file through it',
      specs: [{ type: 'symlink', name: 's', link: '@OUT@' }, { type: 'hardlink', name: 'h', link: 's' }, { type: 'file', name: 'h/victim', data: 'PWNED' }],
      member: 'h',
      reason: /hard link target s is a symlink member/,
    },
    {
      title: 'hard link to a member that only comes later',
      specs: [{ type: 'hardlink', name: 'h', link: 'later' }, { type: 'file', name: 'later' }],
      member: 'h',
      reason: /hard link target later is not an earlier file of the archive/,
    },
    { title: 'hard link to itself', specs: [{ type: 'file', name: 'h' }, { type: 'hardlink', name: 'h', link: 'h' }], member: 'h', reason: /is a hard link to itself/ },
    {
      title: 'hard link, then a file written through it',
      specs: [{ type: 'file', name: 'f', data: 'mine' }, { type: 'hardlink', name: 'h', link: 'f' }, { type: 'file', name: 'h', data: 'PWNED' }],
      member: 'h',
      reason: /replaces a hard link or the target of one/,
    },
    {
      title: 'hard link, then its target rewritten',
      specs: [{ type: 'file', name: 'f', data: 'mine' }, { type: 'hardlink', name: 'h', link: 'f' }, { type: 'file', name: 'f', data: 'PWNED' }],
      member: 'f',
      reason: /replaces a hard link or the target of one/,
    },
    { title: 'a member under a file', specs: [{ type: 'file', name: 'f' }, { type: 'file', name: 'f/x' }], member: 'f/x', reason: /goes through the file member f/ },
    {
      title: 'symlink replacing a directory only implied by an earlier path',
      specs: [{ type: 'file', name: 'd/x' }, { type: 'symlink', name: 'd', link: '@OUT@' }],
      member: 'd',
      reason: /replaces a directory with a symlink/,
    },
    { title: 'character device', specs: [{ type: 'chr', name: 'null' }], member: 'null', reason: /unsupported type '3'/ },
    { title: 'fifo', specs: [{ type: 'fifo', name: 'p' }], member: 'p', reason: /unsupported type '6'/ },
  ];

  for (const c of cases) {
    it(`refuses ${c.title}, names the member and the reason, writes nothing outside`, async () => {
      writeFileSync(path.join(outside, 'victim'), 'original');
      const fix = (s: string) => s.replaceAll('@OUT@', outside);
      const specs = c.specs.map((s) => ({ ...s, name: fix(s.name), ...(s.link ? { link: fix(s.link) } : {}) }));
      // A harmless member first: proves refusal happens mid-stream too.
      specs.unshift({ type: 'file', name: 'ok.txt', data: 'fine' });
      const archive = makeTar(path.join(work, 'archives', `case${++n}.tar`), specs, c.fmt);
      for (const comp of ['none', 'zstd'] as const) {
        let file = archive;
        if (comp === 'zstd') {
          execFileSync('zstd', ['-q', '-f', archive, '-o', `${archive}.zst`]);
          file = `${archive}.zst`;
        }
        const dest = path.join(work, `dest-${n}-${comp}`);
        mkdirSync(dest);
        const err = await extractArchive(file, dest).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(err).toBeInstanceOf(LayerError);
        const msg = (err as Error).message;
        expect(msg).toContain(`layer archive ${file}: member ${fix(c.member)}`);
        expect(msg).toMatch(c.reason);
        expect(listAll(outside)).toEqual([path.join(outside, 'victim')]);
        expect(readFileSync(path.join(outside, 'victim'), 'utf8')).toBe('original');
        // Only members before the refused one can exist (the store then deletes
        // the whole staging dir); the refused member itself was never written.
        // (Their parent directories too: tar makes them for a member without its own.)
        const allowed = specs.slice(0, -1).flatMap((s) => {
          const parts = s.name.split('/').filter((c) => c && c !== '.');
          return parts.map((_, i) => parts.slice(0, i + 1).join('/'));
        });
        for (const p of listAll(dest)) expect(allowed).toContain(path.relative(dest, p));
      }
    });
  }

  it('refuses a corrupt header and a truncated stream', async () => {
    const archive = makeTar(path.join(work, 'archives', 'good.tar'), [{ type: 'file', name: 'a', data: 'x'.repeat(5000) }]);
    const buf = readFileSync(archive);
    const corrupt = Buffer.from(buf);
    corrupt[0] = 'b'.charCodeAt(0); // name changes, checksum no longer matches
    writeFileSync(path.join(work, 'archives', 'corrupt.tar'), corrupt);
    const dest1 = path.join(work, 'dest-corrupt');
    mkdirSync(dest1);
    await expect(extractArchive(path.join(work, 'archives', 'corrupt.tar'), dest1)).rejects.toThrow(/bad tar header checksum at byte 0/);
    writeFileSync(path.join(work, 'archives', 'trunc.tar'), buf.subarray(0, 2048));
    const dest2 = path.join(work, 'dest-trunc');
    mkdirSync(dest2);
    await expect(extractArchive(path.join(work, 'archives', 'trunc.tar'), dest2)).rejects.toThrow(/trunc\.tar: truncated tar stream/);
  });

  it('GNU tar 1.34 defaults (our second line of defence) refuse .. and do not write through a planted symlink', () => {
    // Documented behaviour, checked here so the justification stays true:
    // GNU tar 1.34 refuses '..' members and strips '/', and turns dangerous
    // symlinks into placeholders during extraction.
    const archive = makeTar(path.join(work, 'archives', 'gnu-alone.tar'), [
      { type: 'file', name: '../escape' },
      { type: 'symlink', name: 'l', link: outside },
      { type: 'file', name: 'l/through' },
    ]);
    const dest = path.join(work, 'dest-gnu-alone');
    mkdirSync(dest);
    let stderr = '';
    try {
      execFileSync('tar', ['-xf', archive, '-C', dest], { stdio: ['ignore', 'ignore', 'pipe'] });
    } catch (e) {
      stderr = String((e as { stderr: Buffer }).stderr);
    }
    expect(stderr).toMatch(/Member name contains '\.\.'/);
    expect(existsSync(path.join(outside, 'through'))).toBe(false);
    expect(existsSync(path.join(t.dir, 'escape'))).toBe(false);
  });
});

describe('extractArchive / packDirectory: round trip', () => {
  const t = tmpDir('roundtrip');
  afterAll(() => t.cleanup());

  it('keeps mtimes, modes, symlinks (absolute too), hard links and long/unicode names, in zstd, gzip and plain tar', async () => {
    const src = path.join(t.dir, 'src');
    const long = `${'deep/'.repeat(30)}file-with-a-long-name-${'x'.repeat(80)}.py`;
    writeTree(src, {
      'bin/tool': { content: '#!/bin/sh\necho hi\n', mode: 0o755 },
      'lib/mod.py': 'print(1)\n',
      'données/ünïcode.txt': 'u\n',
      [long]: 'long\n',
    });
    symlinkSync('/usr/bin/python3', path.join(src, 'bin', 'python3'));
    symlinkSync('../lib/mod.py', path.join(src, 'bin', 'rel'));
    linkSync(path.join(src, 'lib', 'mod.py'), path.join(src, 'lib', 'hard.py'));
    utimesSync(path.join(src, 'lib', 'mod.py'), 1600000000, 1600000000);
    for (const compression of ['zstd', 'gzip', 'none'] as const) {
      const ext = { zstd: '.tar.zst', gzip: '.tar.gz', none: '.tar' }[compression];
      const archive = path.join(t.dir, `layer${ext}`);
      await packDirectory(src, archive, { compression });
      const dest = path.join(t.dir, `out-${compression}`);
      mkdirSync(dest);
      const progress: number[] = [];
      const r = await extractArchive(archive, dest, { onProgress: (d) => progress.push(d) });
      expect(r.members).toBeGreaterThan(5);
      expect(progress.at(-1)).toBe(statSync(archive).size);
      expect(statSync(path.join(dest, 'lib', 'mod.py')).mtimeMs).toBe(1600000000 * 1000);
      expect(statSync(path.join(dest, 'bin', 'tool')).mode & 0o777).toBe(0o755);
      expect(readlinkSync(path.join(dest, 'bin', 'python3'))).toBe('/usr/bin/python3');
      expect(readlinkSync(path.join(dest, 'bin', 'rel'))).toBe('../lib/mod.py');
      expect(statSync(path.join(dest, 'lib', 'hard.py')).ino).toBe(statSync(path.join(dest, 'lib', 'mod.py')).ino);
      expect(readFileSync(path.join(dest, long), 'utf8')).toBe('long\n');
      expect(readFileSync(path.join(dest, 'données', 'ünïcode.txt'), 'utf8')).toBe('u\n');
      expect(lstatSync(path.join(dest, 'bin', 'python3')).isSymbolicLink()).toBe(true);
    }
  });

  it('packs reproducibly (same bytes twice)', async () => {
    const src = path.join(t.dir, 'repro');
    writeTree(src, { 'b.txt': 'b', 'a/c.txt': 'c', 'z.txt': 'z' });
    await packDirectory(src, path.join(t.dir, 'r1.tar.zst'));
    await packDirectory(src, path.join(t.dir, 'r2.tar.zst'));
    expect(readFileSync(path.join(t.dir, 'r1.tar.zst')).equals(readFileSync(path.join(t.dir, 'r2.tar.zst')))).toBe(true);
    expect(readdirSync(t.dir).filter((f) => f.includes('.tmp-'))).toEqual([]);
  });
});
