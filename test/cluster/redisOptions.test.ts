/**
 * The Redis connection's flags (lib/cli/redis.ts) are one spec for the four
 * commands that reach a Redis: the same flags and help in each, refused
 * without --queue, and read into the same connection, shown here against a
 * real redis-server whose only user is an ACL user (no default user).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { removeTree } from '../../lib/files/fsTree.js';
import { createDemoTaskSet } from '../../lib/swe/demo/index.js';
import { CLI, NO_REDIS_REASON, REDIS_SERVER } from './queueHelpers.js';

const COMMANDS = ['serve', 'worker', 'eval', 'prepare'];
const FLAGS = ['--redis-password-file', '--redis-user', '--redis-tls', '--redis-ca', '--redis-cert', '--redis-key'];

function cli(args: string[], env: NodeJS.ProcessEnv = { PATH: process.env.PATH, HOME: tmpdir() }) {
  const r = spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 30_000, env });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** A command's --help lines from the first Redis flag to the last one's help. */
function redisHelp(command: string): string {
  const lines = cli([command, '--help']).stdout.split('\n');
  const start = lines.findIndex((l) => l.trimStart().startsWith('--redis-password-file'));
  const end = lines.findIndex((l) => l.trimStart().startsWith('--redis-key'));
  expect(start, `${command} --help lists --redis-password-file`).toBeGreaterThanOrEqual(0);
  return lines.slice(start, end + 1).join('\n');
}

describe('the Redis flags of serve, worker, eval and prepare', () => {
  it('are the same flags with the same help in every command', () => {
    const serve = redisHelp('serve');
    for (const flag of FLAGS) expect(serve).toContain(flag);
    for (const command of COMMANDS.slice(1)) expect(redisHelp(command), command).toBe(serve);
  }, 60_000);

  it('mean nothing without --queue, so they are refused (exit 2) rather than ignored', () => {
    const dir = mkdtempSync(join(tmpdir(), 'msbx-redis-flags-'));
    try {
      const demo = createDemoTaskSet(join(dir, 'taskset'));
      for (const args of [['prepare', demo.tasksFile], ['eval', demo.tasksFile, '--gold'], ['serve', '--auth-token', 'x'.repeat(32)]]) {
        const r = cli([...args, '--redis-user', 'alice', '--redis-tls']);
        expect(r.status, `${args[0]}: ${r.stderr}`).toBe(2);
        expect(r.stderr).toContain('--redis-user, --redis-tls need --queue redis://HOST:PORT/NAME');
      }
      const worker = cli(['worker', '--redis-user', 'alice']);
      expect(worker.status).toBe(2);
      expect(worker.stderr).toMatch(/--queue/);
      const half = cli(['worker', '--queue', 'redis://127.0.0.1:1/q', '--redis-cert', demo.tasksFile]);
      expect(half.status).toBe(2);
      expect(half.stderr).toContain('--redis-cert and --redis-key go together');
    } finally {
      removeTree(dir).catch(() => undefined);
    }
  }, 120_000);
});

describe.skipIf(!REDIS_SERVER)('the Redis flags on a real Redis with an ACL user only', () => {
  let dir: string;
  let redis: ChildProcess;
  let port: number;
  let tasksFile: string;
  let passwordFile: string;
  const env = () => ({ PATH: process.env.PATH, HOME: dir, XDG_CACHE_HOME: join(dir, 'cache') });
  const queue = () => `redis://127.0.0.1:${port}/flags`;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'msbx-redis-acl-'));
    tasksFile = createDemoTaskSet(join(dir, 'taskset')).tasksFile;
    passwordFile = join(dir, 'alice-password');
    writeFileSync(passwordFile, 'alice-secret\n', { mode: 0o600 });
    port = await new Promise<number>((resolve, reject) => {
      const s = createServer().listen(0, '127.0.0.1', () => {
        const p = (s.address() as { port: number }).port;
        s.close(() => resolve(p));
      });
      s.on('error', reject);
    });
    redis = spawn(REDIS_SERVER!, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir,
      '--user', 'alice', 'on', '>alice-secret', '~*', '&*', '+@all', '--user', 'default', 'off'], { stdio: 'ignore' });
    for (let i = 0; i < 100; i++) {
      const ping = spawnSync('redis-cli', ['-p', String(port), 'ping'], { encoding: 'utf8' });
      if (`${ping.stdout}${ping.stderr}`.includes('NOAUTH')) return;
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error('redis-server did not start');
  }, 30_000);

  afterAll(async () => {
    redis?.kill('SIGKILL');
    if (dir) await removeTree(dir);
  });

  it('prepare --queue reaches Redis as --redis-user with --redis-password-file (and not without the user)', () => {
    const asAlice = cli(['prepare', tasksFile, '--queue', queue(), '--redis-user', 'alice', '--redis-password-file', passwordFile], env());
    // Authenticated: what stops it is that no worker is there to prepare.
    expect(asAlice.stderr).toContain(`queue ${queue().replace('//', '//alice@')}: no worker is announced`);
    expect(asAlice.status).toBe(1);
    const asDefault = cli(['prepare', tasksFile, '--queue', queue(), '--redis-password-file', passwordFile], env());
    expect(asDefault.status).toBe(1);
    expect(asDefault.stderr).not.toContain('no worker is announced');
    expect(asDefault.stderr).toMatch(/WRONGPASS|NOAUTH|password|auth/i);
  }, 60_000);

  it('worker takes the same flags and announces itself on that Redis', async () => {
    const child = spawn(process.execPath, [CLI, 'worker', '--queue', queue(), '--redis-user', 'alice', '--redis-password-file', passwordFile, '--store', join(dir, 'store')], { env: env(), stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    child.stderr!.setEncoding('utf8').on('data', (d: string) => (log += d));
    try {
      for (let i = 0; i < 200 && !/worker .*slot/.test(log) && child.exitCode === null; i++) await new Promise((r) => setTimeout(r, 100));
      expect(log).toMatch(/worker .*: 2 slot\(s\), store .*queue redis:\/\/alice@127\.0\.0\.1/);
      const clients = spawnSync('redis-cli', ['-p', String(port), '--user', 'alice', '--pass', 'alice-secret', '--no-auth-warning', 'client', 'list'], { encoding: 'utf8' }).stdout;
      expect(clients).toMatch(/user=alice/);
    } finally {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
    }
  }, 30_000);
});

if (!REDIS_SERVER) console.warn(`skipped: ${NO_REDIS_REASON}`);
