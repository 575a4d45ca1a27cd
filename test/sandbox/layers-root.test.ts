/**
 * `root: { layers }`: an overlay of host directories as the whole root, with
 * a private writable upper, overlayfs whiteouts in the layers, and fresh
 * /proc, /dev, /tmp. Real trees, real overlays: as root and as msbx-ci, with
 * `ids: 'single'` and `ids: 'range'`.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, Sandbox, idRangeSupport, run, type SandboxOptions } from '../../lib/sandbox/index.js';
import { DEV_NODES, FILE_CAPABILITIES } from '../../lib/sandbox/policy.js';
import { isRoot, tempDir } from '../helpers.js';

const rangeSkip = idRangeSupport().ok ? false : 'this user has no id range';

/**
 * Every entry under `dir`: type and mode, owner, size, mtime, device
 * number, link text, xattrs (Node has no listxattr: one python3 walk).
 */
const LISTING = `
import os, sys
top = sys.argv[1]
for root, dirs, files in os.walk(top):
    dirs.sort()
    for name in sorted(dirs + files):
        p = os.path.join(root, name)
        st = os.lstat(p)
        link = os.readlink(p) if os.path.islink(p) else ''
        xattrs = [] if link else sorted((k, os.getxattr(p, k)) for k in os.listxattr(p))
        print(p[len(top):], oct(st.st_mode), st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_rdev, link, xattrs)
`;
function listing(dir: string): string[] {
  return execFileSync('python3', ['-c', LISTING, dir], { encoding: 'utf8' }).trim().split('\n');
}

/**
 * Two layers, top first. The bottom one is a small root: the host's merged
 * /usr symlinks (/usr itself comes from a read-only bind, `mounts`), /etc
 * with files to delete, change and keep, a directory the top layer makes
 * opaque. The top one holds a whiteout of /etc/gone (a 0/0 character
 * device, which mknod makes without privilege since Linux 5.8) and the
 * opaque /opq (xattr user.overlay.opaque=y, read in userxattr mode).
 */
let dir: ReturnType<typeof tempDir>;
let top: string;
let bottom: string;
let before: string[];
const usr = { type: 'bind', source: '/usr', target: '/usr', readOnly: true } as const;

beforeAll(() => {
  dir = tempDir('msbx-layers-');
  top = join(dir.path, 'top');
  bottom = join(dir.path, 'bottom');
  for (const d of ['etc', 'opq', 'data']) mkdirSync(join(bottom, d), { recursive: true });
  for (const [link, to] of [['bin', 'usr/bin'], ['lib', 'usr/lib'], ['lib64', 'usr/lib64'], ['sbin', 'usr/sbin']]) symlinkSync(to!, join(bottom, link!));
  writeFileSync(join(bottom, 'etc/gone'), 'from the bottom layer\n');
  writeFileSync(join(bottom, 'etc/keep'), 'kept\n');
  writeFileSync(join(bottom, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\n');
  writeFileSync(join(bottom, 'opq/old'), 'old\n');
  writeFileSync(join(bottom, 'data/victim'), 'victim\n');
  for (const d of ['etc', 'opq']) mkdirSync(join(top, d), { recursive: true });
  writeFileSync(join(top, 'opq/new'), 'new\n');
  writeFileSync(join(top, 'etc/keep'), 'kept, from the top layer\n');
  execFileSync('mknod', [join(top, 'etc/gone'), 'c', '0', '0']);
  execFileSync('python3', ['-c', 'import os,sys; os.setxattr(sys.argv[1], "user.overlay.opaque", b"y")', join(top, 'opq')]);
  before = [...listing(top), ...listing(bottom)];
});

afterAll(() => dir?.remove());

describe.each([
  { ids: 'single' as const, skip: false as false | string },
  { ids: 'range' as const, skip: rangeSkip as false | string },
])("root: { layers } with ids: '$ids'", ({ ids, skip }) => {
  const opts = (): SandboxOptions => ({ root: { layers: [top, bottom] }, mounts: [usr], ids });
  // What chown can give a lower file: another id where one is mapped.
  const newOwner = ids === 'range' || isRoot ? '1000:1000' : '0:0';

  it.skipIf(skip)('shows the layers merged: a whiteout hides, an opaque directory shows only the top', async () => {
    const r = await run({ ...opts(), argv: ['sh', '-c', 'ls -A /etc; echo --; ls -A /opq; echo --; cat /etc/keep; test -e /etc/gone || echo gone-hidden'] });
    expect(r.stderr).toBe('');
    // hostname and hosts are the sandbox's own (as for a host root).
    expect(r.stdout).toBe('hostname\nhosts\nkeep\npasswd\n--\nnew\n--\nkept, from the top layer\ngone-hidden\n');
  });

  it.skipIf(skip)('root inside can rm, chmod and chown lower files; the layers on the host do not change', async () => {
    const script = [
      'rm /etc/keep /data/victim',
      'chmod 600 /etc/passwd',
      `chown ${newOwner} /etc/passwd`,
      'rm -r /opq',
      'echo new > /created',
      'stat -c "%a %u:%g" /etc/passwd',
      'ls -A /data /',
    ].join(' && ');
    const r = await run({ ...opts(), argv: ['sh', '-c', script], capabilities: FILE_CAPABILITIES });
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe(`600 ${newOwner}\n/:\nbin\ncreated\ndata\ndev\netc\nlib\nlib64\nproc\nsbin\ntmp\nusr\n\n/data:\n`);
    expect([...listing(top), ...listing(bottom)]).toEqual(before);
  });

  it.skipIf(skip)(`lower files look owned as on the host${isRoot ? " (root's files root's: idmapped)" : " (the caller's files are root's inside)"}`, async () => {
    const r = await run({ ...opts(), argv: ['stat', '-c', '%u:%g', '/etc/passwd', '/opq/new', '/usr/bin/env'] });
    const usrOwner = isRoot ? '0:0' : '65534:65534';
    expect(r.stdout).toBe(`0:0\n0:0\n${usrOwner}\n`);
  });

  it.skipIf(skip)('has fresh /proc, /dev and /tmp, and nothing of the host root', async () => {
    const script = [
      'echo pid=$$',
      'ls /proc | grep -c "^[0-9]"',
      'ls -A /dev | tr "\\n" " "; echo',
      'ls -A /tmp | wc -l',
      'stat -f -c %T /tmp',
      'cat /etc/hostname',
      'for p in /oldroot /newroot /home /root /var /work /etc/shadow /etc/os-release; do test -e $p && echo "visible $p"; done',
      'cut -d" " -f5 /proc/self/mountinfo | tr "\\n" " "',
    ].join('; ');
    const r = await run({ ...opts(), argv: ['sh', '-c', script], hostname: 'img' });
    const [pid, procs, dev, tmpCount, tmpType, hostname, mountpoints] = r.stdout.split('\n');
    expect(pid).toBe('pid=2'); // PID 1 is the sandbox's init
    expect(Number(procs)).toBeLessThanOrEqual(4);
    expect(dev!.trim().split(' ').sort()).toEqual([...DEV_NODES, 'core', 'fd', 'ptmx', 'pts', 'shm', 'stderr', 'stdin', 'stdout'].sort());
    expect([tmpCount, tmpType, hostname]).toEqual(['0', 'tmpfs', 'img']);
    expect(r.stdout).not.toMatch(/visible/);
    // The root, /usr (asked for), and what a host root has too.
    const points = new Set(mountpoints!.trim().split(' '));
    expect([...points].filter((p) => !/^\/(usr|dev|proc|tmp)?(\/|$)/.test(p))).toEqual([]);
    expect(points.has('/')).toBe(true);
  });

  it.skipIf(skip)("Sandbox.create: the upper is the sandbox's own, on the host, and goes with close()", async () => {
    const sb = await Sandbox.create({ ...opts(), capabilities: FILE_CAPABILITIES });
    try {
      expect(sb.cwd).toBe('/');
      const r = await sb.exec('echo kept > /etc/written && rm /etc/passwd && cat /etc/keep && pwd');
      expect(r.stdout).toBe('kept, from the top layer\n/\n');
      const upper = join(sb.privateDir, 'root', 'upper');
      expect(readFileSync(join(upper, 'etc/written'), 'utf8')).toBe('kept\n');
      // Deleting a lower file leaves a whiteout in the upper, not a change below.
      expect(lstatSync(join(upper, 'etc/passwd')).isCharacterDevice()).toBe(true);
      // The next command sees the same tree (enter joins the mount namespace).
      expect((await sb.exec('cat /etc/written; test -e /etc/passwd || echo no-passwd')).stdout).toBe('kept\nno-passwd\n');
      // /work only when asked.
      expect((await sb.exec('test -e /work || echo no-work')).stdout).toBe('no-work\n');
    } finally {
      await sb.close();
    }
    expect(existsSync(sb.privateDir)).toBe(false);
    expect([...listing(top), ...listing(bottom)]).toEqual(before);
  });

  it.skipIf(skip)('a workDir is bound at /work and becomes the default cwd', async () => {
    const work = tempDir('msbx-layers-work-');
    try {
      const r = await run({ ...opts(), workDir: work.path, argv: ['sh', '-c', 'pwd; echo hi > out'] });
      expect(r.stdout).toBe('/work\n');
      expect(readFileSync(join(work.path, 'out'), 'utf8')).toBe('hi\n');
    } finally {
      work.remove();
    }
  });
});

describe('root: { layers } options', () => {
  it('refuses an empty list, a missing directory, a file, and unknown keys', async () => {
    await expect(run({ argv: ['true'], root: { layers: [] } })).rejects.toThrow("root.layers: needs at least one host directory (highest priority first)");
    await expect(run({ argv: ['true'], root: { layers: ['/nonexistent-layer'] } })).rejects.toThrow('root.layers[0]: root layer /nonexistent-layer does not exist');
    await expect(run({ argv: ['true'], root: { layers: ['/etc/hostname'] } })).rejects.toThrow(ConfigError);
    await expect(run({ argv: ['true'], root: { layers: [top], upper: '/x' } as never })).rejects.toThrow('root.upper: unknown option (root takes { layers })');
    await expect(run({ argv: ['true'], root: 'image' as never })).rejects.toThrow("root: 'image' must be 'host', 'empty' or { layers: [...] }");
  });

  it.skipIf(isRoot)("as a user: a layer of another owner's is refused up front (nothing in it could be changed inside)", async () => {
    await expect(run({ argv: ['true'], root: { layers: [top, '/usr'] } })).rejects.toThrow(
      `root.layers[1]: root layer /usr belongs to uid 0, which is not mapped in the sandbox (mapped: ${process.getuid!()})`,
    );
  });

  it.skipIf(!isRoot)("as root: any host directory can be a layer, root's files root's inside", async () => {
    const r = await run({ argv: ['/bin/stat', '-c', '%u', '/bin/stat'], root: { layers: ['/usr'] } });
    expect(r.stdout).toBe('0\n');
  });
});
