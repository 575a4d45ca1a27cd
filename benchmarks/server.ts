/**
 * Overhead of the SWE-ReX server over calling the library directly:
 *
 * - run: `run_in_session` of `true` over HTTP vs `session.run('true')`;
 * - create: `POST /sandboxes` vs `Sandbox.create()`;
 *
 * each at 1 and at 32 concurrent clients (one sandbox and session per
 * client for `run`). Usage:
 *
 *   node dist/benchmarks/server.js [--iterations N] [--clients 1,32] [--no-docker] [--json]
 *
 * The HTTP client is Node's fetch in this process, so the server figures
 * include one client's cost too (the Python client's aiohttp is slower).
 */
import { Sandbox } from '../lib/sandbox/index.js';
import { startServer } from '../lib/server/index.js';
import type { ShellSession } from '../lib/shell/index.js';
import { HOST_IMAGE, dockerCommand, ensureDocker, hostImagePaths, importImage, stopDocker } from './lib/docker.js';
import { count, counts, flag, readArgs } from './lib/args.js';
import { exec } from './lib/proc.js';
import { formatMs, formatRatio, formatTable } from '../lib/format.js';
import { summarize, type Summary } from './lib/stats.js';

interface Options {
  iterations: number;
  clients: number[];
  docker: boolean;
  json: boolean;
}

const USAGE = 'usage: node dist/benchmarks/server.js [--iterations N] [--clients 1,32] [--no-docker] [--json]';

function parseOptions(): Options {
  const v = readArgs(USAGE, { iterations: count(100), clients: counts([1, 32]), 'no-docker': flag(), json: flag() });
  return { iterations: v.iterations, clients: v.clients, docker: !v['no-docker'], json: v.json };
}

const log = (msg: string) => process.stderr.write(`[bench] ${msg}\n`);
const TOKEN = 'bench-token';
const HEADERS = { 'x-api-key': TOKEN, 'content-type': 'application/json' };

async function postJson(url: string, body?: unknown): Promise<any> {
  const r = await fetch(url, { method: 'POST', headers: HEADERS, body: body === undefined ? undefined : JSON.stringify(body) });
  const data = await r.json();
  if (r.status !== 200) throw new Error(`${url}: HTTP ${r.status} ${JSON.stringify(data).slice(0, 300)}`);
  return data;
}

const bashTrue = {
  command: 'true', session: 'default', timeout: null, is_interactive_command: false, is_interactive_quit: false,
  check: 'raise', error_msg: '', expect: [], action_type: 'bash',
};

/** `clients` loops in parallel, each timing `iterations` sequential calls of its own `op`. */
async function measure(clients: number, iterations: number, op: (client: number) => Promise<void>): Promise<number[]> {
  const samples: number[] = [];
  await Promise.all(
    Array.from({ length: clients }, async (_, c) => {
      for (let i = 0; i < iterations; i++) {
        const t0 = performance.now();
        await op(c);
        samples.push(performance.now() - t0);
      }
    }),
  );
  return samples;
}

interface Row {
  name: string;
  clients: number;
  summary: Summary;
}

async function main(): Promise<void> {
  const opts = parseOptions();
  const server = await startServer({ port: 0, authToken: TOKEN });
  const rows: Row[] = [];
  try {
    for (const clients of opts.clients) {
      const perClient = Math.max(5, Math.ceil(opts.iterations / clients));
      // ---- run_in_session `true`
      log(`run: ${clients} client(s) x ${perClient}`);
      const direct: Array<{ sb: Sandbox; sh: ShellSession }> = [];
      const bases: string[] = [];
      for (let c = 0; c < clients; c++) {
        const sb = await Sandbox.create();
        direct.push({ sb, sh: await sb.shell({ startupTimeoutMs: 5000 }) });
        const { url } = await postJson(`${server.url}/sandboxes`, {});
        await postJson(`${url}/create_session`, { startup_source: [], session: 'default', session_type: 'bash', startup_timeout: 5 });
        bases.push(url);
      }
      const warm = async () => {
        await Promise.all(direct.map((d) => d.sh.run('true')));
        await Promise.all(bases.map((b) => postJson(`${b}/run_in_session`, bashTrue)));
      };
      await warm();
      rows.push({ name: 'session.run(true) direct', clients, summary: summarize(await measure(clients, perClient, (c) => direct[c]!.sh.run('true').then(() => {}))) });
      rows.push({ name: 'run_in_session(true) HTTP', clients, summary: summarize(await measure(clients, perClient, (c) => postJson(`${bases[c]}/run_in_session`, bashTrue))) });
      await Promise.all(direct.map((d) => d.sb.close()));
      await Promise.all(bases.map((b) => fetch(b, { method: 'DELETE', headers: HEADERS })));

      // ---- sandbox creation (closing is outside the timed part)
      const createPerClient = Math.max(3, Math.ceil(perClient / 2));
      log(`create: ${clients} client(s) x ${createPerClient}`);
      const toClose: Sandbox[] = [];
      rows.push({
        name: 'Sandbox.create() direct',
        clients,
        summary: summarize(await measure(clients, createPerClient, async () => void toClose.push(await Sandbox.create()))),
      });
      await Promise.all(toClose.splice(0).map((s) => s.close()));
      const urls: string[] = [];
      rows.push({
        name: 'POST /sandboxes HTTP',
        clients,
        summary: summarize(await measure(clients, createPerClient, async () => void urls.push((await postJson(`${server.url}/sandboxes`, {})).url))),
      });
      await Promise.all(urls.map((u) => fetch(u, { method: 'DELETE', headers: HEADERS })));
    }
  } finally {
    await server.close();
  }
  if (opts.docker) rows.push(...(await dockerCreate(opts)));

  if (opts.json) {
    process.stdout.write(JSON.stringify(rows, null, 2) + '\n');
    return;
  }
  const table: string[][] = [['benchmark', 'clients', 'n', 'median', 'p95']];
  for (const r of rows) table.push([r.name, String(r.clients), String(r.summary.n), formatMs(r.summary.median), formatMs(r.summary.p95)]);
  console.log(formatTable(table));
  console.log('\nServer overhead (HTTP / direct):');
  const ratio: string[][] = [['what', 'clients', 'median ratio', 'p95 ratio']];
  for (const clients of opts.clients) {
    const find = (name: string) => rows.find((r) => r.name === name && r.clients === clients)!.summary;
    for (const [what, http, direct] of [
      ['run true', 'run_in_session(true) HTTP', 'session.run(true) direct'],
      ['create', 'POST /sandboxes HTTP', 'Sandbox.create() direct'],
    ] as const) {
      const h = find(http);
      const d = find(direct);
      ratio.push([what, String(clients), formatRatio(h.median / d.median), formatRatio(h.p95 / d.p95)]);
    }
  }
  console.log(formatTable(ratio));
  const dockerRows = rows.filter((r) => r.name.startsWith('docker'));
  if (dockerRows.length) {
    console.log('\nSandbox creation through the server vs a container (docker run -d of the same files):');
    const vs: string[][] = [['clients', 'docker / POST /sandboxes (median)', 'p95']];
    for (const d of dockerRows) {
      const h = rows.find((r) => r.name === 'POST /sandboxes HTTP' && r.clients === d.clients)?.summary;
      if (h) vs.push([String(d.clients), formatRatio(d.summary.median / h.median), formatRatio(d.summary.p95 / h.p95)]);
    }
    console.log(formatTable(vs));
  } else if (opts.docker) {
    console.log(`\ndocker: ${dockerSkipped}`);
  }
}

let dockerSkipped = 'not measured';

/** `docker run -d` of the host-files image, at the same client counts. */
async function dockerCreate(opts: Options): Promise<Row[]> {
  let handle;
  const rows: Row[] = [];
  try {
    handle = await ensureDocker(log);
    await importImage(handle, HOST_IMAGE, hostImagePaths(), log);
    for (const clients of opts.clients) {
      const perClient = Math.max(2, Math.ceil(opts.iterations / clients / 8));
      log(`docker run -d: ${clients} client(s) x ${perClient}`);
      const ids: string[] = [];
      const samples = await measure(clients, perClient, async () => {
        const [cli, args] = dockerCommand(handle!, ['run', '-d', '--rm', '--network', 'none', HOST_IMAGE, '/usr/bin/sleep', 'infinity']);
        const r = await exec(cli, args, { timeoutMs: 120_000 });
        if (r.code !== 0) throw new Error(`docker run failed: ${r.stderr.trim()}`);
        ids.push(r.stdout.trim());
      });
      rows.push({ name: 'docker run -d (container)', clients, summary: summarize(samples) });
      const [cli, args] = dockerCommand(handle, ['kill', ...ids]);
      await exec(cli, args, { timeoutMs: 120_000 });
    }
  } catch (e) {
    dockerSkipped = `skipped: ${(e as Error).message}`;
  } finally {
    if (handle) await stopDocker(handle, log);
  }
  return rows;
}

main().catch((e: unknown) => {
  process.stderr.write(`${(e as Error).stack ?? String(e)}\n`);
  process.exitCode = 1;
});
