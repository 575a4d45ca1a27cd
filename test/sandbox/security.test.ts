/**
 * The sandbox attacked for real: each test tries an escape that works
 * against a naive chroot sandbox and checks that it is blocked here.
 */
import { spawn as hostSpawn, execFileSync } from 'node:child_process';
import { mkdirSync, writeFileSync, readFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { run } from '../../lib/index.js';
import { isRoot, mountinfo, tempDir } from '../helpers.js';

const SECRET = `host-secret-${process.pid}-${Date.now()}`;
let host: ReturnType<typeof tempDir>;
let secretFile: string;
let shared: string;
const mountsBefore = mountinfo();

beforeAll(() => {
  host = tempDir('msbx-sec-');
  secretFile = join(host.path, 'secret.txt');
  writeFileSync(secretFile, SECRET);
  // A directory that is bound in, next to the secret that is not.
  shared = join(host.path, 'shared');
  mkdirSync(shared);
  writeFileSync(join(shared, 'visible.txt'), 'ok');
});

afterAll(() => {
  host.remove();
  expect(mountinfo()).toBe(mountsBefore);
});

const python = ['python3', '-c'];

describe('filesystem isolation', () => {
  it('cannot read a host file that is not bound in, by any path', async () => {
    const r = await run({
      argv: ['sh', '-c', `cat ${secretFile}; cat /data/../secret.txt; cat /proc/1/root${secretFile}; cat /proc/self/root${secretFile}; find / -path /proc -prune -o -path /usr -prune -o -name secret.txt -print 2>/dev/null; echo done`],
      mounts: [{ type: 'bind', source: shared, target: '/data', readOnly: true }],
    });
    expect(r.stdout).toBe('done\n');
    expect(r.stdout + r.stderr).not.toContain(SECRET);
  });

  it('sees none of the host root: not /home, not /work, not the host /tmp', async () => {
    const r = await run({ argv: ['sh', '-c', `ls -A /; ls ${host.path} 2>&1; ls /home 2>&1`] });
    expect(r.stdout.split('\n')).not.toContain('home');
    expect(r.stdout).toMatch(/No such file or directory/);
  });

  it('cannot write a read-only bind, nor remount it read-write', async () => {
    const r = await run({
      argv: ['sh', '-c', 'echo x > /data/visible.txt; mount -o remount,rw,bind /data; mount -o remount,rw /data; echo x > /data/new.txt; cat /data/visible.txt'],
      mounts: [{ type: 'bind', source: shared, target: '/data', readOnly: true }],
    });
    expect(r.stdout).toBe('ok');
    expect(existsSync(join(shared, 'new.txt'))).toBe(false);
    expect(readFileSync(join(shared, 'visible.txt'), 'utf8')).toBe('ok');
  });

  it('keeps the host /usr read-only even for root inside', async () => {
    const r = await run({ argv: ['sh', '-c', 'touch /usr/bin/pwned; echo $?'] });
    expect(r.stdout.trim()).not.toBe('0');
    expect(existsSync('/usr/bin/pwned')).toBe(false);
  });

  it.skipIf(!isRoot)('makes a read-only bind read-only on every host submount too', async () => {
    const sub = join(shared, 'sub');
    mkdirSync(sub, { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', 'tmpfs', sub]);
    try {
      const r = await run({
        argv: ['sh', '-c', 'echo x > /data/sub/f && echo wrote'],
        mounts: [{ type: 'bind', source: shared, target: '/data', readOnly: true }],
      });
      expect(r.stdout).toBe('');
      expect(r.stderr).toMatch(/Read-only file system/);
    } finally {
      execFileSync('umount', [sub]);
    }
  });

  it('does not follow a symlink planted in a bound tree out of the new root when creating mount targets', async () => {
    const dir = tempDir('msbx-link-');
    try {
      // /data/evil -> the host's secret dir; a mount target under it must be
      // created inside the sandbox's view, never in the host directory.
      execFileSync('ln', ['-s', host.path, join(dir.path, 'evil')]);
      // The link resolves inside the sandbox, where its target does not
      // exist: setup fails with a MountError rather than leave the root.
      await expect(
        run({
          argv: ['sh', '-c', 'ls /data/evil/made 2>&1; ls /data/evil 2>&1'],
          mounts: [
            { type: 'bind', source: dir.path, target: '/data' },
            { type: 'tmpfs', target: '/data/evil/made' },
          ],
        }),
      ).rejects.toThrow(/^tmpfs \/data\/evil\/made: target: ENOENT/);
      expect(existsSync(join(host.path, 'made'))).toBe(false);
    } finally {
      dir.remove();
    }
  });
});

describe('escaping the root', () => {
  // The classic chroot escape: keep a directory fd, chroot deeper, fchdir
  // back out and walk up with "..", then chroot(".").
  const escape = `
import os
fd = os.open('/', os.O_RDONLY)
os.makedirs('/tmp/jail', exist_ok=True)
try:
    os.chroot('/tmp/jail')
except PermissionError as e:
    print('chroot-denied'); raise SystemExit(0)
os.fchdir(fd)
for _ in range(64): os.chdir('..')
os.chroot('.')
print(sorted(os.listdir('/')))
print('secret-visible' if os.path.exists(${JSON.stringify('SECRET_PATH')}) else 'secret-hidden')
`;

  it('is blocked without capabilities', async () => {
    const r = await run({ argv: [...python, escape.replace('SECRET_PATH', secretFile)] });
    expect(r.stdout).toBe('chroot-denied\n');
  });

  it('leads nowhere with CAP_SYS_CHROOT: pivot_root left no old root to reach', async () => {
    const r = await run({ argv: [...python, escape.replace('SECRET_PATH', secretFile)], capabilities: ['CAP_SYS_CHROOT'] });
    expect(r.stderr).toBe('');
    expect(r.stdout).toContain('secret-hidden');
    expect(r.stdout).toContain("'work'"); // still the sandbox's own root
  });

  it('leads only to an empty base with the chroot fallback', async () => {
    const r = await run({
      argv: [...python, escape.replace('SECRET_PATH', secretFile)],
      capabilities: ['CAP_SYS_CHROOT'],
      rootSwitch: 'chroot',
    });
    expect(r.stdout).toContain('secret-hidden');
    expect(r.stdout).not.toContain("'home'");
  });

  it('cannot reach the host through /proc/1/root, /proc/self/cwd or fds', async () => {
    const r = await run({
      argv: ['sh', '-c', 'ls /proc/1/root/; readlink /proc/self/cwd; ls -l /proc/self/fd/ | grep -v -e pipe -e "/dev/null" -e total -e "/proc/" || true'],
    });
    expect(r.stdout).toContain('work');
    expect(r.stdout).not.toMatch(/\bhome\b/);
    expect(r.stdout).toContain('/work\n');
  });
});

describe('processes', () => {
  it('sees only its own tree', async () => {
    const r = await run({ argv: ['sh', '-c', 'ps -e -o pid=,comm='] });
    const lines = r.stdout.trim().split('\n').map((l) => l.trim());
    expect(lines[0]).toMatch(/^1 msbx-init$/);
    expect(lines.length).toBeLessThanOrEqual(3); // init, sh, ps
  });

  it('cannot signal a host process', async () => {
    const victim = hostSpawn('sleep', ['30'], { stdio: 'ignore' });
    try {
      const r = await run({ argv: ['sh', '-c', `kill -9 ${victim.pid}; echo rc=$?`] });
      expect(r.stdout).toBe('rc=1\n');
      expect(victim.exitCode).toBeNull();
      expect(victim.signalCode).toBeNull();
      expect(existsSync(`/proc/${victim.pid}`)).toBe(true);
    } finally {
      victim.kill('SIGKILL');
    }
  });

  it('gains nothing from setuid binaries', async () => {
    const r = await run({
      argv: ['sh', '-c', 'grep -E "^(NoNewPrivs|CapEff|CapBnd):" /proc/self/status; mount -t tmpfs none /tmp 2>&1; su -c id 2>&1; echo end'],
      mapUser: 'self',
    });
    expect(r.stdout).toMatch(/NoNewPrivs:\s+1/);
    expect(r.stdout).toMatch(/CapEff:\s+0+\n/);
    expect(r.stdout).toMatch(/CapBnd:\s+0+\n/);
    expect(r.stdout).not.toMatch(/uid=0/);
  });

  it('holds no capability at all by default, even as root inside', async () => {
    const r = await run({ argv: ['sh', '-c', 'grep -E "^Cap(Inh|Prm|Eff|Bnd|Amb):" /proc/self/status'] });
    for (const line of r.stdout.trim().split('\n')) expect(line).toMatch(/:\s+0{16}$/);
  });

  it('has no controlling terminal of the caller (no TIOCSTI into it)', async () => {
    const r = await run({ argv: ['sh', '-c', 'cat /proc/self/stat | cut -d" " -f6,7; tty'] });
    const [sid, ttyNr] = r.stdout.split('\n')[0]!.split(' ');
    expect(ttyNr).toBe('0');
    expect(sid).not.toBe('0');
  });
});

describe('network', () => {
  let server: ReturnType<typeof createServer>;
  let port = 0;
  beforeAll(async () => {
    server = createServer((s) => s.end('hello from host\n'));
    await new Promise<void>((res) => server.listen(0, '127.0.0.1', res));
    port = (server.address() as { port: number }).port;
  });
  afterAll(() => server.close());

  const connect = (p: number) => `
import socket
s = socket.socket()
s.settimeout(2)
try:
    s.connect(('127.0.0.1', ${p})); print(s.recv(100).decode().strip())
except OSError as e:
    print('blocked', type(e).__name__)
`;

  it('has only loopback with network none, and cannot reach host services', async () => {
    const r = await run({ argv: ['sh', '-c', `ls /sys/class/net 2>/dev/null || true; awk 'NR>2{print $1}' /proc/net/dev; python3 -c "${connect(port).replace(/"/g, '\\"')}"`] });
    const lines = r.stdout.trim().split('\n');
    expect(lines).toContain('lo:');
    expect(lines.filter((l) => l.endsWith(':'))).toEqual(['lo:']);
    expect(r.stdout).toMatch(/blocked ConnectionRefusedError/);
  });

  it('reaches the host with network host', async () => {
    const r = await run({ argv: [...python, connect(port)], network: 'host' });
    expect(r.stdout).toBe('hello from host\n');
  });
});
