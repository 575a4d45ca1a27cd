/**
 * The I/O budget: 32 sandboxes start at once, each on its own cold layer
 * (an archive not yet unpacked on this machine), with and without the
 * store's budget on concurrent unpacking. Measured in one run: the time
 * until every sandbox has run its first command, and the median.
 *
 *   node dist/benchmarks/budget.js [--sandboxes N] [--files N] [--max-concurrent N] [--json]
 */
import { cpSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Sandbox } from '../lib/index.js';
import { packDirectory } from '../lib/files/index.js';
import { openStore } from '../lib/layers/index.js';
import { formatBytes, formatMs, formatRatio } from '../lib/format.js';
import { count, flag, readArgs } from './lib/args.js';
import { summarize } from './lib/stats.js';

const log = (msg: string) => process.stderr.write(`[bench] ${msg}\n`);

/** A tree shaped like a small venv: many small .py files in packages. */
function makeTree(dir: string, files: number): void {
  const body = 'def f(x):\n    return x * 2\n\n'.repeat(40);
  for (let i = 0; i < files; i++) {
    const pkg = join(dir, `pkg${i % 40}`, `sub${i % 7}`);
    mkdirSync(pkg, { recursive: true });
    writeFileSync(join(pkg, `mod${i}.py`), `# module ${i}\n${body}`);
  }
}

async function startAll(archives: string[], storeRoot: string, budget: { maxConcurrent: number } | false): Promise<number[]> {
  const store = await openStore({ root: storeRoot, budget, dedup: false });
  const t0 = performance.now();
  const done = await Promise.all(
    archives.map(async (archive) => {
      const layer = await store.addArchive(archive);
      const sb = await Sandbox.create({ overlays: [{ target: '/env', lower: [layer.path] }], capabilities: ['CAP_DAC_OVERRIDE'] });
      try {
        const r = await sb.exec(['sh', '-c', 'ls /env | wc -l']);
        if (r.exitCode !== 0) throw new Error(`first command failed: ${r.stderr}`);
        return performance.now() - t0;
      } finally {
        await sb.close();
      }
    }),
  );
  return done;
}

async function main(): Promise<void> {
  const o = readArgs('usage: node dist/benchmarks/budget.js [--sandboxes N] [--files N] [--max-concurrent N] [--json]', {
    sandboxes: count(32),
    files: count(1500),
    // Default: the store's own default budget (2 x CPUs unpacks, 2 GiB in flight).
    'max-concurrent': count(2 * cpus().length),
    json: flag(),
  });
  const n = o.sandboxes;
  const files = o.files;
  const maxConcurrent = o['max-concurrent'];
  const work = mkdtempSync(join(tmpdir(), 'msbx-budget-bench-'));
  try {
    log(`making ${n} distinct archives of ${files} files each`);
    const base = join(work, 'base');
    makeTree(base, files);
    const archives: string[] = [];
    for (let i = 0; i < n; i++) {
      const tree = join(work, `tree-${i}`);
      cpSync(base, tree, { recursive: true });
      writeFileSync(join(tree, 'MARKER'), `${i}\n`); // a distinct digest: every layer is cold
      const archive = join(work, `layer-${i}.tar.zst`);
      await packDirectory(tree, archive);
      rmSync(tree, { recursive: true });
      archives.push(archive);
    }
    const bytes = archives.reduce((s, a) => s + statSync(a).size, 0);
    // ABBA order: this VM's ext4 drifts by a factor of 3 between minutes,
    // so each variant runs twice, before and after the other.
    const runs: Record<string, number[][]> = { 'no budget': [], budget: [] };
    const order = [['no budget', false], ['budget', { maxConcurrent }], ['budget', { maxConcurrent }], ['no budget', false]] as const;
    for (const [k, [label, budget]] of order.entries()) {
      log(`${n} sandboxes at once, ${label} (round ${k + 1}/${order.length})`);
      const root = join(work, `store-${k}`);
      runs[label]!.push(await startAll(archives, root, budget));
      rmSync(root, { recursive: true, force: true }); // the next round is cold too
    }
    const results: Record<string, ReturnType<typeof summarize> & { totalMs: number }> = {};
    for (const [label, rounds] of Object.entries(runs)) {
      const totals = rounds.map((t) => Math.max(...t));
      results[label] = { ...summarize(rounds.flat()), totalMs: totals.reduce((a, b) => a + b, 0) / totals.length };
    }
    if (o.json) {
      process.stdout.write(JSON.stringify({ sandboxes: n, filesPerLayer: files, archiveBytes: bytes, results }, null, 2) + '\n');
      return;
    }
    const a = results['no budget']!;
    const b = results['budget']!;
    process.stdout.write(
      [
        `${n} sandboxes started at once, each on its own cold layer (${files} files; ${formatBytes(bytes / n)} .tar.zst each), ${cpus().length} CPUs`,
        `  no budget : all done in ${formatMs(a.totalMs)} (mean of 2 rounds), median sandbox ready at ${formatMs(a.median)}`,
        `  budget    : all done in ${formatMs(b.totalMs)} (mean of 2 rounds), median sandbox ready at ${formatMs(b.median)} (at most ${maxConcurrent} unpacks at once)`,
        `  all 32 ready, without / with budget = ${formatRatio(a.totalMs / b.totalMs)}: ${b.totalMs < a.totalMs ? 'the budget finishes sooner' : 'the budget does NOT finish the whole batch sooner here'}`,
        `  median sandbox ready, without / with budget = ${formatRatio(a.median / b.median)}: ${b.median < a.median ? 'the typical sandbox is ready sooner with the budget' : 'the typical sandbox is NOT ready sooner with the budget'}`,
      ].join('\n') + '\n',
    );
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  process.exitCode = 1;
});
