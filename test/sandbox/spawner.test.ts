/**
 * The spawner (msbx-spawner): the process that clones sandboxes for Node.
 * It dies with Node and takes its sandboxes along, is replaced when it dies,
 * fails a request it died during with a named error, leaks no fd, leaves no
 * zombie, and carries 256 concurrent creates.
 */
import { execFileSync, fork, spawnSync } from 'node:child_process';
import { chmodSync, mkdirSync, readdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ExecError, NamespaceError, Sandbox, SpawnerError, run } from '../../lib/sandbox/index.js';
import { native, setSpawnMode, type NativePlan } from '../../lib/native/index.js';
import { callNative } from '../../lib/sandbox/process.js';
import { hostPidsMatching, isRunning, parentPid, tempDir, uniqueSleep, waitFor } from '../helpers.js';

let state: ReturnType<typeof tempDir>;
beforeAll(() => {
  state = tempDir('msbx-state-');
  // These tests are about the spawner: they need it (the package's own build).
  expect(setSpawnMode('spawner').mode).toBe('spawner');
});
afterAll(() => {
  expect(readdirSync(state.path)).toEqual([]);
  state.remove();
});
const create = (opts: Parameters<typeof Sandbox.create>[0] = {}) => Sandbox.create({ stateDir: state.path, ...opts });

/** The spawner, running: its pid once a spawn has started it. */
async function runningSpawner(): Promise<number> {
  await run({ argv: ['/bin/true'] });
  const pid = native.spawnerInfo().pid;
  expect(pid).not.toBeNull();
  return pid!;
}

const fdCount = (pid: number | 'self') => readdirSync(`/proc/${pid}/fd`).length;

/** Children of `parent` for which `is` holds (one gone meanwhile is none). */
function childrenOf(parent: number, is: (pid: number) => boolean): number[] {
  return readdirSync('/proc')
    .filter((e) => /^\d+$/.test(e))
    .map(Number)
    .filter((pid) => {
      try {
        return parentPid(pid) === parent && is(pid);
      } catch {
        return false;
      }
    });
}

/** Children of `parent` that are zombies (exited, never reaped). */
const zombiesOf = (parent: number) =>
  childrenOf(parent, (pid) => {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] === 'Z';
  });

describe('the spawner', () => {
  it('is a small process of its own, child of Node, parent of the sandboxes', async () => {
    const spawner = await runningSpawner();
    expect(parentPid(spawner)).toBe(process.pid);
    expect(readFileSync(`/proc/${spawner}/comm`, 'utf8').trim()).toBe('msbx-spawner');
    // A few MiB, not Node's heap: that is what makes its clones cheap.
    const rss = Number(/VmRSS:\s*(\d+) kB/.exec(readFileSync(`/proc/${spawner}/status`, 'utf8'))![1]);
    expect(rss).toBeLessThan(16 * 1024);
    await using sb = await create();
    expect(parentPid(sb.pid)).toBe(spawner);
  });

  it('dies when Node is SIGKILLed, and every sandbox with it, persistent and one-shot', async () => {
    const mark = uniqueSleep();
    const dir = tempDir('msbx-owner-');
    try {
      const entry = new URL('../../dist/lib/index.js', import.meta.url).pathname;
      const nativeEntry = new URL('../../dist/lib/native/index.js', import.meta.url).pathname;
      const script = join(dir.path, 'owner.mjs');
      writeFileSync(
        script,
        `const { Sandbox, spawn } = await import(${JSON.stringify(entry)});
         const { native } = await import(${JSON.stringify(nativeEntry)});
         const sb = await Sandbox.create({ stateDir: ${JSON.stringify(state.path)} });
         sb.spawn(['sleep', '${mark}']);
         const once = spawn({ argv: ['sleep', '${mark}'] });
         await once.ready;
         process.send({ spawner: native.spawnerInfo().pid, init: sb.pid, once: once.pid, privateDir: sb.privateDir });
         setInterval(() => {}, 1000);`,
      );
      // The owner takes the spawner path whatever this run's MINISANDBOX_SPAWNER says.
      const { MINISANDBOX_SPAWNER: _mode, ...env } = process.env;
      const child = fork(script, [], { stdio: 'ignore', env });
      const pids = await new Promise<{ spawner: number; init: number; once: number; privateDir: string }>((res, rej) => {
        child.on('message', (m) => res(m as never));
        child.on('exit', () => rej(new Error('owner exited early')));
      });
      expect(await waitFor(() => hostPidsMatching(mark).length === 2)).toBe(true);
      const sleeps = hostPidsMatching(mark);
      expect(parentPid(pids.spawner)).toBe(child.pid);
      for (const pid of [pids.spawner, pids.init, pids.once]) expect(isRunning(pid)).toBe(true);
      child.kill('SIGKILL');
      for (const pid of [pids.spawner, pids.init, pids.once, ...sleeps]) expect(await waitFor(() => !isRunning(pid), 5000), `pid ${pid}`).toBe(true);
      expect(hostPidsMatching(mark)).toEqual([]);
      // The owner is gone: gc removes what it left (and the afterAll check passes).
      const { collectGarbage } = await import('../../lib/sandbox/index.js');
      await waitFor(() => child.exitCode !== null || child.signalCode !== null);
      expect((await collectGarbage(state.path)).removed).toEqual([pids.privateDir]);
    } finally {
      dir.remove();
    }
  }, 60_000);

  it('is replaced when killed, and the next spawn works', async () => {
    const first = await runningSpawner();
    const { started } = native.spawnerInfo();
    process.kill(first, 'SIGKILL');
    expect(await waitFor(() => !isRunning(first))).toBe(true);
    // The new spawner has no host root kept yet: this request must carry it
    // (else it is refused), and /bin/sh comes from it.
    const r = await run({ argv: ['/bin/sh', '-c', 'echo again'] });
    expect(r.stdout).toBe('again\n');
    const info = native.spawnerInfo();
    expect(info.started).toBe(started + 1);
    expect(info.pid).not.toBe(first);
    // The dead one was reaped, not left as Node's zombie.
    expect(zombiesOf(process.pid)).not.toContain(first);
  });

  it('fails a request it dies during with a SpawnerError, and the next spawn works', async () => {
    const dir = tempDir('msbx-mapper-');
    try {
      // A uid-map helper that kills its parent, the spawner, while the spawner
      // waits for it in the middle of a request.
      const mapper = join(dir.path, 'kill-parent');
      writeFileSync(mapper, '#!/bin/sh\nkill -KILL $PPID\nsleep 1\nexit 1\n');
      chmodSync(mapper, 0o755);
      chmodSync(dir.path, 0o755);
      // A bare plan: the child never gets past waiting for its maps.
      const doomed: NativePlan = {
        namespaces: ['user', 'mount', 'pid'],
        ops: [],
        argv: ['/bin/true'],
        env: [],
        execCandidates: ['/bin/true'],
        cwd: '/',
        stdio: ['null', 'null', 'null'],
        uidMapper: [mapper, '0', '0 0 1'],
      };
      const before = native.spawnerInfo().started;
      let error: unknown;
      try {
        callNative(() => native.spawn(doomed));
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(SpawnerError);
      expect((error as SpawnerError).code).toBe('MSBX_SPAWNER');
      expect((error as Error).message).toMatch(/spawner \(msbx-spawner, pid \d+\) died before it answered \(killed by signal 9\)/);
      const r = await run({ argv: ['/bin/sh', '-c', 'echo after'] });
      expect(r.stdout).toBe('after\n');
      expect(native.spawnerInfo().started).toBe(before + 1);
    } finally {
      dir.remove();
    }
  });

  it('reports setup errors naming the step, as the in-process path does', async () => {
    await expect(run({ argv: ['/no/such/program'] })).rejects.toBeInstanceOf(ExecError);
    await expect(run({ argv: ['/no/such/program'] })).rejects.toMatchObject({ step: 'exec', code: 'ENOENT' });
    await using sb = await create();
    await expect(sb.exec(['/bin/true'], { cwd: '/no/such/dir' })).rejects.toMatchObject({ step: 'chdir', code: 'ENOENT' });
  });

  it('leaks no fd into Node, the spawner or the sandbox over 200 spawns, and leaves no zombie', async () => {
    await using sb = await create();
    const spawner = await runningSpawner();
    await sb.exec(['/bin/true']);
    // Once idle the spawner has made its pooled children, with their fds.
    await sleep(100);
    const nodeBefore = fdCount('self');
    const spawnerBefore = fdCount(spawner);
    for (let i = 0; i < 100; i++) {
      await run({ argv: ['/bin/true'] });
      await sb.exec(['/bin/true']);
    }
    expect(native.spawnerInfo().pid).toBe(spawner);
    // Sockets close on the event loop: give the last ones a turn.
    expect(await waitFor(() => fdCount('self') <= nodeBefore)).toBe(true);
    // At most as many: a sandbox of an earlier test may have been reaped since.
    expect(await waitFor(() => fdCount(spawner) <= spawnerBefore)).toBe(true);
    expect(await waitFor(() => zombiesOf(spawner).length === 0)).toBe(true);
    // The command sees its three streams and the directory it lists, no more.
    const r = await sb.exec(['/bin/ls', '/proc/self/fd']);
    expect(r.stdout.trim().split('\n').sort()).toEqual(['0', '1', '2', '3']);
    // And the spawner holds: stdio, its socket, its signalfd, its own pidfd,
    // /proc/self/mountinfo (watched for the pool), an idmap user namespace
    // (root), one status pipe per live child (here the sandbox's PID 1), and
    // a pidfd and a socket per pooled child (one sandbox, one monitor).
    expect(await waitFor(() => fdCount(spawner) <= 13), `${fdCount(spawner)} fds in the spawner`).toBe(true);
  }, 120_000);

  it('creates 256 sandboxes at once, each running a command', async () => {
    const sandboxes = await Promise.all(Array.from({ length: 256 }, () => create()));
    try {
      const results = await Promise.all(sandboxes.map((sb, i) => sb.exec(['/bin/sh', '-c', `echo ${i}`])));
      results.forEach((r, i) => expect(r.stdout).toBe(`${i}\n`));
    } finally {
      await Promise.all(sandboxes.map((sb) => sb.close()));
    }
    expect(await waitFor(() => zombiesOf(native.spawnerInfo().pid!).length === 0)).toBe(true);
  }, 300_000);

  it('starts with /dev/null on 0-2, its socket on 3, no environment, and no ignored signal of Node\'s', async () => {
    const spawner = await runningSpawner();
    // Idle: not in the middle of making a pooled child, with every signal blocked around the clone.
    await sleep(100);
    const fds = [0, 1, 2, 3].map((fd) => readlinkSync(`/proc/${spawner}/fd/${fd}`));
    expect(fds.slice(0, 3)).toEqual(['/dev/null', '/dev/null', '/dev/null']);
    expect(fds[3]).toMatch(/^socket:\[\d+\]$/);
    expect(readFileSync(`/proc/${spawner}/environ`, 'utf8')).toBe('');
    const status = readFileSync(`/proc/${spawner}/status`, 'utf8');
    const mask = (field: string) => BigInt(`0x${new RegExp(`^${field}:\\s*([0-9a-f]+)$`, 'm').exec(status)![1]}`);
    const bit = (signal: number) => 1n << BigInt(signal - 1);
    const classic = bit(32) - 1n; // signals 1-31; glibc keeps two real-time ones of its own
    // Node ignores SIGPIPE and SIGXFSZ; the spawner ignores SIGPIPE itself
    // and blocks SIGCHLD for its signalfd, and nothing else.
    expect(mask('SigIgn') & classic).toBe(bit(13));
    expect(mask('SigBlk')).toBe(bit(17));
  });

  it('that cannot be started fails the spawn with an error naming the file and the errno', async () => {
    const dir = tempDir('msbx-spawner-');
    try {
      const notExecutable = join(dir.path, 'msbx-spawner');
      writeFileSync(notExecutable, '#!/bin/sh\n');
      chmodSync(notExecutable, 0o644);
      const cases: [string, string][] = [
        [join(dir.path, 'missing'), 'ENOENT'],
        [notExecutable, 'EACCES'],
      ];
      for (const [file, code] of cases) {
        native.configureSpawner(file);
        const err = await run({ argv: ['/bin/true'] }).catch((e: unknown) => e);
        expect(err).toBeInstanceOf(NamespaceError);
        expect(err).toMatchObject({ code, message: expect.stringContaining(`starting the sandbox spawner ${file}: ${code} (`) });
      }
    } finally {
      expect(setSpawnMode('spawner').mode).toBe('spawner');
      dir.remove();
    }
    expect((await run({ argv: ['/bin/sh', '-c', 'echo spawner'] })).stdout).toBe('spawner\n');
  });

  it('is chosen by MINISANDBOX_SPAWNER, and doctor says which path is in use', () => {
    const entry = new URL('../../dist/lib/sandbox/index.js', import.meta.url).pathname;
    const nativeEntry = new URL('../../dist/lib/native/index.js', import.meta.url).pathname;
    const probe = (value: string | undefined) =>
      spawnSync(
        process.execPath,
        [
          '--input-type=module',
          '-e',
          `const { native } = await import(${JSON.stringify(nativeEntry)});
           const { doctor } = await import(${JSON.stringify(entry)});
           const checks = await doctor();
           console.log(JSON.stringify({ info: native.spawnerInfo(), check: checks.find((c) => c.name === 'spawn path') }));`,
        ],
        { encoding: 'utf8', env: { ...process.env, MINISANDBOX_SPAWNER: value } },
      );
    const inprocess = probe('inprocess');
    expect(inprocess.status, inprocess.stderr).toBe(0);
    expect(JSON.parse(inprocess.stdout)).toMatchObject({
      info: { mode: 'inprocess', reason: 'MINISANDBOX_SPAWNER=inprocess', started: 0 },
      check: { ok: true, detail: expect.stringContaining('in-process: Node clones each sandbox itself (MINISANDBOX_SPAWNER=inprocess)') },
    });
    const spawner = probe(undefined);
    expect(spawner.status, spawner.stderr).toBe(0);
    expect(JSON.parse(spawner.stdout)).toMatchObject({ info: { mode: 'spawner', started: 1 }, check: { ok: true, detail: expect.stringMatching(/^spawner .*msbx-spawner, running as pid \d+$/) } });
    const bogus = probe('fast');
    expect(bogus.status).not.toBe(0);
    expect(bogus.stderr).toContain("MINISANDBOX_SPAWNER='fast': expected 'spawner', 'inprocess' or 'auto'");
  }, 60_000);

  it('can be switched off (the in-process path), and back on', async () => {
    try {
      const info = setSpawnMode('inprocess');
      expect(info).toMatchObject({ mode: 'inprocess', path: null });
      const r = await run({ argv: ['/bin/sh', '-c', 'echo inprocess'] });
      expect(r.stdout).toBe('inprocess\n');
      await using sb = await create();
      expect(parentPid(sb.pid)).toBe(process.pid);
      expect((await sb.exec(['/bin/sh', '-c', 'echo enter'])).stdout).toBe('enter\n');
    } finally {
      expect(setSpawnMode('spawner').mode).toBe('spawner');
    }
    expect((await run({ argv: ['/bin/sh', '-c', 'echo spawner'] })).stdout).toBe('spawner\n');
  });
});

describe("the spawner's pooled children", () => {
  // The spawner makes the next sandbox's child (its namespaces, its id
  // maps) and the next command's monitor once it has been idle for 10 ms.
  const idle = () => sleep(100);

  /** The spawner's children made ahead, waiting for a request. */
  const pooled = (spawner: number) => childrenOf(spawner, (pid) => readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'msbx-pooled');

  const namespacesOf = async (sb: Sandbox) =>
    (await sb.exec(['/bin/sh', '-c', 'for n in net user mnt pid ipc uts; do readlink /proc/self/ns/$n; done'])).stdout.trim().split('\n');
  const hostNamespaces = () => ['net', 'user', 'mnt', 'pid', 'ipc', 'uts'].map((n) => readlinkSync(`/proc/self/ns/${n}`));

  it('serve the next sandbox and command after a pause, each in namespaces of its own', async () => {
    const spawner = await runningSpawner();
    await using first = await create();
    const firstNs = await namespacesOf(first);
    await idle();
    const ahead = pooled(spawner);
    expect(ahead).toHaveLength(2);
    await using sb = await create();
    // Its PID 1 is the child made ahead, and so is its command's monitor.
    expect(ahead).toContain(sb.pid);
    const cmd = sb.spawn(['/bin/sh', '-c', 'readlink /proc/self/ns/net; exit 7'], { stdout: 'pipe' });
    expect(ahead).toContain(cmd.pid);
    let out = '';
    cmd.stdout!.on('data', (c: Buffer) => (out += c));
    expect(await cmd.exited).toEqual({ exitCode: 7, signal: null });
    const ns = await namespacesOf(sb);
    expect(out.trim()).toBe(ns[0]);
    // Nothing shared with the sandbox before it, nor with the host.
    const host = hostNamespaces();
    ns.forEach((n, i) => {
      expect(n).not.toBe(firstNs[i]);
      expect(n).not.toBe(host[i]);
    });
    // The sandbox works as any: its own hostname, pids, a writable /tmp.
    const r = await sb.exec(['/bin/sh', '-c', 'hostname; echo $$; echo x > /tmp/x && cat /tmp/x']);
    const [hostname, pid, x] = r.stdout.trim().split('\n');
    expect([hostname, x]).toEqual([sb.id, 'x']);
    expect(Number(pid)).toBeGreaterThan(1);
    expect(Number(pid)).toBeLessThan(100);
  });

  it('killed meanwhile cost nothing: the sandbox and the command are cloned as usual', async () => {
    const spawner = await runningSpawner();
    {
      await using sb = await create();
      await sb.exec(['/bin/true']);
    }
    await idle();
    const ahead = pooled(spawner);
    expect(ahead).toHaveLength(2);
    for (const pid of ahead) process.kill(pid, 'SIGKILL');
    expect(await waitFor(() => ahead.every((pid) => !isRunning(pid)))).toBe(true);
    await using sb = await create();
    expect(ahead).not.toContain(sb.pid);
    const cmd = sb.spawn(['/bin/sh', '-c', 'echo ok'], { stdout: 'pipe' });
    expect(ahead).not.toContain(cmd.pid);
    expect(await cmd.exited).toEqual({ exitCode: 0, signal: null });
    expect(await waitFor(() => zombiesOf(spawner).length === 0)).toBe(true);
  });

  it('are not used for a sandbox whose namespaces differ, nor left in its way', async () => {
    const host = readlinkSync('/proc/self/ns/net');
    for (const network of ['none', 'host', 'host', 'none', 'host'] as const) {
      await idle();
      await using sb = await create({ network });
      const [net] = await namespacesOf(sb);
      if (network === 'host') expect(net).toBe(host);
      else expect(net).not.toBe(host);
    }
  });

  it.skipIf(process.getuid?.() !== 0)('see the host\'s mounts as they are at the start, not as they were when made (root: mounts on the host)', async () => {
    const dir = tempDir('msbx-pool-mount-');
    const source = join(dir.path, 'src');
    // Without a user namespace root's binds are made by the child, from its
    // copy of the mount table (with one, the spawner clones them itself).
    const bind = { namespaces: { user: false }, mounts: [{ type: 'bind' as const, source, target: '/mnt/src' }] };
    try {
      // Under a private mount: a mount made there later does not propagate
      // into copies of the table (on a shared one it would, and the test
      // would pass however old the pooled child's copy).
      execFileSync('mount', ['-t', 'tmpfs', 'tmpfs', dir.path]);
      execFileSync('mount', ['--make-private', dir.path]);
      mkdirSync(source);
      await (await create(bind)).close();
      await idle();
      // Mounted after the pooled child was made: a copy of the old table would show the empty directory.
      execFileSync('mount', ['-t', 'tmpfs', 'tmpfs', source]);
      writeFileSync(join(source, 'marker'), 'mounted\n');
      {
        await using sb = await create(bind);
        expect((await sb.exec(['/bin/cat', '/mnt/src/marker'])).stdout).toBe('mounted\n');
      }
      await idle();
      execFileSync('umount', [source]);
      await using sb = await create(bind);
      expect((await sb.exec(['/bin/ls', '-A', '/mnt/src'])).stdout).toBe('');
    } finally {
      spawnSync('umount', [source]);
      spawnSync('umount', [dir.path]);
      dir.remove();
    }
  });
});
