/**
 * Sandbox.upload: host files and trees into a sandbox as tar streams (GNU tar
 * packs trees, node-tar packs single files), unpacked by the sandbox's tar.
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chmodSync, mkdirSync, symlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, Sandbox, SandboxError } from '../../lib/index.js';
import { isRoot, tempDir } from '../helpers.js';

let sb: Sandbox;
const host = tempDir('msbx-upload-');
const MTIME = new Date('2021-02-03T04:05:06Z');

beforeAll(async () => {
  sb = await Sandbox.create();
});
afterAll(async () => {
  await sb?.close();
  host.remove();
});

/** `stat` of a path as the sandbox sees it: type, octal mode, mtime seconds, size. */
async function statIn(path: string): Promise<string> {
  const r = await sb.exec(['stat', '-c', '%F %a %Y %s', path]);
  if (r.exitCode !== 0) throw new Error(r.stderr);
  return r.stdout.trim();
}

describe('Sandbox.upload', () => {
  it('copies a tree with its modes, mtimes and relative symlinks, merged into the target', async () => {
    const src = join(host.path, 'tree');
    mkdirSync(join(src, 'pkg/sub'), { recursive: true });
    writeFileSync(join(src, 'pkg/sub/mod.py'), 'x = 1\n');
    writeFileSync(join(src, 'run.sh'), '#!/bin/sh\necho ran\n');
    chmodSync(join(src, 'run.sh'), 0o750);
    utimesSync(join(src, 'pkg/sub/mod.py'), MTIME, MTIME);
    symlinkSync('pkg/sub/mod.py', join(src, 'link'));
    await sb.writeFile('/work/tree/kept.txt', 'already there');
    await sb.upload(src, '/work/tree');
    expect((await sb.exec('cat /work/tree/kept.txt /work/tree/link && /work/tree/run.sh')).stdout).toBe('already therex = 1\nran\n');
    expect(await statIn('/work/tree/run.sh')).toMatch(/^regular file 750 /);
    expect(await statIn('/work/tree/pkg/sub/mod.py')).toBe(`regular file 644 ${MTIME.getTime() / 1000} 6`);
    expect((await sb.exec('readlink /work/tree/link')).stdout).toBe('pkg/sub/mod.py\n');
  });

  it('copies a file under the target name, streamed, with its mode and mtime, creating missing directories', async () => {
    const file = join(host.path, 'blob.bin');
    const data = Buffer.alloc(24 << 20);
    for (let i = 0; i < data.length; i += 4096) data.writeUInt32LE(i * 2654435761 >>> 0, i);
    writeFileSync(file, data);
    chmodSync(file, 0o741);
    utimesSync(file, MTIME, MTIME);
    await sb.upload(file, 'deep/er/renamed.bin');
    expect(await statIn('/work/deep/er/renamed.bin')).toBe(`regular file 741 ${MTIME.getTime() / 1000} ${data.length}`);
    expect((await sb.exec('sha256sum /work/deep/er/renamed.bin')).stdout.split(' ')[0]).toBe(createHash('sha256').update(data).digest('hex'));
    // Nothing else landed beside it (the host name is not used).
    expect((await sb.exec('ls /work/deep/er')).stdout).toBe('renamed.bin\n');
  });

  it('names a file whatever its length (a pax header past 100 bytes) and replaces an existing file', async () => {
    const file = join(host.path, 'short.txt');
    writeFileSync(file, 'new');
    const long = `${'n'.repeat(200)}.txt`;
    await sb.writeFile(`/work/${long}`, 'old contents');
    await sb.upload(file, `/work/${long}`);
    expect(await sb.readFile(`/work/${long}`, 'utf8')).toBe('new');
  });

  it('refuses what is not a file or a directory, and a missing host path, naming it', async () => {
    const fifo = join(host.path, 'fifo');
    execFileSync('mkfifo', [fifo]);
    await expect(sb.upload(fifo, '/work/f')).rejects.toThrow(ConfigError);
    await expect(sb.upload(fifo, '/work/f')).rejects.toThrow(`hostPath: ${fifo} is neither a regular file nor a directory`);
    await expect(sb.upload(join(host.path, 'missing'), '/work/m')).rejects.toThrow(
      new SandboxError(`upload ${join(host.path, 'missing')} -> /work/m: no such file or directory on the host`),
    );
    await expect(sb.upload('', '/work/m')).rejects.toThrow('hostPath: must be a non-empty string');
    writeFileSync(join(host.path, 'plain'), 'x');
    await expect(sb.upload(join(host.path, 'plain'), '/')).rejects.toThrow('path: a file cannot become /');
  });

  it("reports the sandbox's refusal: a read-only target, a directory where the file should go", async () => {
    const src = join(host.path, 'ro');
    mkdirSync(src);
    writeFileSync(join(src, 'a'), 'a');
    await expect(sb.upload(src, '/usr/lib/msbx-upload')).rejects.toThrow(/^upload .* -> \/usr\/lib\/msbx-upload: .*Read-only file system/);
    await sb.exec('mkdir -p /work/adir/inside');
    await expect(sb.upload(join(src, 'a'), '/work/adir')).rejects.toThrow(/^upload .*\/a -> \/work\/adir: .*(Is a directory|File exists|Directory not empty)/);
    // The sandbox is still usable.
    expect((await sb.exec('true')).exitCode).toBe(0);
  });

  it('fails, naming the file, when the host cannot read part of the tree or the file', async (ctx) => {
    if (isRoot) return ctx.skip('root reads every file');
    const src = join(host.path, 'unreadable');
    mkdirSync(src);
    writeFileSync(join(src, 'ok.txt'), 'ok');
    writeFileSync(join(src, 'secret'), 'no');
    chmodSync(join(src, 'secret'), 0);
    await expect(sb.upload(src, '/work/unreadable')).rejects.toThrow(/tar on the host failed \(exit 2\): .*secret: Cannot open: Permission denied/);
    await expect(sb.upload(join(src, 'secret'), '/work/secret')).rejects.toThrow(/upload .*secret -> \/work\/secret: EACCES/);
  });
});
