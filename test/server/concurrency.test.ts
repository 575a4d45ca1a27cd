/**
 * The server never blocks: 32 sandboxes used at once while one runs a
 * 10-second command, and is_alive keeps answering within 200 ms.
 */
import { spawn } from 'node:child_process';
import { afterAll, beforeAll, expect, it } from 'vitest';
import type { RunningServer } from '../../lib/server/index.js';
import { TOKEN, bashAction, call, createSessionReq, get, post, start } from './helpers.js';

const N = 32;
let server: RunningServer;
const bases: string[] = [];

beforeAll(async () => {
  server = await start();
  const created = await Promise.all(Array.from({ length: N }, () => post(`${server.url}/sandboxes`, {})));
  for (const c of created) {
    expect(c).toMatchObject({ status: 200 });
    bases.push(c.body.url);
  }
});

afterAll(async () => {
  await server.close();
});

/**
 * Run by a child node process (plain JS). Per sandbox: three session runs, a write_file/read_file round trip and an
 * execute, each result checked. Resolves to 'ok' or an error text per sandbox.
 */
const LOAD_SCRIPT = `
const { bases, token } = JSON.parse(process.env.LOAD_CONFIG);
const post = async (url, body) => {
  const r = await fetch(url, { method: 'POST', headers: { 'x-api-key': token, 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return r.json();
};
const action = (command) => ({ command, session: 'default', timeout: null, is_interactive_command: false,
  is_interactive_quit: false, check: 'raise', error_msg: '', expect: [], action_type: 'bash' });
const one = async (b, i) => {
  for (let k = 0; k < 3; k++) {
    const r = await post(b + '/run_in_session', action('echo ' + i + '-' + k));
    if (r.output !== i + '-' + k + String.fromCharCode(10)) return 'run: ' + JSON.stringify(r);
  }
  await post(b + '/write_file', { content: b, path: '/work/own.txt' });
  const f = await post(b + '/read_file', { path: '/work/own.txt', encoding: null, errors: null });
  if (f.content !== b) return 'read_file: ' + JSON.stringify(f);
  const e = await post(b + '/execute', { command: ['true'], timeout: null, shell: false, check: false, error_msg: '',
    env: null, cwd: null, merge_output_streams: false });
  return e.exit_code === 0 ? 'ok' : 'execute: ' + JSON.stringify(e);
};
Promise.all(bases.map((b, i) => one(b, i).catch((e) => String(e)))).then((r) => process.stdout.write(JSON.stringify(r)));
`;

function runLoad(targets: string[], token: string): Promise<string[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['-e', LOAD_SCRIPT], {
      env: { ...process.env, LOAD_CONFIG: JSON.stringify({ bases: targets, token }) },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.once('error', reject);
    child.once('close', (code) => (code === 0 ? resolve(JSON.parse(out) as string[]) : reject(new Error(`load process exited ${code}`))));
  });
}

it(`uses ${N} sandboxes concurrently while one runs a 10 s command; is_alive stays prompt`, async () => {
  // Sessions everywhere, in parallel (startup_timeout as the client sends it).
  const sessions = await Promise.all(bases.map((b) => post(`${b}/create_session`, createSessionReq())));
  for (const s of sessions) expect(s).toMatchObject({ status: 200 });

  const t0 = Date.now();
  const long = post(`${bases[0]}/run_in_session`, bashAction('sleep 10; echo done', { timeout: 30 }));

  // While it runs: every other sandbox does real work, concurrently. The
  // load comes from another process, as agents are in production: the
  // clients' own work must not sit on the server's event loop.
  const work = runLoad(bases.slice(1), TOKEN);

  // Liveness probes, at the root and on the busy sandbox, throughout.
  const probes: number[] = [];
  const probing = (async () => {
    while (Date.now() - t0 < 3000) {
      for (const url of [`${server.url}/is_alive`, `${bases[0]}/is_alive`]) {
        const r = await get(url);
        expect(r.body.is_alive).toBe(true);
        probes.push(r.ms);
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  })();

  const [results] = await Promise.all([work, probing]);
  expect(results).toEqual(bases.slice(1).map(() => 'ok'));
  expect(Date.now() - t0).toBeLessThan(9000); // all that work finished long before the sleep
  expect(probes.length).toBeGreaterThan(10);
  // On a small machine (CI: 2 cores) the burst of 31 clients plus their
  // shells can starve the whole server process for a moment; that is CPU
  // scheduling, not a blocked event loop, so the bound is on the 95th
  // percentile, with a looser ceiling on the worst probe. (A blocked loop
  // would show the 10 s of the long command, far above either bound.)
  const sorted = [...probes].sort((a, b) => a - b);
  expect(sorted[Math.floor(sorted.length * 0.95)]!).toBeLessThan(500);
  expect(sorted.at(-1)!).toBeLessThan(2000);

  // The busy session is still busy: the others never waited for it.
  const lateProbe = await get(`${bases[0]}/is_alive`);
  expect(lateProbe.ms).toBeLessThan(500);
  const r = await long;
  expect(r.body).toMatchObject({ output: 'done\n', exit_code: 0 });
  expect(Date.now() - t0).toBeGreaterThanOrEqual(10_000);

  await Promise.all(bases.map((b) => call(b, 'DELETE')));
  expect((await get(`${server.url}/sandboxes`)).body.sandboxes).toEqual([]);
}, 40_000);
