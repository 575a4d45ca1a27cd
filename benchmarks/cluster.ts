/**
 * Throughput of evaluation through the queue with 1, 2 and 3 workers on the
 * same task set (issue 14's goal: 3 workers at least 2.5x one).
 *
 * Each worker is a `minisandbox worker` process with its own store, standing
 * for a node; Redis is a redis-server on loopback started here. Every store
 * is prepared first (`prepareOnQueue`), so that the timed runs measure
 * evaluation, not builds. Each configuration evaluates the whole set once
 * (a fresh run id) and its throughput is instances per second of wall time.
 *
 * All workers share this machine's CPUs: on a 2-CPU machine, 3 workers whose
 * test commands are CPU-bound cannot be 3x one. So two workloads are timed:
 * - `cpu`: the demo tasks' pytest runs as they are (CPU-bound);
 * - `wait`: the same with a `sleep` before the tests (a test suite waiting
 *   on I/O, a database, a subprocess), where a node's CPU is not the limit:
 *   what the queue and the workers themselves allow.
 *
 * Usage: node dist/benchmarks/cluster.js [--instances N] [--slots N] [--wait-s S] [--workers 1,2,3] [--only cpu|wait]
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { removeTree } from '../lib/files/fsTree.js';
import { createServer } from 'node:net';
import { availableParallelism, cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { evaluateOnQueue, parseQueueUrl, prepareOnQueue, listWorkers } from '../lib/cluster/index.js';
import { formatMs, formatRatio, formatTable } from '../lib/format.js';
import { createDemoTaskSet } from '../lib/swe/demo/createDemoTaskSet.js';
import type { Prediction, Task } from '../lib/swe/tasks.js';
import { count, counts, oneOf, readArgs, seconds } from './lib/args.js';

const log = (msg: string) => process.stderr.write(`[cluster-bench] ${msg}\n`);
const CLI = fileURLToPath(new URL('../lib/cli/main.js', import.meta.url));

const ARGS = readArgs('usage: node dist/benchmarks/cluster.js [--instances N] [--slots N] [--wait-s S] [--workers 1,2,3] [--only cpu|wait]', {
  instances: count(24),
  slots: count(1),
  'wait-s': seconds(2),
  workers: counts([1, 2, 3]),
  only: oneOf(['cpu', 'wait']),
});
const INSTANCES = ARGS.instances;
const SLOTS = ARGS.slots;
const WAIT_S = ARGS['wait-s'];
const COUNTS = ARGS.workers;

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address() as { port: number };
      s.close(() => resolve(port));
    });
  });
}

function taskSet(dir: string, n: number, waitS: number): { tasks: Task[]; predictions: Prediction[] } {
  const demo = createDemoTaskSet(join(dir, 'demo'));
  const tasks: Task[] = [];
  const predictions: Prediction[] = [];
  for (let i = 0; i < n; i++) {
    const t = demo.tasks[i % demo.tasks.length]!;
    const id = `${t.instance_id}-b${i}`;
    tasks.push({ ...t, instance_id: id, ...(waitS > 0 ? { test_cmd: `sleep ${waitS}; ${t.test_cmd}` } : {}) });
    predictions.push({ instance_id: id, model_patch: t.patch, model_name_or_path: 'gold' });
  }
  return { tasks, predictions };
}

async function main(): Promise<void> {
  const redisServer = spawnSync('/bin/sh', ['-c', 'command -v redis-server'], { encoding: 'utf8' }).stdout.trim();
  if (!redisServer) {
    log('redis-server is not installed (apt-get install redis-server): nothing to measure');
    process.exitCode = 1;
    return;
  }
  const dir = mkdtempSync(join(tmpdir(), 'msbx-cluster-bench-'));
  const port = await freePort();
  const redis = spawn(redisServer, ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no'], { stdio: 'ignore' });
  const workers: ChildProcess[] = [];
  const stopWorkers = async () => {
    await Promise.all(
      workers.splice(0).map(
        (w) =>
          new Promise<void>((resolve) => {
            if (w.exitCode !== null) return resolve();
            w.once('exit', () => resolve());
            w.kill('SIGTERM');
          }),
      ),
    );
  };
  try {
    await new Promise((r) => setTimeout(r, 300));
    const workloads = (['cpu', 'wait'] as const).filter((w) => !ARGS.only || ARGS.only === w);
    const rows = [['workload', 'workers', 'slots each', 'instances', 'wall', 'instances/s', 'vs 1 worker']];
    const summary: string[] = [];
    for (const workload of workloads) {
      const set = taskSet(join(dir, workload), INSTANCES, workload === 'wait' ? WAIT_S : 0);
      let base: number | undefined;
      for (const k of COUNTS) {
        const queue = `bench-${workload}-${k}`;
        const target = parseQueueUrl(`redis://127.0.0.1:${port}/${queue}`);
        for (let i = 0; i < k; i++) {
          // A store per node, kept across configurations (prepared once).
          const w = spawn(process.execPath, [CLI, 'worker', '--queue', `redis://127.0.0.1:${port}/${queue}`, '--slots', String(SLOTS), '--store', join(dir, `store${i}`), '--quiet'], { stdio: ['ignore', 'ignore', 'inherit'] });
          workers.push(w);
        }
        while ((await listWorkers(target)).length < k) await new Promise((r) => setTimeout(r, 100));
        await prepareOnQueue(set.tasks, { target });
        log(`${workload}: ${k} worker(s) ready, stores prepared; evaluating ${set.tasks.length} instances`);
        const t0 = performance.now();
        const run = await evaluateOnQueue(set.tasks, set.predictions, { target, runId: `r${Date.now()}`, timeoutMs: 600_000 });
        const wall = performance.now() - t0;
        if (run.report.resolved_instances !== set.tasks.length) log(`warning: ${run.report.resolved_instances}/${set.tasks.length} resolved (errors: ${JSON.stringify(run.report.errors).slice(0, 300)})`);
        const rate = set.tasks.length / (wall / 1000);
        base ??= rate;
        rows.push([workload, String(k), String(SLOTS), String(set.tasks.length), formatMs(wall), rate.toFixed(2), formatRatio(rate / base)]);
        if (k === 3) summary.push(`${workload}: 3 workers = ${formatRatio(rate / base)} one worker (goal >= 2.5x): ${rate / base >= 2.5 ? 'met' : 'NOT met'}`);
        await stopWorkers();
      }
    }
    process.stdout.write(`${formatTable(rows)}\n\n`);
    process.stdout.write(
      `Machine: ${availableParallelism()} CPU(s) (${cpus()[0]?.model ?? 'unknown'}), shared by Redis, the coordinator and every worker: ` +
        `the workers are nodes in name only, and CPU-bound tests cannot scale past the CPU count.\n`,
    );
    for (const line of summary) process.stdout.write(`${line}\n`);
  } finally {
    await stopWorkers();
    redis.kill('SIGKILL');
    await removeTree(dir);
  }
}

await main();
