import { fork } from 'node:child_process';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { run, spawn } from '../../lib/index.js';
import { hostPidsMatching, isRoot, mountinfo, tempDir, uniqueSleep, waitFor } from '../helpers.js';

const mountsBefore = mountinfo();
afterAll(() => {
  // Nothing a sandbox does may show up in the host's mount table.
  expect(mountinfo()).toBe(mountsBefore);
});

describe('run', () => {
  it('returns stdout, stderr, exit code and duration', async () => {
    const r = await run({ argv: ['sh', '-c', 'echo out; echo err >&2; exit 7'] });
    expect(r).toMatchObject({ stdout: 'out\n', stderr: 'err\n', exitCode: 7, signal: null, timedOut: false, failed: true });
    expect(r.durationMs).toBeGreaterThan(0);
  });

  it('feeds input and honours maxBuffer by killing the tree', async () => {
    expect((await run({ argv: ['tr', 'a-z', 'A-Z'], input: 'hello' })).stdout).toBe('HELLO');
    const r = await run({ argv: ['yes'], maxBuffer: 10_000 });
    expect(r.isMaxBuffer).toBe(true);
    expect(r.stdout.length).toBe(10_000);
    expect(r.signal).toBe('SIGKILL');
  });

  it('starts with a clean environment, its own hostname, root inside and /work as cwd', async () => {
    process.env.MSBX_HOST_ONLY = 'leak';
    const r = await run({ argv: ['sh', '-c', 'env; echo; hostname; id -u; pwd'], env: { GIVEN: 'yes' } });
    expect(r.stdout).not.toContain('MSBX_HOST_ONLY');
    expect(r.stdout).toContain('GIVEN=yes');
    expect(r.stdout.trim().split('\n').slice(-3)).toEqual(['sandbox', '0', '/work']);
    const inherited = await run({ argv: ['sh', '-c', 'echo $MSBX_HOST_ONLY'], inheritEnv: ['MSBX_HOST_ONLY'] });
    expect(inherited.stdout).toBe('leak\n');
  });

  it('copies the host /etc subset byte for byte, binary files included', async () => {
    const { createHash } = await import('node:crypto');
    const files = ['/etc/ld.so.cache', '/etc/passwd'].filter((f) => existsSync(f));
    const r = await run({ argv: ['sha256sum', ...files] });
    for (const f of files) {
      const hash = createHash('sha256').update(readFileSync(f)).digest('hex');
      expect(r.stdout).toContain(`${hash}  ${f}`);
    }
    // The copy is the sandbox's own: changing it never reaches the host.
    const before = readFileSync('/etc/passwd', 'utf8');
    await run({ argv: ['sh', '-c', 'echo intruder:x:0:0::/:/bin/sh >> /etc/passwd'] });
    expect(readFileSync('/etc/passwd', 'utf8')).toBe(before);
  });

  it('maps the caller to itself when asked', async () => {
    const r = await run({ argv: ['id', '-u'], mapUser: 'self' });
    expect(r.stdout.trim()).toBe(String(process.getuid!()));
  });

  it('binds host directories read-write or read-only', async () => {
    const dir = tempDir();
    try {
      writeFileSync(join(dir.path, 'in.txt'), 'from host');
      const rw = await run({
        argv: ['sh', '-c', 'cat /data/in.txt && echo from-sandbox > /data/out.txt'],
        mounts: [{ type: 'bind', source: dir.path, target: '/data' }],
      });
      expect(rw.stdout).toBe('from host');
      const ro = await run({
        argv: ['sh', '-c', 'cat /data/out.txt; echo x > /data/new.txt'],
        mounts: [{ type: 'bind', source: dir.path, target: '/data', readOnly: true }],
      });
      expect(ro.stdout).toBe('from-sandbox\n');
      expect(ro.stderr).toMatch(/Read-only file system/);
      expect(ro.exitCode).not.toBe(0);
    } finally {
      dir.remove();
    }
  });

  it('runs with a private /tmp, tmpfs sizes, symlinks, files and dirs', async () => {
    const r = await run({
      argv: ['sh', '-c', 'ls -A /tmp | wc -l; df -k /scratch | tail -1; cat /etc/motd.d/hello; readlink /ln; test -d /made && echo dir'],
      mounts: [
        { type: 'tmpfs', target: '/scratch', size: '4m' },
        { type: 'file', target: '/etc/motd.d/hello', content: 'hi\n' },
        { type: 'symlink', target: '/ln', linkTo: '/usr/bin' },
        { type: 'dir', target: '/made' },
      ],
    });
    const lines = r.stdout.trim().split('\n');
    expect(lines[0]).toBe('0');
    expect(lines[1]).toMatch(/\s4096\s/);
    expect(lines.slice(2)).toEqual(['hi', '/usr/bin', 'dir']);
  });

  it('gives files their exact modes, and files after a mount on their directory land on that mount', async () => {
    // Files and symlinks in one directory in a row reuse that directory's
    // fd; a mount on it in between must not leave later files under it.
    const r = await run({
      argv: ['sh', '-c', 'cd /d && stat -c "%n %a" a b c s e; readlink l; echo $(ls -A /d); stat -c "%a" /etc/hostname; cat /etc/hostname'],
      mounts: [
        { type: 'file', target: '/d/hidden', content: 'under\n' },
        { type: 'tmpfs', target: '/d' },
        { type: 'file', target: '/d/a', content: 'a', mode: 0o600 },
        { type: 'file', target: '/d/b', content: 'b', mode: 0o666 },
        { type: 'file', target: '/d/c', content: 'c', mode: 0o755 },
        { type: 'symlink', target: '/d/l', linkTo: 'a' },
        { type: 'file', target: '/d/s', content: 's', mode: 0o4755 },
        { type: 'file', target: '/d/e', content: '', mode: 0o640 },
        // Over a file the host root already wrote: its mode changes too.
        { type: 'file', target: '/etc/hostname', content: 'over\n', mode: 0o600 },
      ],
    });
    expect(r.stderr).toBe('');
    expect(r.stdout.split('\n')).toEqual(['a 600', 'b 666', 'c 755', 's 4755', 'e 640', 'a', 'a b c e l s', '600', 'over', '']);
  });

  it('mounts an overlay whose writes land in the upper dir only', async () => {
    const dir = tempDir();
    try {
      const [lower, upper, work] = ['lower', 'upper', 'work'].map((d) => join(dir.path, d)) as [string, string, string];
      for (const d of [lower, upper, work]) mkdirSync(d);
      writeFileSync(join(lower, 'base.txt'), 'base');
      const r = await run({
        argv: ['sh', '-c', 'cat /layer/base.txt; echo changed > /layer/base.txt; echo new > /layer/new.txt; rm -r /layer/base.txt; ls /layer'],
        mounts: [{ type: 'overlay', target: '/layer', lower: [lower], upper, work }],
      });
      expect(r.stderr).toBe('');
      expect(r.stdout).toBe('basenew.txt\n');
      expect(readFileSync(join(lower, 'base.txt'), 'utf8')).toBe('base');
      expect(readFileSync(join(upper, 'new.txt'), 'utf8')).toBe('new\n');
    } finally {
      dir.remove();
    }
  });

  it('passes extra fds and nothing else', async () => {
    const dir = tempDir();
    try {
      const file = join(dir.path, 'f');
      writeFileSync(file, 'via fd 5');
      const fd = openSync(file, 'r');
      const r = await run({ argv: ['sh', '-c', 'cat <&5; ls /proc/self/fd | sort -n | tr "\\n" " "'], fds: { 5: fd } });
      closeSync(fd);
      // 0,1,2, the fd we gave, and the one `ls` itself opens.
      expect(r.stdout).toMatch(/^via fd 50 1 2 3 5 $/);
    } finally {
      dir.remove();
    }
  });
});

describe('spawn', () => {
  it('gives streams, exited and kill', async () => {
    const p = spawn({ argv: ['sh', '-c', 'read line; echo got $line; exec sleep 100'] });
    expect(p.pid).toBeGreaterThan(0);
    await p.ready;
    p.stdin!.write('ping\n');
    const first = await new Promise<string>((res) => p.stdout!.once('data', (c) => res(String(c))));
    expect(first).toBe('got ping\n');
    expect(p.kill('SIGTERM')).toBe(true);
    expect(await p.exited).toEqual({ exitCode: null, signal: 'SIGTERM' });
    expect(p.kill()).toBe(false);
  });

  it('runs on a new pseudo-terminal', async () => {
    const p = spawn({ argv: ['sh', '-c', 'tty; test -t 0 && echo stdin-is-tty; stty size; ls /dev/pts'], pty: { cols: 100, rows: 30 } });
    await p.ready;
    let out = '';
    p.terminal!.on('data', (c) => (out += String(c)));
    expect((await p.exited).exitCode).toBe(0);
    await waitFor(() => out.includes('30 100'), 1000);
    // Allocated in the sandbox's own devpts: the only terminal there.
    expect(out).toMatch(/\/dev\/pts\/0\r\n/);
    expect(out).toMatch(/\r\n0\s+ptmx\r\n/);
    expect(out).toContain('stdin-is-tty');
    expect(out).toContain('30 100');
  });

  it('a timeout kills grandchildren too', async () => {
    const mark = uniqueSleep();
    const r = await run({ argv: ['sh', '-c', `sleep ${mark} & sleep ${mark}`], timeout: 300 });
    expect(r.timedOut).toBe(true);
    expect(r.signal).toBe('SIGKILL');
    expect(hostPidsMatching(mark)).toEqual([]);
  });

  it('an AbortSignal kills the whole tree', async () => {
    const mark = uniqueSleep();
    const ac = new AbortController();
    const p = spawn({ argv: ['sh', '-c', `(sleep ${mark} &) ; sleep ${mark}`], signal: ac.signal });
    await p.ready;
    expect(await waitFor(() => hostPidsMatching(mark).length >= 2)).toBe(true);
    ac.abort();
    await p.exited;
    expect(p.isCanceled).toBe(true);
    expect(hostPidsMatching(mark)).toEqual([]);
  });

  it('SIGKILL of the owning Node process leaves no sandboxed process', async () => {
    const mark = uniqueSleep();
    const dir = tempDir();
    let owner: ReturnType<typeof fork> | undefined;
    try {
      const script = join(dir.path, 'owner.mjs');
      // A plain Node child (no vitest transform): it loads the built package.
      const entry = new URL('../../dist/lib/index.js', import.meta.url).pathname;
      writeFileSync(
        script,
        `const { spawn } = await import(${JSON.stringify(entry)});
         const p = spawn({ argv: ['sh', '-c', 'sleep ${mark} & sleep ${mark}'] });
         await p.ready; process.send('ready'); setInterval(() => {}, 1000);`,
      );
      const child = fork(script, [], { stdio: 'ignore' });
      owner = child;
      const ready = await new Promise((res) => {
        child.on('message', res);
        child.on('exit', () => res('exited'));
      });
      expect(ready).toBe('ready');
      expect(await waitFor(() => hostPidsMatching(mark).length >= 2)).toBe(true);
      child.kill('SIGKILL');
      expect(await waitFor(() => hostPidsMatching(mark).length === 0)).toBe(true);
    } finally {
      owner?.kill('SIGKILL');
      dir.remove();
    }
  });

  it.skipIf(!isRoot)('as root, the sandbox still runs in its own user namespace', async () => {
    const r = await run({ argv: ['sh', '-c', 'readlink /proc/self/ns/user'] });
    const { readlinkSync } = await import('node:fs');
    expect(r.stdout.trim()).not.toBe(readlinkSync('/proc/self/ns/user'));
  });
});
