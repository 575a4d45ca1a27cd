/**
 * Server behaviour around the endpoints: authentication, X-Request-ID
 * replay, management routes, and the 4xx answers to bad requests.
 */
import { randomUUID } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { RunningServer } from '../../lib/server/index.js';
import { TOKEN, bashAction, call, commandReq, createSessionReq, get, post, readFileReq, start } from './helpers.js';

let server: RunningServer;

beforeAll(async () => {
  server = await start({ maxSandboxes: 3, maxBodyBytes: 4096 });
});

afterAll(async () => {
  await server.close();
});

describe('authentication', () => {
  it('refuses a missing key with 403 and a wrong one with 401, on every route', async () => {
    for (const path of ['/', '/is_alive', '/sandboxes', '/execute', '/no/such/route']) {
      expect(await call(server.url + path, 'GET', undefined, {})).toMatchObject({ status: 403, body: { detail: 'Not authenticated' } });
      expect(await call(server.url + path, 'GET', undefined, { 'x-api-key': TOKEN + 'x' })).toMatchObject({
        status: 401,
        body: { detail: 'Invalid API Key' },
      });
      expect(await call(server.url + path, 'GET', undefined, { 'x-api-key': 'short' })).toMatchObject({ status: 401 });
    }
    expect((await get(server.url + '/is_alive')).status).toBe(200);
  });

  it('an empty token disables authentication, as in SWE-ReX', async () => {
    const open = await start({ authToken: '' });
    try {
      expect(await call(`${open.url}/is_alive`, 'GET', undefined, {})).toMatchObject({ status: 200, body: { is_alive: true } });
    } finally {
      await open.close();
    }
  });
});

describe('X-Request-ID replay', () => {
  it('returns the cached response of a retried POST without running it again', async () => {
    const { body } = await post(`${server.url}/sandboxes`, {});
    const base = body.url as string;
    const id = randomUUID();
    const headers = { 'x-api-key': TOKEN, 'x-request-id': id, 'content-type': 'application/json' };
    const append = commandReq('echo x >> /work/count; wc -l < /work/count', { shell: true });
    const first = await post(`${base}/execute`, append, headers);
    const retry = await post(`${base}/execute`, append, headers);
    expect(first.body).toEqual({ stdout: '1\n', stderr: '', exit_code: 0 });
    expect(retry.body).toEqual(first.body);
    // A concurrent duplicate (client timed out and retried) waits for the first run.
    const id2 = randomUUID();
    const h2 = { ...headers, 'x-request-id': id2 };
    const slow = commandReq('sleep 0.3; echo x >> /work/count; wc -l < /work/count', { shell: true });
    const [a, b] = await Promise.all([post(`${base}/execute`, slow, h2), post(`${base}/execute`, slow, h2)]);
    expect(a.body).toEqual({ stdout: '2\n', stderr: '', exit_code: 0 });
    expect(b.body).toEqual(a.body);
    // A new id runs again.
    expect((await post(`${base}/execute`, append, { ...headers, 'x-request-id': randomUUID() })).body.stdout).toBe('3\n');
    // Errors (511) are replayed too.
    const failing = commandReq('echo y >> /work/count; exit 1', { shell: true, check: true });
    const h3 = { ...headers, 'x-request-id': randomUUID() };
    expect((await post(`${base}/execute`, failing, h3)).status).toBe(511);
    expect((await post(`${base}/execute`, failing, h3)).status).toBe(511);
    expect((await post(`${base}/read_file`, readFileReq('/work/count'))).body.content).toBe('x\nx\nx\ny\n');
    await call(base, 'DELETE');
  });
});

describe('management', () => {
  it('creates, lists, inspects and deletes sandboxes', async () => {
    const created = await post(`${server.url}/sandboxes`, { env: { FROM_CREATE: 'yes' }, hostname: 'agent-box', limits: { pids: 64 }, network: 'none' });
    expect(created.status).toBe(200);
    const { id, url } = created.body;
    expect(url).toBe(`${server.url}/sandboxes/${id}`);

    expect((await post(`${url}/create_session`, createSessionReq({ session: 's' }))).status).toBe(200);
    const r = await post(`${url}/run_in_session`, bashAction('echo $FROM_CREATE $(hostname)', { session: 's' }));
    expect(r.body.output).toBe('yes agent-box\n');

    const info = await get(url);
    expect(info.body).toMatchObject({ id, hostname: 'agent-box', sessions: ['s'], default: false, alive: true });
    expect(info.body.limits.pids.limit).toBe(64);
    expect(new Date(info.body.created).getTime()).toBeGreaterThan(0);
    expect((await get(`${server.url}/sandboxes`)).body.sandboxes.map((s: { id: string }) => s.id)).toContain(id);

    expect((await call(url, 'DELETE')).body).toEqual({ id, closed: true });
    expect((await get(url)).status).toBe(404);
    expect((await post(`${url}/execute`, commandReq(['true']))).status).toBe(404);
    expect((await call(url, 'DELETE')).status).toBe(404);
  });

  it('creates the default sandbox on first use, not for is_alive', async () => {
    const before = (await get(`${server.url}/sandboxes`)).body.sandboxes.filter((s: { default: boolean }) => s.default);
    expect(before).toEqual([]);
    await get(`${server.url}/is_alive`);
    expect((await get(`${server.url}/sandboxes`)).body.sandboxes.some((s: { default: boolean }) => s.default)).toBe(false);
    expect((await post(`${server.url}/execute`, commandReq(['true']))).body.exit_code).toBe(0);
    const defaults = (await get(`${server.url}/sandboxes`)).body.sandboxes.filter((s: { default: boolean }) => s.default);
    expect(defaults).toHaveLength(1);
    await call(defaults[0].url, 'DELETE');
  });

  it('answers 429 past maxSandboxes', async () => {
    const made: string[] = [];
    for (let i = 0; i < 3; i++) made.push((await post(`${server.url}/sandboxes`)).body.url);
    const over = await post(`${server.url}/sandboxes`);
    expect(over.status).toBe(429);
    expect(over.body.detail).toMatch(/sandbox limit reached: 3/);
    // The default sandbox counts too; a SWE-ReX route reports it as a 429 as well.
    expect((await post(`${server.url}/execute`, commandReq(['true']))).status).toBe(429);
    await Promise.all(made.map((u) => call(u, 'DELETE')));
    expect((await post(`${server.url}/execute`, commandReq(['true']))).status).toBe(200);
  });

  it('refuses unknown create fields (422)', async () => {
    const r = await post(`${server.url}/sandboxes`, { netwrok: 'host' });
    expect(r.status).toBe(422);
    expect(r.body.detail[0].loc).toEqual(['body', 'netwrok']);
    expect((await post(`${server.url}/sandboxes`, { limits: { memory: 'lots' } })).status).toBe(422);
  });
});

describe('bad requests', () => {
  it('404 for unknown routes and sandboxes, 405 for wrong methods', async () => {
    expect(await get(`${server.url}/nope`)).toMatchObject({ status: 404, body: { detail: 'Not Found' } });
    expect((await get(`${server.url}/sandboxes/sbx-000000000000/is_alive`)).status).toBe(404);
    expect((await get(`${server.url}/execute`)).status).toBe(405);
  });

  it('422 names the field for missing or ill-typed fields and invalid JSON', async () => {
    const missing = await post(`${server.url}/run_in_session`, { session: 'default', action_type: 'bash' });
    expect(missing.status).toBe(422);
    expect(missing.body.detail).toEqual([expect.objectContaining({ loc: ['body', 'command'], type: 'missing', msg: 'Field required' })]);

    const typed = await post(`${server.url}/run_in_session`, bashAction('true', { check: 'loud', timeout: 'soon' as unknown as number }));
    expect(typed.status).toBe(422);
    const locs = typed.body.detail.map((d: { loc: string[] }) => d.loc.join('.'));
    expect(locs).toEqual(expect.arrayContaining(['body.check', 'body.timeout']));

    const kind = await post(`${server.url}/run_in_session`, { ...bashAction('true'), action_type: 'python' });
    expect(kind.body.detail[0].loc).toEqual(['body', 'action_type']);

    const json = await post(`${server.url}/execute`, '{"command": ');
    expect(json.status).toBe(422);
    expect(json.body.detail[0].type).toBe('json_invalid');

    const list = await post(`${server.url}/execute`, commandReq(['ok', 3 as unknown as string]));
    expect(list.body.detail[0].loc).toEqual(['body', 'command', 1]);
    expect((await post(`${server.url}/create_session`, [])).status).toBe(422);
  });

  it('413 for a body over the limit', async () => {
    const big = await post(`${server.url}/write_file`, { path: '/work/big', content: 'x'.repeat(10_000) });
    expect(big.status).toBe(413);
    expect(big.body.detail).toMatch(/larger than 4096 bytes/);
    const uploadLimited = await start({ maxUploadBytes: 1000 });
    try {
      const form = new FormData();
      form.append('file', new Blob([new Uint8Array(5000)]), 'f');
      form.append('target_path', '/work/f');
      form.append('unzip', 'false');
      const r = await fetch(`${uploadLimited.url}/upload`, { method: 'POST', body: form, headers: { 'x-api-key': TOKEN } });
      expect(r.status).toBe(413);
    } finally {
      await uploadLimited.close();
    }
  });
});
