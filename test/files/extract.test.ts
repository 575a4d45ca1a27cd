import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createReadStream, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, symlinkSync, linkSync, utimesSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { extractArchive, extractUntrusted, FileError, packDirectory } from '../../lib/files/index.js';
import { py, tmpDir, transpiledLayers, writeTree } from '../layers/helpers.js';

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
        // The zstd round as the store runs it: hashing files on the way.
        const err = await extractArchive(file, dest, comp === 'zstd' ? { hashFiles: true } : {}).then(
          () => undefined,
          (e: unknown) => e,
        );
        expect(err).toBeInstanceOf(FileError);
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

describe('extractArchive: what GNU tar would do', () => {
  const t = tmpDir('extract-tar');
  afterAll(() => t.cleanup());

  it('clears setuid and setgid bits, keeps the other bits', async () => {
    const archive = makeTar(path.join(t.dir, 'setid.tar'), [
      { type: 'file', name: 'suid', mode: 0o4755 },
      { type: 'file', name: 'sgid', mode: 0o2711 },
      { type: 'file', name: 'plain', mode: 0o640 },
    ]);
    const dest = path.join(t.dir, 'setid');
    mkdirSync(dest);
    await extractArchive(archive, dest);
    const mode = (f: string) => statSync(path.join(dest, f)).mode & 0o7777;
    expect([mode('suid'), mode('sgid')]).toEqual([0o755, 0o711]);
    // Without -p a non-root tar applies the umask; the point is only that no set-id bit survives.
    expect(mode('plain') & ~0o640).toBe(0);
  });

  it('ends the archive at a lone zero block, as GNU tar does: nothing after it is passed on', async () => {
    const archive = path.join(t.dir, 'lone.tar');
    py(
      String.raw`
import io, sys, tarfile
def member(name):
    t = tarfile.TarInfo(name); t.size = 1; t.mtime = 0
    return t.tobuf(tarfile.GNU_FORMAT) + b'x' + b'\0' * 511
open(sys.argv[1], 'wb').write(member('a') + b'\0' * 512 + member('b') + b'\0' * 1024)
`,
      [archive],
    );
    const dest = path.join(t.dir, 'lone');
    mkdirSync(dest);
    expect(execFileSync('tar', ['-tf', archive, '--warning=no-alone-zero-block'], { encoding: 'utf8' })).toBe('a\n');
    expect((await extractArchive(archive, dest)).members).toBe(1);
    expect(readdirSync(dest)).toEqual(['a']);
  });
});

describe('extractUntrusted: a tree for the host, all or nothing', () => {
  const t = tmpDir('untrusted');
  afterAll(() => t.cleanup());
  let k = 0;
  /** A hand-made archive unpacked to <fresh dir>/out; returns the fresh dir and the outcome. */
  async function unpack(specs: Spec[], opts: { producer?: Promise<unknown>; pre?: (out: string) => void } = {}) {
    const dir = path.join(t.dir, `case-${++k}`);
    mkdirSync(dir);
    const archive = makeTar(path.join(t.dir, `case-${k}.tar`), specs);
    opts.pre?.(path.join(dir, 'out'));
    const err = await extractUntrusted(createReadStream(archive), path.join(dir, 'out'), {
      label: 'download /w',
      ...(opts.producer ? { producer: opts.producer } : {}),
    }).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    return { dir, err };
  }
  const filler: Spec[] = Array.from({ length: 50 }, (_, i) => ({ type: 'file', name: `./a/f${i}`, data: String(i) }));

  const refused: Array<{ title: string; specs: Spec[]; message: string }> = [
    { title: 'an absolute symlink', specs: [{ type: 'symlink', name: './l', link: '/etc/shadow' }], message: 'member ./l is a symlink to /etc/shadow, which leaves the destination' },
    { title: 'a symlink climbing out', specs: [{ type: 'symlink', name: './a/up', link: '../..' }], message: 'member ./a/up is a symlink to ../.., which leaves the destination' },
    {
      // c comes first and reads as inside on its own; only once s/l is known does it leave.
      title: 'a symlink that leaves only through a later one',
      specs: [{ type: 'symlink', name: './c', link: 's/l/../../x' }, { type: 'dir', name: './s' }, { type: 'symlink', name: './s/l', link: '..' }],
      message: 'member ./c is a symlink to s/l/../../x, which leaves the destination',
    },
    { title: 'a hard link to a host file', specs: [{ type: 'hardlink', name: './h', link: '/etc/passwd' }], message: 'member ./h hard link target /etc/passwd is absolute and escapes the destination' },
    { title: 'a hard link out with ..', specs: [{ type: 'hardlink', name: './h', link: '../x' }], message: "member ./h hard link target ../x has a '..' component and escapes the destination" },
    { title: 'a hard link to a name not in the archive', specs: [{ type: 'hardlink', name: './h', link: 'etc/passwd' }], message: 'member ./h hard link target etc/passwd is not an earlier file of the archive' },
  ];
  for (const c of refused) {
    it(`refuses ${c.title} and leaves nothing behind`, async () => {
      const { dir, err } = await unpack([{ type: 'dir', name: '.' }, ...filler, ...c.specs, { type: 'file', name: './z', data: 'z' }]);
      expect(err).toBeInstanceOf(FileError);
      expect(err!.message).toBe(`download /w: ${c.message}`);
      expect(readdirSync(dir)).toEqual([]);
    });
  }

  it('publishes nothing when the producer fails, even after a complete stream', async () => {
    const { dir, err } = await unpack([{ type: 'dir', name: '.' }, ...filler], { producer: Promise.reject(new Error('tar in the sandbox failed (exit 2)')) });
    expect(err?.message).toBe('tar in the sandbox failed (exit 2)');
    expect(readdirSync(dir)).toEqual([]);
  });

  it('publishes a good tree with in-tree links, without set-id bits', async () => {
    const { dir, err } = await unpack([
      { type: 'dir', name: '.' },
      ...filler,
      { type: 'file', name: './bin/tool', data: '#!/bin/sh\n', mode: 0o4755 },
      { type: 'symlink', name: './bin/up', link: '../a/f1' },
      { type: 'hardlink', name: './a/hard', link: './a/f2' },
    ]);
    expect(err).toBeUndefined();
    const out = path.join(dir, 'out');
    expect(statSync(path.join(out, 'bin/tool')).mode & 0o7777).toBe(0o755);
    expect(readFileSync(path.join(out, 'bin/up'), 'utf8')).toBe('1');
    expect(statSync(path.join(out, 'a/hard')).ino).toBe(statSync(path.join(out, 'a/f2')).ino);
    expect(readdirSync(dir)).toEqual(['out']);
  });

  it('never merges into or deletes an existing destination', async () => {
    const { dir, err } = await unpack([{ type: 'dir', name: '.' }, ...filler], {
      pre: (out) => {
        mkdirSync(out);
        writeFileSync(path.join(out, 'mine'), 'user data');
      },
    });
    expect(err?.message).toMatch(/^download \/w: .*\/out already exists and is a non-empty directory; nothing was written/);
    expect(readdirSync(path.join(dir, 'out'))).toEqual(['mine']);
    expect(readdirSync(dir)).toEqual(['out']);
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

describe('extractArchive: content hashes made during the unpack (hashFiles)', () => {
  const t = tmpDir('extract-hash');
  afterAll(() => t.cleanup());
  const sha = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');

  /**
   * The property finishing relies on: every digest names a path that is a
   * regular file on disk with exactly that content and size; and every
   * regular file on disk (here all names are UTF-8) has one.
   */
  function expectDigestsMatchDisk(dest: string, digests: Map<string, { sha256: string; size: number }>): void {
    const onDisk = new Map<string, Buffer>();
    const walk = (rel: string): void => {
      for (const name of readdirSync(path.join(dest, rel))) {
        const r = rel ? `${rel}/${name}` : name;
        const st = lstatSync(path.join(dest, r));
        if (st.isDirectory()) walk(r);
        else if (st.isFile()) onDisk.set(r, readFileSync(path.join(dest, r)));
      }
    };
    walk('');
    expect([...digests.keys()].sort()).toEqual([...onDisk.keys()].sort());
    for (const [rel, content] of onDisk) expect(digests.get(rel), rel).toEqual({ sha256: sha(content), size: content.length });
  }

  it('hashes what tar leaves: the last of a replaced file, hard links, not a file a symlink replaced; big, empty, set-id, long names', async () => {
    const long = `${'deep/'.repeat(25)}${'n'.repeat(90)}.py`;
    const big = 'B'.repeat(100_000); // several 64 KiB pipe reads (argv limits a spec to 128 KiB; see below for MiBs)
    for (const fmt of ['gnu', 'pax'] as const) {
      const archive = makeTar(path.join(t.dir, `tricky-${fmt}.tar`), [
        { type: 'file', name: 'a.txt', data: 'one' },
        { type: 'file', name: 'a.txt', data: 'two, longer' },
        { type: 'file', name: 'b', data: 'bee' },
        { type: 'symlink', name: 'b', link: 'a.txt' },
        { type: 'file', name: 'c', data: 'sea' },
        { type: 'hardlink', name: 'h', link: 'c' },
        { type: 'file', name: 'empty', data: '' },
        { type: 'file', name: 'suid', data: 'root me', mode: 0o4755 },
        { type: 'dir', name: 'd' },
        { type: 'file', name: 'd/big.bin', data: big },
        { type: 'file', name: long, data: 'long' },
        { type: 'file', name: './dot/./slash//x', data: 'normalised' },
      ], fmt);
      for (const compression of ['none', 'zstd'] as const) {
        let file = archive;
        if (compression === 'zstd') {
          file = `${archive}.zst`;
          execFileSync('zstd', ['-q', '-f', archive, '-o', file]);
        }
        const dest = path.join(t.dir, `tricky-${fmt}-${compression}`);
        mkdirSync(dest);
        const r = await extractArchive(file, dest, { hashFiles: true });
        expectDigestsMatchDisk(dest, r.digests!);
        // Not vacuous: what each case is about.
        expect(r.digests!.get('a.txt')!.sha256).toBe(sha('two, longer'));
        expect(r.digests!.has('b')).toBe(false);
        expect(r.digests!.get('h')).toEqual(r.digests!.get('c'));
        expect(r.digests!.get('d/big.bin')!.size).toBe(big.length);
        expect(r.digests!.get('dot/slash/x')!.sha256).toBe(sha('normalised'));
      }
    }
    // Files across several of the worker's 1 MiB reads, hard-linked, as packDirectory writes them.
    const src = path.join(t.dir, 'big-src');
    mkdirSync(src);
    writeFileSync(path.join(src, 'big.bin'), Buffer.alloc(3 << 20, 7));
    writeFileSync(path.join(src, 'odd.bin'), Buffer.alloc((1 << 20) + 513, 9));
    linkSync(path.join(src, 'big.bin'), path.join(src, 'big-link.bin'));
    const packed = path.join(t.dir, 'big.tar.zst');
    await packDirectory(src, packed);
    const dest = path.join(t.dir, 'big-out');
    mkdirSync(dest);
    const r = await extractArchive(packed, dest, { hashFiles: true });
    expectDigestsMatchDisk(dest, r.digests!);
    expect(r.digests!.get('big-link.bin')!.size).toBe(3 << 20);
  });

  it('returns no digests unless asked', async () => {
    const archive = makeTar(path.join(t.dir, 'plain.tar'), [{ type: 'file', name: 'f', data: 'x' }]);
    const dest = path.join(t.dir, 'plain');
    mkdirSync(dest);
    expect((await extractArchive(archive, dest)).digests).toBeUndefined();
  });

  it('refuses a header whose numeric field is not octal, and accepts a checksum made of signed bytes (as GNU tar does)', async () => {
    // A member with a byte above 127 in its name; the checksum is rewritten
    // as the old signed-char sum, then a copy gets a size field with a stray letter.
    const base = makeTar(path.join(t.dir, 'base.tar'), [{ type: 'file', name: 'caf\u00e9', data: 'x' }], 'ustar');
    const block = readFileSync(base);
    const rechecksum = (b: Buffer, signed: boolean): void => {
      b.fill(0x20, 148, 156);
      let sum = 0;
      for (let i = 0; i < 512; i++) sum += signed && b[i]! > 127 ? b[i]! - 256 : b[i]!;
      b.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8, 'latin1');
    };
    const signed = Buffer.from(block);
    rechecksum(signed, true);
    writeFileSync(path.join(t.dir, 'signed.tar'), signed);
    const d1 = path.join(t.dir, 'signed');
    mkdirSync(d1);
    expect((await extractArchive(path.join(t.dir, 'signed.tar'), d1, { hashFiles: true })).digests!.get('caf\u00e9')!.sha256).toBe(sha('x'));
    const bad = Buffer.from(block);
    bad.write('0000000001x\0', 124, 12, 'latin1');
    rechecksum(bad, false);
    writeFileSync(path.join(t.dir, 'badsize.tar'), bad);
    const d2 = path.join(t.dir, 'badsize');
    mkdirSync(d2);
    await expect(extractArchive(path.join(t.dir, 'badsize.tar'), d2)).rejects.toThrow(/unreadable size field at byte 0/);
    expect(readdirSync(d2)).toEqual([]);
  });

  it('stops when aborted, kills its processes and says so', async () => {
    // 256 MiB of zeros: a tiny archive that takes a while to write out.
    const archive = path.join(t.dir, 'zeros.tar.zst');
    execFileSync('sh', ['-c', `cd '${t.dir}' && head -c ${256 << 20} /dev/zero > zeros.bin && tar -cf - zeros.bin | zstd -q -o '${archive}' && rm zeros.bin`]);
    const dest = path.join(t.dir, 'aborted');
    mkdirSync(dest);
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 50);
    const before = execFileSync('sh', ['-c', 'pgrep -c -P $PPID || true'], { encoding: 'utf8' });
    await expect(extractArchive(archive, dest, { signal: ac.signal, hashFiles: true })).rejects.toThrow(/zeros\.tar\.zst: extraction aborted$/);
    expect(execFileSync('sh', ['-c', 'pgrep -c -P $PPID || true'], { encoding: 'utf8' })).toBe(before); // no zstd or tar left
    const already = new AbortController();
    already.abort();
    await expect(extractArchive(archive, dest, { signal: already.signal })).rejects.toThrow(/extraction aborted/);
  });

  it('does not keep the process alive once done (the idle unpack worker is unreferenced)', () => {
    const lib = transpiledLayers(path.join(t.dir, 'transpiled'));
    const archive = makeTar(path.join(t.dir, 'alive.tar'), [{ type: 'file', name: 'f', data: 'x' }]);
    const dest = path.join(t.dir, 'alive');
    mkdirSync(dest);
    const script = `import { extractArchive } from ${JSON.stringify(path.join(lib, 'files', 'extract.js'))};
      const r = await extractArchive(${JSON.stringify(archive)}, ${JSON.stringify(dest)}, { hashFiles: true });
      console.log(r.members, r.digests.size);`;
    const started = Date.now();
    const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
    expect(r.stderr).toBe('');
    expect(r.stdout.trim()).toBe('1 1');
    // Idle workers are stopped after 10 s; the process must not wait for that.
    expect(Date.now() - started).toBeLessThan(9_500);
  });
});
