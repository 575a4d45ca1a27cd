/**
 * `prepare` and `eval --install-network none|host`: the environments'
 * install step may reach the host's network (a package index), and nothing
 * else changes. The task's install command fetches from an HTTP server this
 * test runs on loopback: it fails offline (the default) and succeeds with
 * host, through prepare and through eval's own preparation.
 */
import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDemoTaskSet } from '../../lib/swe/demo/index.js';
import { tempDir } from '../helpers.js';
import { NO_PYTEST_REASON, pytestPython } from '../swe/helpers.js';
import { CLI, cli } from './helpers.js';

const suite = pytestPython ? describe : describe.skip;
if (!pytestPython) console.warn(`skipping --install-network tests: ${NO_PYTEST_REASON}`);

/** The CLI without blocking this process: the test's HTTP server must answer meanwhile. */
async function cliAsync(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await promisify(execFile)(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 240_000 });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (e) {
    const err = e as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof err.code === 'number' ? err.code : -1, stdout: err.stdout ?? '', stderr: err.stderr ?? String(e) };
  }
}

describe('--install-network values', () => {
  it('a bad value is a usage error naming the flag and the values it takes; with --queue it does not apply', () => {
    for (const command of [['prepare', CLI], ['eval', CLI, '--gold']]) {
      const bad = cli([...command, '--install-network', 'wifi']);
      expect(bad.status, bad.stderr).toBe(2);
      expect(bad.stderr).toContain("--install-network: expected none or host, got 'wifi'");
      const help = cli([command[0]!, '--help']).stdout;
      expect(help).toMatch(/--install-network none\|host\s+Network of the environments' install step only/);
      expect(help).toContain('never of the');
    }
    const queued = cli(['prepare', CLI, '--queue', 'redis://127.0.0.1:1/q', '--install-network', 'host']);
    expect(queued.status).toBe(2);
    expect(queued.stderr).toContain('--install-network does not apply with --queue');
  }, 60_000);
});

suite('--install-network: the install step and the host network', () => {
  const dir = tempDir('msbx-install-net-');
  let server: Server;
  let hits = 0;
  let tasksFile: string;

  beforeAll(async () => {
    server = createServer((req, res) => {
      hits++;
      res.end('reached\n');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', () => resolve()));
    const port = (server.address() as { port: number }).port;
    const demo = createDemoTaskSet(join(dir.path, 'taskset'));
    const task = demo.tasks[0]!;
    const fetch = `python -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:${port}/simple', timeout=5).read().decode())"`;
    tasksFile = join(dir.path, 'tasks.jsonl');
    writeFileSync(tasksFile, `${JSON.stringify({ ...task, install: [fetch, ...task.install] })}\n`);
  });
  afterAll(async () => {
    await new Promise((r) => server?.close(r));
    dir.remove();
  });

  it('none (the default): the install command cannot reach the server, and the task is not prepared', async () => {
    const r = await cliAsync(['prepare', tasksFile, '--store', join(dir.path, 'store-none')]);
    expect(r.code, r.stderr).toBe(1);
    expect(r.stderr).toMatch(/not prepared: .*step 0/s);
    expect(hits).toBe(0);
  }, 300_000);

  it('host: prepare builds the venv, the install command having read from the server', async () => {
    const r = await cliAsync(['prepare', tasksFile, '--store', join(dir.path, 'store-host'), '--install-network', 'host']);
    expect(r.code, r.stderr).toBe(0);
    expect(hits).toBe(1);
  }, 300_000);

  it('host: eval prepares the same way, and the evaluation itself runs (offline) as before', async () => {
    const report = join(dir.path, 'report.json');
    const r = await cliAsync(['eval', tasksFile, '--gold', '--store', join(dir.path, 'store-eval'), '--install-network', 'host', '--report', report]);
    expect(r.code, r.stderr).toBe(0);
    expect(hits).toBe(2);
    expect(r.stdout).toContain('resolved 1/1');
  }, 300_000);
});
