/**
 * Attacks on what a sandbox is by default, each of which worked before the
 * sandbox was hardened: a root caller's sandbox acting as the host's root,
 * a command stopping what enforces its timeout, the host process's command
 * line read from inside, unbounded processes and tmpfs, a dead sandbox that
 * says nothing useful. They run as root and as an unprivileged user; what
 * only one of them can show is skipped with the reason.
 */
import { execFileSync, spawn, spawnSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { Sandbox, SandboxError, run } from '../../lib/index.js';
import { DEFAULT_PIDS, FILE_CAPABILITIES, TMPFS_SIZES, rootIdRange } from '../../lib/sandbox/policy.js';
import { isRoot, tempDir, uniqueSleep, waitFor } from '../helpers.js';

const userExists = spawnSync('id', ['msbx-ci']).status === 0;
const cgroupV1 = (c: string) => existsSync(`/sys/fs/cgroup/${c}/cgroup.procs`) && !existsSync('/sys/fs/cgroup/cgroup.controllers');

describe('the sandbox root is not the host root', () => {
  const DEVICES = ['null', 'zero', 'full', 'random', 'urandom', 'tty'];

  it('uses the device nodes but cannot change them, even with file capabilities', async () => {
    const before = DEVICES.map((d) => statSync(`/dev/${d}`));
    const tamper = DEVICES.map((d) => `chmod 600 /dev/${d} 2>/dev/null && echo chmod-${d}; touch /dev/${d} 2>/dev/null && echo touch-${d}; chown 1 /dev/${d} 2>/dev/null && echo chown-${d}`).join('; ');
    const r = await run({ argv: ['sh', '-c', `echo x > /dev/null && echo wrote; head -c 4 /dev/urandom | wc -c; ${tamper}; true`], capabilities: FILE_CAPABILITIES });
    expect(r.stdout).toBe('wrote\n4\n');
    DEVICES.forEach((d, i) => {
      const after = statSync(`/dev/${d}`);
      expect({ d, mode: after.mode, uid: after.uid, mtime: after.mtimeMs }).toEqual({ d, mode: before[i]!.mode, uid: before[i]!.uid, mtime: before[i]!.mtimeMs });
    });
  });

  it.skipIf(!isRoot)("as root: runs as an unprivileged host range, so what it writes is not root's, setuid bit included", async () => {
    const range = rootIdRange();
    await using sb = await Sandbox.create();
    expect(sb.isolation).toMatchObject({ hostRootInside: false, uidMap: `0 ${range.uid} ${range.count}` });
    // Inside it is root, and the host's root-owned files look root's (idmapped).
    const inside = await sb.exec('id -u; stat -c %u /usr /etc/ssl; cp /usr/bin/id /work/suid-id && chmod 4755 /work/suid-id && mkdir /work/d && touch /work/d/f && stat -c %u /work/suid-id');
    expect(inside.stdout).toBe('0\n0\n0\n0\n');
    expect(sb.isolation.notIdmapped).toEqual([]);
    const work = join(sb.privateDir, 'work');
    for (const f of ['suid-id', 'd', 'd/f']) expect({ f, uid: statSync(join(work, f)).uid }).toEqual({ f, uid: range.uid });
    expect(statSync(join(work, 'suid-id')).mode & 0o4000).toBe(0o4000);
    if (userExists) {
      // Run by another user on the host, the setuid copy grants the
      // sandbox's unprivileged id, never root.
      const dir = tempDir('msbx-suid-');
      try {
        chmodSync(dir.path, 0o755);
        const copy = join(dir.path, 'id');
        execFileSync('cp', ['-p', join(work, 'suid-id'), copy]);
        const euid = execFileSync('runuser', ['-u', 'msbx-ci', '--', copy, '-u'], { encoding: 'utf8' }).trim();
        expect(euid).toBe(String(range.uid));
      } finally {
        dir.remove();
      }
    }
  });

  it.skipIf(!isRoot)('as root: a filesystem that cannot be idmapped is bound as it is, and the sandbox says so', async () => {
    // sysfs does not take id mappings.
    await using sb = await Sandbox.create({ mounts: [{ type: 'bind', source: '/sys/kernel', target: '/k', readOnly: true }] });
    expect(sb.isolation.notIdmapped).toEqual(['ro-bind /sys/kernel -> /k: EINVAL (invalid argument)']);
    // Root's files there show as nobody's, and stay unwritable.
    const r = await sb.exec('stat -c %u /k; touch /k/x 2>&1; echo rc=$?', { capabilities: FILE_CAPABILITIES });
    expect(r.stdout).toMatch(/^65534\n.*\nrc=1\n$/s);
  });

  it.skipIf(isRoot)('as a user: the sandbox root is the caller and nobody else', async () => {
    await using sb = await Sandbox.create();
    expect(sb.isolation.uidMap).toBe(`0 ${process.getuid!()} 1`);
    await sb.exec('touch /work/f');
    expect(statSync(join(sb.privateDir, 'work', 'f')).uid).toBe(process.getuid!());
    // Other host ids are unmapped: chown to them fails even with CAP_CHOWN.
    const r = await sb.exec('chown 1000 /work/f', { capabilities: FILE_CAPABILITIES });
    expect(r.exitCode).not.toBe(0);
  });

  it.skipIf(!isRoot || !cgroupV1('pids'))('as root: cannot raise its own limits or lower another sandbox\'s, even from a nested user namespace', async () => {
    await using a = await Sandbox.create({ limits: { pids: 64 }, nesting: true });
    await using b = await Sandbox.create({ limits: { pids: 64 } });
    const file = (id: string) => `/sys/fs/cgroup/pids/minisandbox/${id}/pids.max`;
    // nesting lifts the seccomp rules, so only the id mapping stands here.
    const attack = `unshare -U -m -C sh -c 'mount -t cgroup -o pids none /mnt 2>&1 || mount -t cgroup -o pids,noprefix none /mnt 2>&1; echo max > /mnt/minisandbox/${a.id}/pids.max && echo raised; echo 3 > /mnt/minisandbox/${b.id}/pids.max && echo lowered'`;
    const r = await a.exec(attack);
    expect(r.stdout).not.toMatch(/raised|lowered/);
    expect(readFileSync(file(a.id), 'utf8').trim()).toBe('64');
    expect(readFileSync(file(b.id), 'utf8').trim()).toBe('64');
    // The limit holds: a fork bomb stops at it.
    const bomb = await a.exec('for i in $(seq 200); do sleep 30 & done 2>/dev/null; sleep 0.2; ps -e --no-headers | wc -l', { timeout: 20_000 });
    expect(Number(bomb.stdout.trim())).toBeLessThanOrEqual(64);
    expect(bomb.pidsLimited).toBe(true);
    await a.killAll();
  });
});

describe('timeouts the sandbox cannot stop', () => {
  // Each command attacks what enforces its timeout, then leaves processes
  // behind in every way it can: background, new session, double fork.
  // (Its parent shows as pid 0 inside: `kill $PPID` signals the command's
  // own process group.)
  const attacks = [
    'kill -STOP $PPID',
    'kill -STOP 0',
    'kill -STOP -1',
    'kill -STOP 1; kill -KILL 1',
    'for p in $(ps -eo pid=); do [ $p -ne $$ ] && kill -STOP $p; done',
  ];
  it.each(attacks)('exec with a timeout returns on time after `%s`, and its whole tree is gone', async (attack) => {
    await using sb = await Sandbox.create();
    const marker = uniqueSleep();
    const started = performance.now();
    const r = await sb.exec(`sleep ${marker} & setsid sleep ${marker} & (sleep ${marker} &) ; ${attack}; sleep ${marker}`, { timeout: 1000 });
    const took = performance.now() - started;
    expect(r.timedOut).toBe(true);
    expect(took).toBeLessThan(15_000);
    // Nothing of the command is left, and the sandbox still works.
    const ps = await sb.exec('ps -eo stat=,args=', { timeout: 10_000 });
    expect(ps.stdout).not.toContain(marker);
    expect(ps.exitCode).toBe(0);
  });

  it('a session command that stops its own shell times out, and an interrupt brings the session back', async () => {
    await using sb = await Sandbox.create();
    const sh = await sb.shell();
    for (const attack of ['kill -STOP $$', 'kill -STOP $PPID']) {
      const started = performance.now();
      await expect(sh.run(attack, { timeoutMs: 1000 })).rejects.toThrow(/timeout after 1 seconds/);
      expect(performance.now() - started).toBeLessThan(10_000);
      await sh.interrupt();
      expect((await sh.run('echo alive', { timeoutMs: 5000 })).output).toBe('alive\n');
    }
  });

  it('a command that kills its own process group ends, and says so', async () => {
    await using sb = await Sandbox.create();
    const r = await sb.exec('kill -KILL $PPID; sleep 1000', { timeout: 5000 });
    expect({ timedOut: r.timedOut, signal: r.signal }).toEqual({ timedOut: false, signal: 'SIGKILL' });
  });

  it('cannot see its monitor: no process of the sandbox is outside the sandbox\'s tree', async () => {
    await using sb = await Sandbox.create();
    const r = await sb.exec('ps -eo pid=,ppid=,comm=');
    const rows = r.stdout.trim().split('\n').map((l) => l.trim().split(/\s+/));
    expect(rows.map((x) => x[2])).not.toContain('msbx-exec');
    // The command's parent is outside: it shows as 0, and cannot be named.
    expect(rows.find((x) => x[2] === 'sh')?.[1]).toBe('0');
  });

  it('a killTree request works whatever the command did to its surroundings', async () => {
    await using sb = await Sandbox.create();
    const marker = uniqueSleep();
    const p = sb.spawn(`kill -STOP $PPID 0 2>/dev/null; setsid sleep ${marker} & sleep ${marker}`);
    await p.ready;
    await new Promise((r) => setTimeout(r, 300));
    p.killTree();
    const exit = await p.exited;
    expect(exit.signal).toBe('SIGKILL');
    const ps = await sb.exec('ps -eo args=');
    expect(ps.stdout).not.toContain(marker);
  });
});

describe("nothing of the host process is readable from inside", () => {
  it("neither its command line, nor its environment, executable or files", () => {
    const secret = `SECRET-${process.pid}-${Date.now()}`;
    const dir = tempDir('msbx-argv-');
    try {
      const indexJs = join(process.cwd(), 'dist/lib/index.js');
      const script = join(dir.path, 'host.mjs');
      // A host process with a secret on its command line and in its
      // environment, like `serve --auth-token TOKEN`.
      writeFileSync(
        script,
        `
import { Sandbox, run } from ${JSON.stringify(indexJs)};
const look = 'for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ /proc/self/mountinfo; do cat $f 2>/dev/null; echo; done; readlink /proc/1/exe /proc/1/cwd 2>&1; ls /proc/1/fd 2>&1; cat /proc/1/maps 2>&1 | head -3';
const r = await run({ argv: ['sh', '-c', look] });
const sb = await Sandbox.create();
const e = await sb.exec(look);
const withPtrace = await sb.exec(look, { capabilities: ['CAP_SYS_PTRACE'] });
await sb.close();
process.stdout.write(JSON.stringify({ run: r.stdout + r.stderr, exec: e.stdout + e.stderr, ptrace: withPtrace.stdout + withPtrace.stderr }));
`,
      );
      const out = execFileSync(process.execPath, [script, '--auth-token', secret], { encoding: 'utf8', env: { ...process.env, MSBX_SECRET: secret }, timeout: 30_000 });
      const seen = JSON.parse(out) as Record<string, string>;
      for (const view of ['run', 'exec'] as const) {
        expect(seen[view]).not.toContain(secret);
        expect(seen[view]).not.toContain(process.execPath);
        expect(seen[view]).not.toContain('host.mjs');
        expect(seen[view]).toMatch(/msbx-init/);
      }
      // Granting CAP_SYS_PTRACE opens PID 1 to inspection only for a
      // caller who is not root (see docs/architecture.md); never the secret.
      expect(seen.ptrace).not.toContain(secret);
      if (isRoot) expect(seen.ptrace).not.toContain(process.execPath);
    } finally {
      dir.remove();
    }
  });
});

describe('default limits', () => {
  it('caps processes in a fresh sandbox and in a persistent one', async () => {
    const bomb = `
import os, time
n = 0
while n < ${DEFAULT_PIDS * 2}:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
print(n)
`;
    const r = await run({ argv: ['python3', '-c', bomb], timeout: 60_000 });
    expect(Number(r.stdout.trim())).toBeLessThan(DEFAULT_PIDS);
    expect(Number(r.stdout.trim())).toBeGreaterThan(DEFAULT_PIDS / 2);
    await using sb = await Sandbox.create();
    expect(sb.limits.pids.limit).toBe(DEFAULT_PIDS);
    expect(sb.limits.pids.enforcedBy).not.toBe('none');
    const e = await sb.exec(['python3', '-c', bomb], { timeout: 60_000 });
    expect(Number(e.stdout.trim())).toBeLessThan(DEFAULT_PIDS);
    await sb.killAll();
  }, 120_000);

  it('sizes /tmp, /dev/shm, / and /work; a flood stops at the size', async () => {
    const r = await run({ argv: ['sh', '-c', 'df -k / /tmp /dev/shm /work | tail -n +2 | awk \'{print $6, $2}\'; head -c 100M /dev/zero > /dev/shm/fill; echo rc=$?'] });
    const sizes = Object.fromEntries(r.stdout.trim().split('\n').filter((l) => l.startsWith('/')).map((l) => l.split(' ')));
    const kib = (s: string) => Number(s.slice(0, -1)) * (s.endsWith('g') ? 1024 * 1024 : 1024);
    expect(Number(sizes['/tmp'])).toBe(kib(TMPFS_SIZES.tmp));
    expect(Number(sizes['/dev/shm'])).toBe(kib(TMPFS_SIZES.shm));
    expect(Number(sizes['/'])).toBe(kib(TMPFS_SIZES.root));
    expect(Number(sizes['/work'])).toBe(kib(TMPFS_SIZES.work));
    expect(r.stdout).toMatch(/rc=1/);
    expect(r.stderr).toMatch(/No space left on device/);
    await using sb = await Sandbox.create({ tmp: { size: '8m' } });
    expect(sb.limits.tmpfs).toEqual({ '/': TMPFS_SIZES.root, '/tmp': '8m', '/dev/shm': TMPFS_SIZES.shm });
    expect((await sb.exec('head -c 9M /dev/zero > /tmp/f')).stderr).toMatch(/No space left/);
  });

  it('reads a file into memory only up to a bound, and says why it refuses', async () => {
    await using sb = await Sandbox.create();
    await sb.exec('head -c 2M /dev/zero > /work/big');
    await expect(sb.readFile('/work/big', { maxBytes: 1024 * 1024 })).rejects.toThrow(/^readFile \/work\/big: larger than 1048576 bytes/);
    expect((await sb.readFile('/work/big', { maxBytes: 4 * 1024 * 1024 })).length).toBe(2 * 1024 * 1024);
    expect(await sb.readFile('/work/big', { encoding: 'latin1', maxBytes: 3 * 1024 * 1024 })).toHaveLength(2 * 1024 * 1024);
  });

  it('a sandbox whose PID 1 was killed says so on the next call', async () => {
    const sb = await Sandbox.create();
    process.kill(sb.pid, 'SIGKILL');
    await waitFor(() => sb.closed);
    const err = await sb.exec('true').catch((e) => e);
    expect(err).toBeInstanceOf(SandboxError);
    expect(err.message).toMatch(new RegExp(`^sandbox ${sb.id} was killed: PID 1 got SIGKILL`));
    await expect(sb.shell()).rejects.toThrow(/was killed/);
    await sb.close();
    expect(existsSync(sb.privateDir)).toBe(false);
  });

  it.skipIf(!isRoot || !cgroupV1('memory'))('as root: a memory limit kills the hog, not the sandbox, and says so', async () => {
    await using sb = await Sandbox.create({ limits: { memory: '64m' } });
    const hog = await sb.exec(['python3', '-c', 'x = bytearray(200 * 1024 * 1024); print(len(x))']);
    expect(hog.oomKilled).toBe(true);
    expect(hog.signal).toBe('SIGKILL');
    // PID 1 is no candidate: the sandbox answers.
    expect((await sb.exec('echo alive')).stdout).toBe('alive\n');
  });
});

describe('what is left and what shows', () => {
  it.skipIf(!isRoot || !cgroupV1('pids'))("gc removes the cgroups of an owner killed by SIGKILL", async () => {
    const indexJs = join(process.cwd(), 'dist/lib/index.js');
    const state = tempDir('msbx-cgstate-');
    try {
      const script = join(state.path, 'owner.mjs');
      writeFileSync(script, `import { Sandbox } from ${JSON.stringify(indexJs)};
const sb = await Sandbox.create({ stateDir: ${JSON.stringify(join(state.path, 'state'))}, limits: { pids: 10, memory: '64m' } });
console.log(sb.id);
setInterval(() => {}, 1000);
`);
      const owner = spawn(process.execPath, [script], { stdio: ['ignore', 'pipe', 'inherit'] });
      const id = await new Promise<string>((resolve) => owner.stdout.once('data', (d: Buffer) => resolve(d.toString().trim())));
      expect(id).toMatch(/^sbx-/);
      expect(existsSync(`/sys/fs/cgroup/pids/minisandbox/${id}`)).toBe(true);
      owner.kill('SIGKILL');
      await new Promise((r) => owner.once('exit', r));
      const { collectGarbage } = await import('../../lib/sandbox/state.js');
      // Old enough to be nobody's sandbox in the making.
      const result = await collectGarbage(join(state.path, 'state'), { minAgeMs: 0 });
      expect(result.removed.some((d) => d.endsWith(id))).toBe(true);
      expect(existsSync(`/sys/fs/cgroup/pids/minisandbox/${id}`)).toBe(false);
      expect(existsSync(`/sys/fs/cgroup/memory/minisandbox/${id}`)).toBe(false);
    } finally {
      state.remove();
    }
  });

  it('mountinfo inside names no layer of the store and no private directory of an overlay', async () => {
    const dir = tempDir('msbx-layers-');
    try {
      mkdirSync(join(dir.path, 'lower'));
      writeFileSync(join(dir.path, 'lower', 'f'), 'x');
      await using sb = await Sandbox.create({ overlays: [{ target: '/testbed', lower: [join(dir.path, 'lower')] }] });
      const r = await sb.exec('cat /proc/self/mountinfo');
      const overlay = r.stdout.split('\n').find((l) => l.includes(' /testbed '))!;
      expect(overlay).toBeDefined();
      expect(overlay).not.toContain(dir.path);
      expect(overlay).not.toContain(sb.privateDir);
      expect(overlay).toMatch(/lowerdir\+?=\/\.o\/\d+\/l0/);
      expect((await sb.exec('cat /testbed/f')).stdout).toBe('x');
    } finally {
      dir.remove();
    }
  });

  it("a state directory squatted by someone else does not stop Sandbox.create", async () => {
    const tmp = tempDir('msbx-squat-');
    const env = { ...process.env };
    try {
      // What another user could plant in a shared TMPDIR: a file (or their
      // own directory) where our default state directory would go.
      process.env.TMPDIR = tmp.path;
      delete process.env.XDG_RUNTIME_DIR;
      delete process.env.MINISANDBOX_STATE_DIR;
      const { defaultStateDir } = await import('../../lib/sandbox/state.js');
      const squatted = join(tmp.path, `minisandbox-${process.getuid!()}`);
      writeFileSync(squatted, 'mine');
      const stateDir = defaultStateDir();
      expect(stateDir.startsWith(squatted)).toBe(false);
      await using sb = await Sandbox.create();
      expect(sb.privateDir.startsWith(squatted)).toBe(false);
      expect((await sb.exec('echo ok')).stdout).toBe('ok\n');
    } finally {
      process.env = env;
      tmp.remove();
    }
  });
});
