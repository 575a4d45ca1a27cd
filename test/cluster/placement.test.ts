/**
 * Placement of interactive sandboxes across `serve` nodes (issue 14): three
 * real `minisandbox serve --queue` processes and a real redis-server with a
 * password, all on loopback. Each process stands for a node: the placement
 * logic only sees URLs, so separate network namespaces would add nothing.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, existsSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ClusterError } from '../../lib/cluster/errors.js';
import { Placement } from '../../lib/cluster/placement.js';
import { tempDir } from '../helpers.js';
import { TOKEN, call, cleanEnv, commandReq, createSessionReq, bashAction, post, get, serveSync, startServe, type ServeProcess } from '../server/helpers.js';

const REDIS = ['/usr/bin/redis-server', '/usr/local/bin/redis-server'].find((p) => existsSync(p));
const PASSWORD = `pw-${Math.random().toString(36).slice(2)}`;
/**
 * Short, so a killed node leaves placement within the test (heartbeats go
 * every third of it), yet longer than the node's event loop stalls while it
 * creates 50-odd sandboxes at once: 1.5 to 3 s measured on 2 shared cores.
 */
const TTL_S = 10;

const dir = tempDir('msbx-placement-test-');
let redis: ChildProcess | undefined;
let redisPort = 0;
const nodes: ServeProcess[] = [];

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

async function startRedis(): Promise<void> {
  redisPort = await freePort();
  redis = spawn(REDIS!, ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--requirepass', PASSWORD, '--dir', dir.path], {
    stdio: 'ignore',
  });
  const deadline = Date.now() + 10_000;
  for (;;) {
    const client = new Redis({ port: redisPort, host: '127.0.0.1', password: PASSWORD, lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 });
    client.on('error', () => {});
    try {
      await client.connect();
      await client.ping();
      return;
    } catch (e) {
      if (Date.now() > deadline) throw new Error(`redis-server did not start on port ${redisPort}: ${(e as Error).message}`);
      await new Promise((r) => setTimeout(r, 100));
    } finally {
      client.disconnect();
    }
  }
}

const queue = (name: string) => `redis://127.0.0.1:${redisPort}/${name}`;

function passwordFile(): string {
  const path = join(dir.path, 'redis-password');
  writeFileSync(path, `${PASSWORD}\n`);
  chmodSync(path, 0o600);
  return path;
}

/** A node of cluster `name` with `slots` slots (the Redis password from a file, the token from the environment). */
function startNode(name: string, slots: number): Promise<ServeProcess> {
  return startServe(['--quiet', '--queue', queue(name), '--slots', String(slots), '--heartbeat-ttl', String(TTL_S), '--redis-password-file', passwordFile()], cleanEnv({ MINISANDBOX_AUTH_TOKEN: TOKEN }));
}

interface ClusterView {
  nodes: { url: string; slots: number; used: number; reserved: number; free: number }[];
}

describe.skipIf(!REDIS)(`serve --queue: placement across nodes${REDIS ? '' : ' (skipped: no redis-server binary)'}`, () => {
  beforeAll(async () => {
    await startRedis();
  });

  afterAll(async () => {
    await Promise.all(nodes.map((n) => n.stop().catch(() => {})));
    redis?.kill('SIGKILL');
    dir.remove();
  });

  it('refuses a wrong Redis password and cluster flags without --queue, naming what is wrong', async () => {
    const wrong = serveSync(['--queue', queue('x'), '--slots', '2'], cleanEnv({ MINISANDBOX_AUTH_TOKEN: TOKEN, MINISANDBOX_REDIS_PASSWORD: 'not-it' }));
    expect(wrong.status).toBe(1);
    expect(wrong.stderr).toContain(`redis://127.0.0.1:${redisPort}/x`);
    expect(wrong.stderr).toMatch(/WRONGPASS|invalid username-password/);
    expect(wrong.stderr).not.toContain('not-it');
    const stray = serveSync(['--slots', '2'], cleanEnv({ MINISANDBOX_AUTH_TOKEN: TOKEN }));
    expect(stray.status).toBe(2);
    expect(stray.stderr).toContain('--slots needs --queue');
    // A password in the URL works, and leaves ps once the arguments are parsed.
    const inUrl = await startServe(['--quiet', '--queue', `redis://:${PASSWORD}@127.0.0.1:${redisPort}/hide`, '--slots', '1'], cleanEnv({ MINISANDBOX_AUTH_TOKEN: TOKEN }));
    try {
      const cmdline = readFileSync(`/proc/${inUrl.pid}/cmdline`, 'utf8');
      expect(cmdline).not.toContain(PASSWORD);
      expect(cmdline).toContain(`redis://:***@127.0.0.1:${redisPort}/hide`);
      expect(inUrl.stderr()).not.toContain(PASSWORD);
      expect((await get(`${inUrl.url}/cluster`)).body.nodes).toHaveLength(1);
    } finally {
      await inUrl.stop();
    }
  });

  it('100 concurrent POST /sandboxes to one node spread by free slots, never past a node\'s slots; closing frees them; a killed node is skipped and its sandboxes reported gone', async () => {
    const slots = [20, 40, 60];
    for (const s of slots) nodes.push(await startNode('place', s));
    const [a, b, c] = nodes as [ServeProcess, ServeProcess, ServeProcess];
    const view = async (n: ServeProcess) => (await get(`${n.url}/cluster`)).body as ClusterView;
    expect((await view(a)).nodes.map((n) => [n.url, n.slots, n.used])).toEqual(
      nodes.map((n, i) => [n.url, slots[i], 0]).sort((x, y) => String(x[0]).localeCompare(String(y[0]))),
    );

    // 100 creates at once, all sent to node a.
    const t0 = performance.now();
    const created = await Promise.all(Array.from({ length: 100 }, () => post(`${a.url}/sandboxes`, {})));
    const createMs = performance.now() - t0;
    expect(created.map((r) => r.status)).toEqual(Array(100).fill(200));
    const byNode = new Map<string, string[]>(nodes.map((n) => [n.url, []]));
    for (const r of created) {
      expect(r.body.url).toBe(`${r.body.node}/sandboxes/${r.body.id}`);
      byNode.get(r.body.node)!.push(r.body.id);
    }
    const counts = nodes.map((n) => byNode.get(n.url)!.length);
    const free = counts.map((k, i) => slots[i]! - k);
    // A node whose heartbeat came late under the load would have left placement and rejoined: say so.
    for (const n of nodes) expect(n.stderr()).not.toContain('left placement');
    console.log(`placement: 100 creates through one node in ${(createMs / 1000).toFixed(1)}s; per node ${counts.join('/')} of ${slots.join('/')} slots`);
    // Most-free-first leaves every node with the same free slots, give or take one.
    expect(Math.max(...free) - Math.min(...free)).toBeLessThanOrEqual(1);
    expect(free.every((f) => f >= 0)).toBe(true);
    expect(counts.reduce((x, y) => x + y)).toBe(100);
    // Redis's count and each node's own listing agree with the answers: the sandboxes run where they were said to.
    const after = await view(b);
    for (const [i, n] of nodes.entries()) {
      expect(after.nodes.find((v) => v.url === n.url)!.used).toBe(counts[i]);
      const listed = (await get(`${n.url}/sandboxes`)).body.sandboxes.map((s: { id: string }) => s.id).sort();
      expect(listed).toEqual([...byNode.get(n.url)!].sort());
    }
    // A request sent to the wrong node is redirected to the right one (fetch follows the 307).
    const onC = byNode.get(c.url)![0]!;
    const viaA = await post(`${a.url}/sandboxes/${onC}/execute`, commandReq('hostname; cat /proc/1/comm', { shell: true }));
    expect(viaA.status).toBe(200);
    const direct = await get(`${c.url}/sandboxes/${onC}`);
    expect(viaA.body.stdout).toBe(`${direct.body.hostname}\nmsbx-init\n`);

    // Closing node a's sandboxes (through their URLs) frees its slots; the next creates go there.
    for (const id of byNode.get(a.url)!) expect((await call(`${a.url}/sandboxes/${id}`, 'DELETE')).status).toBe(200);
    expect((await view(c)).nodes.find((v) => v.url === a.url)!.used).toBe(0);
    const refill = await Promise.all(Array.from({ length: 5 }, () => post(`${b.url}/sandboxes`, {})));
    expect(refill.map((r) => r.body.node)).toEqual(Array(5).fill(a.url));

    // SIGKILL node c. Within its TTL it is still registered: creates aimed at it fail over.
    process.kill(c.pid, 'SIGKILL');
    const failover = await Promise.all(Array.from({ length: 4 }, () => post(`${a.url}/sandboxes`, {})));
    expect(failover.map((r) => r.status)).toEqual([200, 200, 200, 200]);
    for (const r of failover) expect(r.body.node).not.toBe(c.url);
    // Past the TTL it has left placement by itself.
    await new Promise((r) => setTimeout(r, TTL_S * 1000 + 500));
    expect((await view(a)).nodes.map((n) => n.url)).not.toContain(c.url);
    // Requests about its sandboxes, to either live node, answer 410 at once, naming it.
    for (const n of [a, b]) {
      for (const [method, path, body] of [
        ['GET', '', undefined],
        ['POST', '/execute', commandReq('true')],
        ['GET', '/is_alive', undefined],
        ['DELETE', '', undefined],
      ] as const) {
        const r = await call(`${n.url}/sandboxes/${onC}${path}`, method, body);
        expect(r.status).toBe(410);
        expect(r.body).toMatchObject({ node: c.url, sandbox: onC });
        expect(r.body.detail).toContain(`was on node ${c.url}, which is gone`);
        expect(r.ms).toBeLessThan(1000);
      }
    }
    // An id nobody ever had is still a plain 404.
    expect((await get(`${a.url}/sandboxes/sbx-000000000000`)).status).toBe(404);
    // The live nodes fill up to their own slots, never c's, with creates sent to both at once.
    const live = await view(a);
    const room = live.nodes.reduce((s, n) => s + n.free, 0);
    const fill = await Promise.all(Array.from({ length: room + 3 }, (_, i) => post(`${(i % 2 ? a : b).url}/sandboxes`, {})));
    expect(fill.filter((r) => r.status === 200).length).toBe(room);
    const full = fill.filter((r) => r.status === 429);
    expect(full.length).toBe(3);
    expect(full[0]!.body.detail).toMatch(/no free slot in cluster place: its 2 live nodes use 60 of 60 slots/);
    const final = await view(b);
    for (const n of final.nodes) expect([n.used, n.reserved]).toEqual([n.slots, 0]);
    // The default sandbox (root paths) would take a slot too: none is left.
    const root = await post(`${a.url}/execute`, commandReq('true'));
    expect(root.status).toBe(429);
    expect(root.body.detail).toBe('sandbox limit reached: 20 sandboxes are in use; DELETE /sandboxes/<id> one first');
    for (const n of [a, b]) expect((await get(`${n.url}/sandboxes`)).body.sandboxes.length).toBe(slots[nodes.indexOf(n)]);
  }, 300_000);

  it('reservations: an unclaimed one lapses (a placer that died leaks no slot), dropping twice frees one, a second server on one URL is refused, and a stalled Redis fails fast naming it', async () => {
    const env = { queue: queue('units'), redis: { password: PASSWORD }, heartbeatTtlMs: 5000, reservationMs: 700, localCount: () => 0, localIds: () => [] };
    const p1 = await Placement.start({ ...env, advertise: 'http://node-1.test:1', slots: 2, redisTimeoutMs: 400 });
    const p2 = await Placement.start({ ...env, advertise: 'http://node-2.test:2', slots: 1 });
    try {
      const free = async () => Object.fromEntries((await p1.nodes()).map((n) => [n.url, [n.used, n.reserved, n.free]]));
      // Most free first; on a tie the placing node itself (no hop).
      const first = await p1.place();
      expect(first).toMatchObject({ node: p1.url, self: true, free: 2 });
      const second = await p2.place(); // 1 free each
      expect(second).toMatchObject({ node: p2.url, self: true, free: 1 });
      expect(await p2.place()).toMatchObject({ node: p1.url, self: false, free: 1 });
      expect(await p1.place()).toMatchObject({ node: null, nodes: 2, slots: 3, used: 3 });
      expect(await free()).toEqual({ [p1.url]: [0, 2, 0], [p2.url]: [0, 1, 0] });
      // Claimed: counted as held, no longer reserved. Dropped twice: one slot back, not two.
      expect(await p1.claim(first.node ? first.token : '')).toBe(true);
      if (second.node) {
        await p2.drop(second.node, second.token);
        await p2.drop(second.node, second.token);
      }
      expect(await free()).toEqual({ [p1.url]: [1, 1, 0], [p2.url]: [0, 0, 1] });
      // The reservation nobody claimed lapses by itself.
      await new Promise((r) => setTimeout(r, 800));
      expect(await free()).toEqual({ [p1.url]: [1, 0, 1], [p2.url]: [0, 0, 1] });
      // Its own default sandbox takes a slot only if one is free.
      expect(await p2.claim()).toBe(true);
      expect(await p2.claim()).toBe(false);
      await p2.uncount();
      await p2.uncount();
      expect(await free()).toEqual({ [p1.url]: [1, 0, 1], [p2.url]: [0, 0, 1] });
      // Two live servers cannot advertise one URL.
      await expect(Placement.start({ ...env, advertise: p2.url, slots: 1 })).rejects.toThrow(`node ${p2.url} is already registered by another live server`);
      // Redis that does not answer (every client paused): a ClusterError naming it, at the timeout.
      const admin = new Redis({ port: redisPort, host: '127.0.0.1', password: PASSWORD });
      await admin.call('CLIENT', 'PAUSE', '1500', 'ALL');
      const t0 = performance.now();
      const stalled = await p1.place().catch((e: unknown) => e);
      expect(stalled).toBeInstanceOf(ClusterError);
      expect((stalled as Error).message).toContain(`Redis at redis://127.0.0.1:${redisPort}/units did not answer within 0.4s`);
      expect(performance.now() - t0).toBeLessThan(1200);
      admin.disconnect();
    } finally {
      await p1.stop();
      await p2.stop();
    }
  }, 60_000);

  // The swerex package is not on this machine's package index. To run this test, put SWE-ReX's
  // source and its client's dependencies (aiohttp, pydantic, rich, requests) on python3's path:
  //   python3 -m venv V && V/bin/pip install aiohttp pydantic rich requests
  //   PATH=V/bin:$PATH PYTHONPATH=SWE-ReX/src npx vitest run test/cluster
  it('SWE-ReX\'s Python RemoteRuntime drives a placed sandbox through the URL the create answered, follows a wrong node\'s 307, and hears a dead node\'s 410', async (ctx) => {
    const probe = spawnSync('python3', ['-c', 'import swerex.runtime.remote'], { encoding: 'utf8' });
    if (probe.status !== 0) ctx.skip(`the swerex Python package is not importable (python3: ${probe.stderr.trim().split('\n').at(-1)})`);
    const [a, b] = await Promise.all([startNode('swerex', 1), startNode('swerex', 3)]);
    nodes.push(a, b);
    const created = await post(`${a.url}/sandboxes`, {});
    expect(created.body.node).toBe(b.url);
    const script = `
import asyncio, sys, time, aiohttp
from swerex.runtime.remote import RemoteRuntime
from swerex.runtime.abstract import BashAction, Command, CreateBashSessionRequest
async def main(mode, url, token):
    rt = RemoteRuntime(host=url, port=None, auth_token=token)
    if mode == "drive":
        assert (await rt.is_alive()).is_alive
        await rt.create_session(CreateBashSessionRequest())
        out = await rt.run_in_session(BashAction(command="cd /tmp && echo placed-$((6*7))", check="silent"))
        print(out.output.strip())
        print((await rt.execute(Command(command="pwd", shell=True))).stdout.strip())
        await rt.close()
    elif mode == "redirected":
        print((await rt.execute(Command(command="echo redirected", shell=True))).stdout.strip())
    else:
        t0 = time.monotonic()
        try:
            await rt.execute(Command(command="true", shell=True))
        except aiohttp.ClientResponseError as e:
            print(e.status, time.monotonic() - t0 < 1)
        print((await rt.is_alive()).is_alive)
asyncio.run(main(*sys.argv[1:]))
`;
    const python = (mode: string, url: string) => spawnSync('python3', ['-c', script, mode, url, TOKEN], { encoding: 'utf8', timeout: 60_000 });
    const drive = python('drive', created.body.url);
    expect(drive.stderr).toBe('');
    expect(drive.stdout).toBe('placed-42\n/work\n');
    expect((await get(`${b.url}/sandboxes/${created.body.id}`)).body.sessions).toEqual([]);
    // The wrong node's URL for the sandbox: aiohttp follows the 307 with the method, body and X-API-Key.
    const redirected = python('redirected', `${a.url}/sandboxes/${created.body.id}`);
    expect(redirected.stdout).toBe('redirected\n');
    // Its node killed, past the TTL: the client raises at once for the 410, logging the body that names the node.
    process.kill(b.pid, 'SIGKILL');
    await new Promise((r) => setTimeout(r, TTL_S * 1000 + 500));
    const gone = python('gone', `${a.url}/sandboxes/${created.body.id}`);
    expect(gone.stdout.trim().split('\n').slice(-2)).toEqual(['410 True', 'False']);
    // swerex's logger (rich, on stdout) shows the reply's body, wrapped at spaces.
    expect(gone.stdout.replace(/\s+/g, ' ')).toContain(`'node': '${b.url}'`);
  }, 120_000);
});

const OPENSSL = ['/usr/bin/openssl', '/usr/local/bin/openssl'].find((p) => existsSync(p));

describe.skipIf(!REDIS || !OPENSSL)(`serve --queue: Redis over TLS with a client certificate${REDIS && OPENSSL ? '' : ' (skipped: no redis-server or openssl binary)'}`, () => {
  const tls = tempDir('msbx-placement-tls-');
  let tlsRedis: ChildProcess | undefined;
  afterAll(() => {
    tlsRedis?.kill('SIGKILL');
    tls.remove();
  });

  it('joins through rediss:// with --redis-ca, --redis-cert and --redis-key, and names the URL when the certificate is missing', async () => {
    const ssl = (...args: string[]) => {
      const r = spawnSync(OPENSSL!, args, { cwd: tls.path, encoding: 'utf8' });
      if (r.status !== 0) throw new Error(`openssl ${args.join(' ')}: ${r.stderr}`);
    };
    writeFileSync(join(tls.path, 'ext'), 'subjectAltName=IP:127.0.0.1\n');
    ssl('req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', 'ca.key', '-out', 'ca.crt', '-days', '2', '-subj', '/CN=msbx-test-ca');
    for (const who of ['server', 'client']) {
      ssl('req', '-newkey', 'rsa:2048', '-nodes', '-keyout', `${who}.key`, '-out', `${who}.csr`, '-subj', '/CN=127.0.0.1');
      ssl('x509', '-req', '-in', `${who}.csr`, '-CA', 'ca.crt', '-CAkey', 'ca.key', '-CAcreateserial', '-out', `${who}.crt`, '-days', '2', '-extfile', 'ext');
    }
    const port = await freePort();
    const f = (name: string) => join(tls.path, name);
    // TLS only (no plain port), client certificates required, and a password.
    tlsRedis = spawn(REDIS!, ['--port', '0', '--tls-port', String(port), '--bind', '127.0.0.1', '--tls-cert-file', f('server.crt'), '--tls-key-file', f('server.key'), '--tls-ca-cert-file', f('ca.crt'), '--tls-auth-clients', 'yes', '--requirepass', PASSWORD, '--save', '', '--dir', tls.path], { stdio: 'ignore' });
    const url = `rediss://127.0.0.1:${port}/tls`;
    const env = cleanEnv({ MINISANDBOX_AUTH_TOKEN: TOKEN, MINISANDBOX_REDIS_PASSWORD: PASSWORD });
    let node: ServeProcess | undefined;
    for (let i = 0; !node; i++) {
      try {
        node = await startServe(['--quiet', '--queue', url, '--slots', '2', '--redis-ca', f('ca.crt'), '--redis-cert', f('client.crt'), '--redis-key', f('client.key')], env);
      } catch (e) {
        if (i > 20) throw e; // redis-server still starting
        await new Promise((r) => setTimeout(r, 250));
      }
    }
    try {
      expect((await get(`${node.url}/cluster`)).body).toMatchObject({ redis: url, nodes: [{ url: node.url, slots: 2, used: 0 }] });
      const created = await post(`${node.url}/sandboxes`, {});
      expect(created.body.node).toBe(node.url);
    } finally {
      await node.stop();
    }
    const noCert = serveSync(['--queue', url, '--slots', '2', '--redis-ca', f('ca.crt')], env);
    expect(noCert.status).toBe(1);
    expect(noCert.stderr).toContain(url);
    const certWithoutKey = serveSync(['--queue', url, '--redis-cert', f('client.crt')], env);
    expect(certWithoutKey.status).toBe(2);
    expect(certWithoutKey.stderr).toContain('--redis-cert and --redis-key go together');
  }, 120_000);
});
