import { fork } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, Sandbox, collectGarbage, terminalChannel } from '../../lib/index.js';
import { SessionExistsError, ShellSession } from '../../lib/shell/index.js';
import { hostPidsMatching, tempDir, uniqueSleep, waitFor } from '../helpers.js';

// Each test file gets its own state dir, so gc in one never races another.
let state: ReturnType<typeof tempDir>;
beforeAll(() => {
  state = tempDir('msbx-state-');
});
afterAll(() => {
  // Every sandbox of this file was closed: nothing may be left behind.
  expect(readdirSync(state.path)).toEqual([]);
  state.remove();
});
const create = (opts: Parameters<typeof Sandbox.create>[0] = {}) => Sandbox.create({ stateDir: state.path, ...opts });

describe('a persistent sandbox', () => {
  let sb: Sandbox;
  beforeAll(async () => {
    sb = await create();
  });
  afterAll(async () => {
    await sb.close();
  });

  it('runs many commands that share files, processes and the network', async () => {
    const sh = await sb.shell();
    await sh.run('echo from-shell > /work/shared.txt');
    const mark = uniqueSleep();
    await sh.run(`sleep ${mark} &`);
    await sh.run('python3 -m http.server 8765 --bind 127.0.0.1 >/dev/null 2>&1 &');
    expect((await sb.exec('cat /work/shared.txt')).stdout).toBe('from-shell\n');
    expect((await sb.exec(`ps -e -o args | grep -c '^sleep ${mark}'`)).stdout.trim()).toBe('1');
    const web = await sb.exec(
      `python3 -c "import urllib.request,time\nfor i in range(50):\n  try: print(urllib.request.urlopen('http://127.0.0.1:8765/').status); break\n  except OSError: time.sleep(0.1)"`,
    );
    expect(web.stdout.trim()).toBe('200');
    await sh.close();
  });

  it('keeps cwd, variables and functions across session.run calls', async () => {
    const sh = await sb.shell();
    await sh.run('cd /tmp && export GREETING=hello && greet() { echo "$GREETING $1"; }');
    const r = await sh.run('pwd; greet world');
    expect(r).toMatchObject({ output: '/tmp\nhello world\n', exitCode: 0 });
    await sh.close();
  });

  it('runs a session on a shell started otherwise (terminalChannel), and refuses a process without a terminal', async () => {
    const bash = sb.spawn(['/bin/bash', '--norc', '--noprofile'], { pty: { cols: 80, rows: 24 } });
    expect(() => terminalChannel(bash)).toThrow(ConfigError); // not ready: no terminal yet
    await bash.ready;
    const sh = await ShellSession.start(terminalChannel(bash));
    // This bash has readline (no --noediting): a line longer than the canonical limit arrives whole.
    const long = 'y'.repeat(9000);
    expect(await sh.run(`shopt -q -o emacs && echo readline; echo \${#X}; X=${long}; echo \${#X}`)).toMatchObject({ output: 'readline\n0\n9000\n', exitCode: 0 });
    await sh.close();
    const plain = sb.spawn(['true']);
    await plain.ready;
    expect(() => terminalChannel(plain)).toThrow(/no terminal yet \(spawn it with the pty option/);
    await plain.exited;
  });

  it('names sessions uniquely, as SWE-ReX (and the server, which uses these) does', async () => {
    const [first, racer] = await Promise.allSettled([sb.shell({ name: 'main' }), sb.shell({ name: 'main' })]);
    expect(first.status).toBe('fulfilled');
    expect(racer).toMatchObject({ status: 'rejected', reason: { name: 'SessionExistsError', code: 'MSBX_SESSION_EXISTS', message: 'session main already exists' } });
    await expect(sb.shell({ name: 'main' })).rejects.toBeInstanceOf(SessionExistsError);
    const main = sb.session('main')!;
    expect(main).toBe((first as PromiseFulfilledResult<ShellSession>).value);
    expect(sb.sessionNames).toEqual(['main']);
    // A shell that exited keeps its name until it is taken again: it could never run anything.
    await main.run('exit', { check: 'ignore' }).catch(() => undefined);
    expect(await waitFor(() => main.isClosed)).toBe(true);
    const again = await sb.shell({ name: 'main' });
    expect((await again.run('echo again')).output).toBe('again\n');
    expect(await sb.closeSession('main')).toBe(true);
    expect(await sb.closeSession('main')).toBe(false);
    expect(sb.session('main')).toBeUndefined();
  });

  it('interrupts a session command at its timeout and the session stays usable', async () => {
    const sh = await sb.shell();
    await expect(sh.run('sleep 30', { timeoutMs: 300 })).rejects.toThrow(/timed out|timeout/i);
    await sh.interrupt();
    expect((await sh.run('echo still-here')).output).toBe('still-here\n');
    await sh.close();
  });

  it('kills a timed-out command with its whole subtree, and only that', async () => {
    const keep = uniqueSleep();
    const doomed = uniqueSleep();
    await sb.exec(`sleep ${keep} >/dev/null 2>&1 &`);
    const r = await sb.exec(`(sleep ${doomed} &); sleep ${doomed} & sleep ${doomed}`, { timeout: 300 });
    expect(r.timedOut).toBe(true);
    expect(await waitFor(() => hostPidsMatching(doomed).length === 0)).toBe(true);
    expect(hostPidsMatching(keep).length).toBe(1);
    expect((await sb.exec('echo alive')).stdout).toBe('alive\n');
  });

  it('aborts a command with an AbortSignal', async () => {
    const ac = new AbortController();
    const p = sb.exec('sleep 30', { signal: ac.signal });
    setTimeout(() => ac.abort(), 100);
    expect(await p).toMatchObject({ isCanceled: true, signal: 'SIGKILL' });
  });

  it('reads, writes, uploads and downloads files as the sandbox sees them', async () => {
    await sb.writeFile('/work/dir/a.txt', 'alpha');
    expect(await sb.readFile('/work/dir/a.txt', 'utf8')).toBe('alpha');
    expect(await sb.readFile('dir/a.txt', 'utf8')).toBe('alpha');
    await expect(sb.readFile('/work/missing')).rejects.toThrow(/readFile \/work\/missing: .*No such file/);
    const host = tempDir();
    try {
      mkdirSync(join(host.path, 'up/sub'), { recursive: true });
      writeFileSync(join(host.path, 'up/sub/b.txt'), 'beta');
      await sb.upload(join(host.path, 'up'), '/work/up');
      expect((await sb.exec('cat /work/up/sub/b.txt')).stdout).toBe('beta');
      await sb.download('/work/dir', join(host.path, 'down'));
      expect(readFileSync(join(host.path, 'down/a.txt'), 'utf8')).toBe('alpha');
    } finally {
      host.remove();
    }
  });

  it('resolves file paths inside the sandbox, symlinks planted by sandboxed code included', async () => {
    const host = tempDir();
    try {
      writeFileSync(join(host.path, 'secret'), 'host secret');
      await sb.exec(`ln -sf ${join(host.path, 'secret')} /work/link; ln -sfn / /work/rootlink`);
      await expect(sb.readFile('/work/link')).rejects.toThrow(/No such file/);
      await sb.writeFile('/work/rootlink/tmp/x', 'inside');
      expect(existsSync('/tmp/x') && readFileSync('/tmp/x', 'utf8') === 'inside').toBe(false);
      expect((await sb.exec('cat /tmp/x')).stdout).toBe('inside');
    } finally {
      host.remove();
    }
  });
});

describe('creation options', () => {
  it('rejects bad overlays, capabilities and limits by name, leaving nothing behind', async () => {
    const cases: [Parameters<typeof Sandbox.create>[0], RegExp][] = [
      [{ overlays: [{ target: 'rel', lower: ['/usr'] }] }, /^overlays\[0\]\.target: 'rel' must be an absolute path$/],
      [{ overlays: [{ target: '/env', lower: ['/no/such/layer'] }] }, /^overlays\[0\]\.lower\[0\]: overlay lower dir \/no\/such\/layer does not exist$/],
      [{ overlays: [{ target: '/env', lower: ['/usr'] }], mounts: [{ type: 'tmpfs', target: '/env' }] }, /^mounts\[0\]: conflicts with overlays\[0\]: both mount on \/env$/],
      [{ capabilities: ['CAP_TELEPORT'] }, /^capabilities: unknown capability 'CAP_TELEPORT'$/],
      [{ limits: { pids: 0 } }, /^limits\.pids: must be a positive integer, or null for no limit$/],
    ];
    for (const [opts, message] of cases) {
      const err = await create(opts).catch((e) => e);
      expect(err).toBeInstanceOf(ConfigError);
      expect(err.message).toMatch(message);
    }
    expect(readdirSync(state.path)).toEqual([]);
  });
});

describe('two sandboxes', () => {
  it('never see each other\'s files, processes, /tmp or loopback servers', async () => {
    const [a, b] = await Promise.all([create(), create()]);
    try {
      const mark = uniqueSleep();
      await a.exec(`echo a > /tmp/only-a; echo a > /work/only-a; sleep ${mark} >/dev/null 2>&1 &`);
      await a.exec('python3 -m http.server 8766 --bind 127.0.0.1 >/dev/null 2>&1 &');
      await a.exec('for i in $(seq 50); do python3 -c "import socket; socket.create_connection((\'127.0.0.1\', 8766))" 2>/dev/null && break; sleep 0.1; done');
      const r = await b.exec(`ls /tmp /work; ps -e -o comm= | grep -c '^sleep$'; python3 -c "import socket; socket.create_connection(('127.0.0.1', 8766))" 2>&1 | tail -1`);
      expect(r.stdout).not.toContain('only-a');
      expect(r.stdout).toMatch(/\n0\n/);
      expect(r.stdout).toContain('ConnectionRefusedError');
    } finally {
      await Promise.all([a.close(), b.close()]);
    }
  });
});

describe('limits', () => {
  it('stops a memory hog and a fork bomb while another sandbox keeps answering', async () => {
    const limited = await create({ limits: { memory: '64m', pids: 32 } });
    const other = await create();
    try {
      expect(limited.limits.memory.enforcedBy).not.toBe('none');
      expect(limited.limits.pids.enforcedBy).not.toBe('none');
      const hog = await limited.exec(['python3', '-c', 'x = bytearray(512 * 1024 * 1024); print("allocated")'], { timeout: 20_000 });
      expect(hog.stdout).not.toContain('allocated');
      expect(hog.exitCode === 0).toBe(false);
      if (limited.limits.memory.enforcedBy.startsWith('cgroup')) expect(hog.oomKilled).toBe(true);

      const bomb = limited.exec('bomb() { bomb | bomb & }; bomb; sleep 2; echo survived', { timeout: 15_000 });
      const answers: string[] = [];
      for (let i = 0; i < 5; i++) answers.push((await other.exec('echo pong')).stdout);
      const b = await bomb;
      expect(answers).toEqual(Array(5).fill('pong\n'));
      if (limited.limits.pids.enforcedBy.startsWith('cgroup')) expect(b.pidsLimited).toBe(true);
      // The limited sandbox itself is usable again once the bomb is gone.
      await limited.killAll();
      expect((await limited.exec('echo ok')).stdout).toBe('ok\n');
    } finally {
      await Promise.all([limited.close(), other.close()]);
    }
  }, 60_000);
});

describe('crash safety', () => {
  it('SIGKILL of the owner leaves no sandboxed process; gc removes its directory and spares a live owner\'s', async () => {
    const mark = uniqueSleep();
    const dir = tempDir('msbx-owner-');
    const live = await create();
    let owner: ReturnType<typeof fork> | undefined;
    try {
      const entry = new URL('../../dist/lib/index.js', import.meta.url).pathname;
      const script = join(dir.path, 'owner.mjs');
      writeFileSync(
        script,
        `const { Sandbox } = await import(${JSON.stringify(entry)});
         const sb = await Sandbox.create({ stateDir: ${JSON.stringify(state.path)} });
         await sb.exec('sleep ${mark} >/dev/null 2>&1 &');
         process.send(sb.privateDir); setInterval(() => {}, 1000);`,
      );
      const child = fork(script, [], { stdio: 'ignore' });
      owner = child;
      const privateDir = await new Promise<string>((res, rej) => {
        child.on('message', (m) => res(String(m)));
        child.on('exit', () => rej(new Error('owner exited early')));
      });
      expect(hostPidsMatching(mark).length).toBe(1);
      child.kill('SIGKILL');
      expect(await waitFor(() => hostPidsMatching(mark).length === 0)).toBe(true);
      await waitFor(() => child.exitCode !== null || child.signalCode !== null);
      expect(existsSync(privateDir)).toBe(true);
      const gc = await collectGarbage(state.path);
      expect(gc.removed).toEqual([privateDir]);
      expect(gc.kept).toContain(live.privateDir);
      expect(existsSync(privateDir)).toBe(false);
      expect((await live.exec('echo still')).stdout).toBe('still\n');
    } finally {
      owner?.kill('SIGKILL');
      await live.close();
      dir.remove();
    }
  });

  it('close removes only the sandbox\'s own directory, even with symlinks planted in it', async () => {
    const outside = tempDir('msbx-outside-');
    try {
      writeFileSync(join(outside.path, 'keep.txt'), 'keep');
      const sb = await create();
      await sb.exec(`ln -s ${outside.path} /work/escape; ln -s ${join(outside.path, 'keep.txt')} /work/file-link`);
      await sb.close();
      expect(existsSync(sb.privateDir)).toBe(false);
      expect(readFileSync(join(outside.path, 'keep.txt'), 'utf8')).toBe('keep');
    } finally {
      outside.remove();
    }
  });
});

describe('scale', () => {
  it('64 sandboxes open at once each run a shell command', async () => {
    const sandboxes = await Promise.all(Array.from({ length: 64 }, () => create()));
    try {
      const results = await Promise.all(sandboxes.map((sb, i) => sb.exec(`echo sandbox-${i} $(hostname)`)));
      results.forEach((r, i) => expect(r.stdout).toBe(`sandbox-${i} ${sandboxes[i]!.hostname}\n`));
    } finally {
      await Promise.all(sandboxes.map((sb) => sb.close()));
    }
  }, 120_000);
});
