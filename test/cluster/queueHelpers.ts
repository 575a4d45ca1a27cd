/**
 * The cluster's test bench: a real redis-server started here, and worker
 * processes standing for nodes. As root each node is a network namespace
 * (`ip netns add`) joined to the host by a veth pair, with Redis listening
 * on the host's side; as an unprivileged user (no `ip netns`) the workers
 * are plain processes on loopback, and the tests say so. Every node has its
 * own store. Everything started here is stopped by `close()`.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { chmodSync, createWriteStream, mkdirSync, mkdtempSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { removeTree } from '../../lib/files/fsTree.js';
import { createDemoTaskSet } from '../../lib/swe/demo/index.js';
import type { Prediction, Task } from '../../lib/swe/tasks.js';

export const CLI = fileURLToPath(new URL('../../dist/lib/cli/main.js', import.meta.url));

export function which(cmd: string): string | undefined {
  const r = spawnSync('/bin/sh', ['-c', `command -v ${cmd}`], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : undefined;
}

export const REDIS_SERVER = which('redis-server');
export const NO_REDIS_REASON = 'redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)';

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

function sh(cmd: string[]): { ok: boolean; out: string } {
  const r = spawnSync(cmd[0]!, cmd.slice(1), { encoding: 'utf8' });
  return { ok: r.status === 0, out: `${r.stdout}${r.stderr}`.trim() };
}

function must(cmd: string[]): void {
  const r = sh(cmd);
  if (!r.ok) throw new Error(`${cmd.join(' ')}: ${r.out}`);
}

export interface Node {
  name: string;
  /** The Redis address this node reaches. */
  redisHost: string;
  store: string;
  /** `ip netns exec NS` for a node in its own namespace; [] on loopback. */
  prefix: string[];
  worker?: WorkerProcess;
}

export interface WorkerProcess {
  pid: number;
  child: ChildProcess;
  logFile: string;
  log(): string;
  exited: Promise<number | null>;
}

export interface Bench {
  /** 'netns' (root: a namespace and veth per node) or 'loopback' (and why). */
  mode: 'netns' | 'loopback';
  why: string;
  port: number;
  queue: string;
  passwordFile: string;
  nodes: Node[];
  dir: string;
  url(node: Node | undefined): string;
  startWorker(node: Node, extra?: string[]): Promise<WorkerProcess>;
  close(): Promise<void>;
}

/**
 * Redis (with a password) and `n` nodes. A node's worker reaches Redis at
 * the host side of its veth (or 127.0.0.1); the coordinator at 127.0.0.1.
 */
export async function startBench(n: number, label: string): Promise<Bench> {
  const dir = mkdtempSync(join(tmpdir(), `msbx-cluster-${label}-`));
  chmodSync(dir, 0o755);
  const tag = `${process.pid % 100000}`;
  const nodes: Node[] = [];
  const namespaces: string[] = [];
  const hostLinks: string[] = [];
  let mode: Bench['mode'] = 'loopback';
  let why = process.getuid?.() === 0 ? '' : 'not root: `ip netns add` needs CAP_SYS_ADMIN, so the nodes are plain processes on loopback, each with its own store';
  const subnet = 100 + (process.pid % 100);
  if (process.getuid?.() === 0) {
    try {
      if (!which('ip')) throw new Error('no ip(8) (iproute2)');
      for (let i = 0; i < n; i++) {
        const ns = `msbxq${tag}n${i}`;
        const host = `mq${tag}h${i}`;
        const peer = `mq${tag}p${i}`;
        must(['ip', 'netns', 'add', ns]);
        namespaces.push(ns);
        must(['ip', 'link', 'add', host, 'type', 'veth', 'peer', 'name', peer]);
        hostLinks.push(host);
        must(['ip', 'link', 'set', peer, 'netns', ns]);
        const hostIp = `10.${subnet}.${i}.1`;
        must(['ip', 'addr', 'add', `${hostIp}/30`, 'dev', host]);
        must(['ip', 'link', 'set', host, 'up']);
        must(['ip', 'netns', 'exec', ns, 'ip', 'addr', 'add', `10.${subnet}.${i}.2/30`, 'dev', peer]);
        must(['ip', 'netns', 'exec', ns, 'ip', 'link', 'set', peer, 'up']);
        must(['ip', 'netns', 'exec', ns, 'ip', 'link', 'set', 'lo', 'up']);
        nodes.push({ name: `node${i}`, redisHost: hostIp, store: join(dir, `store${i}`), prefix: ['ip', 'netns', 'exec', ns] });
      }
      mode = 'netns';
      why = `each node in its own network namespace (${namespaces.join(', ')}), reaching Redis over a veth pair`;
    } catch (e) {
      why = `root, but the namespaces could not be made (${(e as Error).message}): plain processes on loopback`;
      cleanupNet(namespaces, hostLinks);
      namespaces.length = 0;
      hostLinks.length = 0;
      nodes.length = 0;
    }
  }
  if (mode === 'loopback') for (let i = 0; i < n; i++) nodes.push({ name: `node${i}`, redisHost: '127.0.0.1', store: join(dir, `store${i}`), prefix: [] });

  const port = await freePort();
  const password = `pw-${Math.random().toString(36).slice(2)}`;
  const passwordFile = join(dir, 'redis-password');
  writeFileSync(passwordFile, `${password}\n`, { mode: 0o600 });
  const binds = ['127.0.0.1', ...(mode === 'netns' ? nodes.map((x) => x.redisHost) : [])];
  const redis = spawn(REDIS_SERVER!, ['--port', String(port), '--bind', ...binds, '--save', '', '--appendonly', 'no', '--requirepass', password, '--dir', dir], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let redisOut = '';
  redis.stdout!.on('data', (d: Buffer) => (redisOut += d.toString()));
  redis.stderr!.on('data', (d: Buffer) => (redisOut += d.toString()));
  const deadline = Date.now() + 10_000;
  while (!/Ready to accept connections/.test(redisOut)) {
    if (redis.exitCode !== null || Date.now() > deadline) throw new Error(`redis-server did not start: ${redisOut}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  const queue = `t${tag}-${label}`;
  const workers: WorkerProcess[] = [];

  const bench: Bench = {
    mode,
    why,
    port,
    queue,
    passwordFile,
    nodes,
    dir,
    url: (node) => `redis://${node?.redisHost ?? '127.0.0.1'}:${port}/${queue}`,
    async startWorker(node, extra = []) {
      const logFile = join(dir, `${node.name}-${Date.now()}.log`);
      const out = createWriteStream(logFile);
      let text = '';
      const child = spawn(
        node.prefix[0] ?? process.execPath,
        [...node.prefix.slice(1), ...(node.prefix.length ? [process.execPath] : []), CLI, 'worker', '--queue', bench.url(node), '--redis-password-file', passwordFile, '--store', node.store, '--slots', '2', '--lock-timeout', '5', ...extra],
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      for (const stream of [child.stdout!, child.stderr!]) {
        stream.on('data', (d: Buffer) => {
          text += d.toString();
          out.write(d);
        });
      }
      const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
      const w: WorkerProcess = { pid: child.pid!, child, logFile, log: () => text, exited };
      workers.push(w);
      node.worker = w;
      const until = Date.now() + 20_000;
      while (!/worker \S+: \d+ slot/.test(w.log())) {
        if (child.exitCode !== null || Date.now() > until) throw new Error(`worker on ${node.name} did not start: ${w.log()}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      return w;
    },
    async close() {
      for (const w of workers) if (w.child.exitCode === null && w.child.signalCode === null) w.child.kill('SIGKILL');
      await Promise.all(workers.map((w) => w.exited));
      redis.kill('SIGKILL');
      cleanupNet(namespaces, hostLinks);
      // Store layers are read-only (0555 directories): removeTree makes them writable first.
      await removeTree(dir);
    },
  };
  return bench;
}

function cleanupNet(namespaces: string[], hostLinks: string[]): void {
  // Deleting a namespace destroys its end of the veth, and with it the pair.
  for (const ns of namespaces) sh(['ip', 'netns', 'del', ns]);
  for (const link of hostLinks) sh(['ip', 'link', 'del', link]);
}

/** Leftover namespaces or links of this process (for the cleanup assertion). */
export function leftoverNet(): string[] {
  const tag = `${process.pid % 100000}`;
  const ns = sh(['ip', 'netns', 'list']).out.split('\n').filter((l) => l.startsWith(`msbxq${tag}n`));
  const links = sh(['ip', '-o', 'link', 'show']).out.split('\n').filter((l) => l.includes(`mq${tag}h`));
  return [...ns, ...links];
}

export interface TaskSet40 {
  tasksFile: string;
  predsFile: string;
  tasks: Task[];
  predictions: Prediction[];
}

/**
 * The demo's 4 tasks, each copied 10 times under distinct ids, with a mix
 * of predictions: gold (resolves), partial fixes (tests run, not resolved),
 * another task's gold patch (does not apply), empty and null patches.
 */
export function taskSet40(dir: string): TaskSet40 {
  const demo = createDemoTaskSet(join(dir, 'demo'));
  const tasks: Task[] = [];
  const predictions: Prediction[] = [];
  const partial = new Map(demo.partialFixes.map((f) => [f.instance_id, f.patch]));
  demo.tasks.forEach((t, ti) => {
    const other = demo.tasks[(ti + 1) % demo.tasks.length]!;
    for (let k = 0; k < 10; k++) {
      const id = `${t.instance_id}-c${k}`;
      tasks.push({ ...t, instance_id: id });
      let patch: string | null;
      if (k % 5 === 0 || k === 4) patch = t.patch;
      else if (k % 5 === 1) patch = partial.get(t.instance_id) ?? t.patch;
      else if (k % 5 === 2) patch = other.patch;
      else if (k % 5 === 3) patch = k === 3 ? '' : null;
      else patch = t.patch;
      predictions.push({ instance_id: id, model_patch: patch, model_name_or_path: 'mix' });
    }
  });
  mkdirSync(dir, { recursive: true });
  const tasksFile = join(dir, 'tasks40.jsonl');
  const predsFile = join(dir, 'preds40.jsonl');
  writeFileSync(tasksFile, tasks.map((t) => JSON.stringify(t)).join('\n') + '\n');
  writeFileSync(predsFile, predictions.map((p) => JSON.stringify(p)).join('\n') + '\n');
  return { tasksFile, predsFile, tasks, predictions };
}

/** A report without what differs between any two runs (durations). */
export function comparable(report: Record<string, unknown>): Record<string, unknown> {
  const { timings: _t, timing_medians: _m, timing_medians_by_isolation: _b, totals, ...rest } = report as Record<string, unknown> & { totals: Record<string, unknown> };
  const { wall_ms: _w, ...t } = totals;
  return { ...rest, totals: t };
}

export interface CliRun {
  child: ChildProcess;
  stderr(): string;
  stdout(): string;
  done: Promise<number | null>;
}

/** `minisandbox ARGS` in its own process, its output collected. */
export function cli(args: string[], env: NodeJS.ProcessEnv = process.env): CliRun {
  const child = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env });
  let out = '';
  let err = '';
  child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (err += d.toString()));
  const done = new Promise<number | null>((resolve) => child.once('close', (code) => resolve(code)));
  return { child, stderr: () => err, stdout: () => out, done };
}

export async function waitFor(what: string, cond: () => boolean, timeoutMs = 120_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Job ids a worker's log shows as started and as finished. */
export function jobsIn(log: string, runId: string): { started: string[]; finished: string[] } {
  const started: string[] = [];
  const finished: string[] = [];
  for (const m of log.matchAll(new RegExp(`minisandbox worker: (${runId}\\.\\S+): (.*)`, 'g'))) {
    if (m[2]!.startsWith('started')) started.push(m[1]!);
    else if (!m[2]!.startsWith('returned')) finished.push(m[1]!);
  }
  return { started, finished };
}
