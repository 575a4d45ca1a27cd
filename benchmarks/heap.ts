/**
 * What the caller's heap costs a spawn (issue 12). Sweeps the memory this
 * Node process holds (60 MiB, 1 GiB, 4 GiB: allocated and touched, held
 * live) and at each size times, on the spawner path:
 *
 *   exec     sb.exec(['/bin/true']) in a persistent sandbox
 *   run      run({ argv: ['/bin/true'] })
 *   create   Sandbox.create() + its first exec (the close is not timed)
 *   child_process.spawn('/bin/true'), the reference: Node's own fork cost
 *
 * and the same three on the in-process path (Node clones the sandbox
 * itself, as before the spawner), fewer times, to show what the spawner
 * saves. The sizes are visited in rounds, up then down (60, 1024, 4096,
 * 4096, 1024, 60, ...: the memory is dropped and a GC returns it between
 * visits), each visit taking a share of the samples, so that the drifting
 * load of a shared machine falls on every size alike. Then prints, per operation, the ratio of the median at the largest
 * size to the median at the smallest, with a verdict (target <= 1.3), and at
 * the smallest size the spawner path against the in-process path, timed in
 * ABBA order in this one process (target: no slower, ratio <= 1.0 within
 * noise: the verdict allows 5%).
 *
 *   node --max-old-space-size=8192 dist/benchmarks/heap.js [--iterations N]
 *        [--create-iterations N] [--sizes 60,1024,4096] [--json]
 *
 * Progress goes to stderr, results to stdout.
 */
import { spawn as spawnChild } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import * as v8 from 'node:v8';
import { runInNewContext } from 'node:vm';
import { Sandbox, run } from '../lib/sandbox/index.js';
import { native, setSpawnMode, type SpawnMode } from '../lib/native/index.js';
import { formatMs, formatRatio, formatTable } from '../lib/format.js';
import { count, counts, flag, readArgs } from './lib/args.js';
import { summarize, timeMany, timePair, type Summary } from './lib/stats.js';

const TARGET_HEAP_RATIO = 1.3; // median at the largest heap / median at the smallest
const TARGET_VS_INPROCESS = 1.05; // spawner / in-process at the smallest heap (no slower; 5% noise)
const MiB = 1024 * 1024;

interface Options {
  iterations: number;
  createIterations: number;
  sizes: number[]; // MiB of RSS to reach
  json: boolean;
}

const USAGE = 'usage: node --max-old-space-size=8192 dist/benchmarks/heap.js [--iterations N] [--create-iterations N] [--sizes 60,1024,4096] [--json]';

function parseOptions(): Options {
  const v = readArgs(USAGE, { iterations: count(40), 'create-iterations': count(15), sizes: counts([60, 1024, 4096]), json: flag() });
  return { iterations: v.iterations, createIterations: v['create-iterations'], sizes: v.sizes, json: v.json };
}

const log = (msg: string) => process.stderr.write(`${msg}\n`);

// The memory held live: Buffers (outside V8's heap, the bulk) and a share of
// JavaScript arrays (V8's heap), every page written so it is really mapped.
const held: unknown[] = [];
function growTo(mib: number): number {
  const rss = () => process.memoryUsage().rss / MiB;
  while (rss() < mib) {
    const step = Math.min(256, Math.ceil(mib - rss()));
    if (held.length % 4 === 3) {
      // ~step MiB of V8 heap: arrays of doubles (8 bytes each).
      const chunk: number[][] = [];
      for (let k = 0; k < step; k++) chunk.push(Array.from({ length: MiB / 8 }, (_, j) => j + 0.5));
      held.push(chunk);
    } else {
      held.push(Buffer.alloc(step * MiB, 1));
    }
  }
  return rss();
}

function nodeSpawn(): Promise<void> {
  return new Promise((resolve, reject) => {
    const c = spawnChild('/bin/true', { stdio: 'ignore' });
    c.on('error', reject);
    c.on('exit', () => resolve());
  });
}

/** Runs fn with spawns on the given path. */
async function on<T>(mode: SpawnMode, fn: () => Promise<T>): Promise<T> {
  setSpawnMode(mode);
  try {
    return await fn();
  } finally {
    setSpawnMode('spawner');
  }
}

interface Row {
  sizeMiB: number;
  rssMiB: number;
  op: string;
  path: SpawnMode | 'node';
  summary: Summary;
}

/** Drops the memory held and lets V8 return it, for a smaller size next. */
function shrink(): void {
  held.length = 0;
  v8.setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  gc();
  gc();
}

async function main(): Promise<void> {
  const opts = parseOptions();
  if (setSpawnMode('spawner').mode !== 'spawner') throw new Error(`no spawner binary: ${native.spawnerInfo().reason}`);
  const sizes = [...opts.sizes].sort((a, b) => a - b);
  // Sandbox.create + first exec, timed; the close is not.
  const createOnce = async (): Promise<number> => {
    const t = performance.now();
    const s = await Sandbox.create();
    await s.exec(['/bin/true']);
    const ms = performance.now() - t;
    await s.close();
    return ms;
  };
  const sb = await Sandbox.create();
  let abba: Record<string, [Summary, Summary]> = {};
  const samples = new Map<string, number[]>();
  const rss = new Map<number, number>();
  const add = (size: number, op: string, path: Row['path'], xs: number[]) => {
    const key = `${size}|${op}|${path}`;
    samples.set(key, [...(samples.get(key) ?? []), ...xs]);
  };
  try {
    // Spawner against in-process at the smallest size, A B B A in this one
    // process, before the heap grows.
    growTo(sizes[0]!);
    log(`spawner vs in-process at ${sizes[0]} MiB, ABBA`);
    const via = (mode: SpawnMode, fn: () => Promise<unknown>) => async () => {
      setSpawnMode(mode);
      await fn();
    };
    const pair = async (fn: () => Promise<unknown>, n: number) => {
      const [a, b] = await timePair(n, 2, via('spawner', fn), via('inprocess', fn));
      setSpawnMode('spawner');
      return [summarize(a), summarize(b)] as [Summary, Summary];
    };
    abba = {
      exec: await pair(() => sb.exec(['/bin/true']), opts.iterations),
      run: await pair(() => run({ argv: ['/bin/true'] }), opts.iterations),
      create: await pair(createOnce, opts.createIterations),
    };

    // The sweep: rounds that visit the sizes up then down (A B C C B A...),
    // each visit a share of the iterations, so that the load of a shared
    // machine, which drifts, falls on every size alike.
    const rounds = 4;
    const share = (n: number) => Math.max(1, Math.ceil(n / (2 * rounds)));
    for (let round = 0; round < rounds; round++) {
      for (const size of [...sizes, ...[...sizes].reverse()]) {
        if (process.memoryUsage().rss / MiB > size * 1.1 + 64) shrink();
        rss.set(size, growTo(size));
        log(`round ${round + 1}/${rounds}: ${size} MiB (RSS ${rss.get(size)!.toFixed(0)} MiB)`);
        add(size, 'exec', 'spawner', await timeMany(share(opts.iterations), 1, () => sb.exec(['/bin/true'])));
        add(size, 'run', 'spawner', await timeMany(share(opts.iterations), 1, () => run({ argv: ['/bin/true'] })));
        add(size, 'create', 'spawner', await timeMany(share(opts.createIterations), 0, createOnce));
        add(size, 'child_process.spawn', 'node', await timeMany(share(opts.iterations), 1, nodeSpawn));
        // Today's path, fewer times: it is the slow one.
        const few = (n: number) => Math.max(1, Math.ceil(share(n) / 3));
        add(size, 'exec', 'inprocess', await on('inprocess', () => timeMany(few(opts.iterations), 0, () => sb.exec(['/bin/true']))));
        add(size, 'run', 'inprocess', await on('inprocess', () => timeMany(few(opts.iterations), 0, () => run({ argv: ['/bin/true'] }))));
        add(size, 'create', 'inprocess', await on('inprocess', () => timeMany(few(opts.createIterations), 0, createOnce)));
      }
    }
  } finally {
    await sb.close();
  }
  const rows: Row[] = [];
  for (const size of sizes)
    for (const [op, path] of [
      ['exec', 'spawner'],
      ['run', 'spawner'],
      ['create', 'spawner'],
      ['child_process.spawn', 'node'],
      ['exec', 'inprocess'],
      ['run', 'inprocess'],
      ['create', 'inprocess'],
    ] as const)
      rows.push({ sizeMiB: size, rssMiB: Math.round(rss.get(size)!), op, path, summary: summarize(samples.get(`${size}|${op}|${path}`)!) });

  const small = sizes[0]!;
  const large = sizes[sizes.length - 1]!;
  const median = (op: string, path: Row['path'], size: number) => rows.find((r) => r.op === op && r.path === path && r.sizeMiB === size)?.summary.median ?? NaN;
  const verdicts: { what: string; ratio: number; target: string; ok: boolean }[] = [];
  for (const op of ['exec', 'run', 'create']) {
    const ratio = median(op, 'spawner', large) / median(op, 'spawner', small);
    verdicts.push({ what: `${op} (spawner): ${large} MiB / ${small} MiB`, ratio, target: `<= ${TARGET_HEAP_RATIO}`, ok: ratio <= TARGET_HEAP_RATIO });
  }
  for (const op of ['exec', 'run', 'create']) {
    const ratio = median(op, 'inprocess', large) / median(op, 'inprocess', small);
    verdicts.push({ what: `${op} (in-process, for reference): ${large} MiB / ${small} MiB`, ratio, target: '-', ok: true });
  }
  const nodeRatio = median('child_process.spawn', 'node', large) / median('child_process.spawn', 'node', small);
  verdicts.push({ what: `child_process.spawn (reference): ${large} MiB / ${small} MiB`, ratio: nodeRatio, target: '-', ok: true });
  for (const [op, [a, b]] of Object.entries(abba)) {
    const ratio = a.median / b.median;
    verdicts.push({ what: `${op} at ${small} MiB: spawner / in-process (ABBA)`, ratio, target: `<= ${TARGET_VS_INPROCESS}`, ok: ratio <= TARGET_VS_INPROCESS });
  }

  if (opts.json) {
    process.stdout.write(`${JSON.stringify({ rows, abba, verdicts }, null, 2)}\n`);
    return;
  }
  const table: string[][] = [['heap', 'RSS', 'operation', 'path', 'n', 'median', 'p95']];
  for (const r of rows) table.push([`${r.sizeMiB} MiB`, `${r.rssMiB} MiB`, r.op, r.path, String(r.summary.n), formatMs(r.summary.median), formatMs(r.summary.p95)]);
  process.stdout.write(`${formatTable(table)}\n\n`);
  const abbaTable: string[][] = [['operation', 'spawner median', 'p95', 'in-process median', 'p95']];
  for (const [op, [a, b]] of Object.entries(abba)) abbaTable.push([op, formatMs(a.median), formatMs(a.p95), formatMs(b.median), formatMs(b.p95)]);
  process.stdout.write(`at ${small} MiB, ABBA:\n${formatTable(abbaTable)}\n\n`);
  for (const v of verdicts) {
    const tag = v.target === '-' ? '    ' : v.ok ? 'PASS' : 'FAIL';
    process.stdout.write(`${tag} ${v.what}: ${formatRatio(v.ratio)}${v.target === '-' ? '' : ` (target ${v.target})`}\n`);
  }
}

main().then(
  () => process.exit(0),
  (err: Error) => {
    process.stderr.write(`heap: ${err.stack ?? err.message}\n`);
    process.exit(1);
  },
);
