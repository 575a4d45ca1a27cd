/**
 * The server's sandboxes attacked from inside: a command that stops what
 * enforces its timeout, and a sandbox with the host's network that looks
 * for the server's token in /proc.
 */
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../lib/server/index.js';
import { TOKEN, post, start } from './helpers.js';

const execute = (command: string, timeout: number | null) => ({
  command,
  timeout,
  shell: true,
  check: false,
  error_msg: '',
  env: null,
  cwd: null,
  merge_output_streams: false,
});

describe('a timed command cannot stop the server\'s timeout', () => {
  let server: RunningServer;
  beforeAll(async () => {
    server = await start();
  });
  afterAll(() => server.close());

  it('returns a timeout on time after `kill -STOP $PPID`, and the sandbox answers afterwards', async () => {
    const created = await post(`${server.url}/sandboxes`, {});
    const base: string = created.body.url;
    for (const attack of ['kill -STOP $PPID', 'kill -STOP -1', 'kill -STOP 1']) {
      const r = await post(`${base}/execute`, execute(`${attack}; sleep 1000`, 1));
      expect(r.ms).toBeLessThan(15_000);
      expect(JSON.stringify(r.body)).toMatch(/Timeout \(1(\.0)?s\) exceeded/);
      const next = await post(`${base}/execute`, execute('echo alive', 10));
      expect(next.body.stdout).toBe('alive\n');
    }
  });
});

async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const { port } = srv.address() as { port: number };
  await new Promise((r) => srv.close(r));
  return port;
}

describe("the server's token is not readable from its sandboxes", () => {
  it('not even from a sandbox on the host network, where the token would control every sandbox', async () => {
    const port = await freePort();
    const secret = `${TOKEN}-argv`;
    const main = join(process.cwd(), 'dist/lib/cli/main.js');
    const proc = spawn(process.execPath, [main, 'serve', '--port', String(port), '--auth-token', secret], { stdio: ['ignore', 'pipe', 'pipe'] });
    try {
      const url = `http://127.0.0.1:${port}`;
      const headers = { 'x-api-key': secret };
      for (let i = 0; i < 100; i++) {
        const ok = await fetch(`${url}/is_alive`, { headers }).then((r) => r.ok, () => false);
        if (ok) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      const created = await post(`${url}/sandboxes`, { network: 'host' }, headers);
      const base: string = created.body.url;
      const look = 'for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do cat $f 2>/dev/null; echo; done; ps -ef';
      const r = await post(`${base}/execute`, execute(look, 10), headers);
      expect(r.body.exit_code).toBe(0);
      expect(r.body.stdout).toMatch(/msbx-init/);
      expect(r.body.stdout + r.body.stderr).not.toContain(secret);
      expect(r.body.stdout).not.toContain('serve');
    } finally {
      proc.kill('SIGTERM');
      await new Promise((r) => proc.once('exit', r));
    }
  });
});
