/**
 * Start-to-exit latency of `/usr/bin/true` in full isolation, measured from
 * Node, for MiniSandbox against bubblewrap and Docker (plus a plain
 * child_process spawn as the floor). Usage:
 *
 *   node dist/benchmarks/spawn.js [--iterations N] [--docker-iterations N]
 *                                 [--warmup N] [--no-docker] [--json]
 *
 * Progress goes to stderr, results to stdout (a table, or JSON with --json).
 */
import { spawn as spawnChild } from 'node:child_process';
import { lstatSync, readlinkSync } from 'node:fs';
import { cpus, loadavg, release } from 'node:os';
import { performance } from 'node:perf_hooks';
import { policy, run } from '../lib/index.js';
import { HOST_IMAGE, dockerCommand, ensureDocker, hostImagePaths, importImage, stopDocker } from './lib/docker.js';
import { count, flag, readArgs } from './lib/args.js';
import { aptInstall, lastLines, which } from './lib/proc.js';
import { formatMs, formatRatio, formatTable } from '../lib/format.js';
import { summarize, timePair, type Summary } from './lib/stats.js';

const TRUE = '/usr/bin/true';
const IMAGE = HOST_IMAGE;
const TARGET_VS_BWRAP = 1.0; // MiniSandbox median / bwrap median must be <= this
const TARGET_DOCKER_VS = 50; // docker median / MiniSandbox median must be >= this
const TARGET_FILTER_COST = 1.1; // default (seccomp) median / seccomp 'none' median must be <= this

interface Options {
  iterations: number;
  dockerIterations: number;
  warmup: number;
  docker: boolean;
  json: boolean;
}

interface Result {
  name: string;
  command: string;
  status: 'ok' | 'skipped';
  reason?: string;
  summary?: Summary;
  samples?: number[];
}

const USAGE = 'usage: node dist/benchmarks/spawn.js [--iterations N] [--docker-iterations N] [--warmup N] [--no-docker] [--json]';

function parseOptions(): Options {
  const v = readArgs(USAGE, { iterations: count(200), 'docker-iterations': count(20), warmup: count(10), 'no-docker': flag(), json: flag() });
  return { iterations: v.iterations, dockerIterations: v['docker-iterations'], warmup: v.warmup, docker: !v['no-docker'], json: v.json };
}

const log = (msg: string) => process.stderr.write(`[bench] ${msg}\n`);

/**
 * Spawn and wait until the process exited and its output pipes closed, which
 * is what `run()` waits for too; stdin ignored and stdout/stderr piped, as in
 * `run()`, so every contender pays the same stdio cost.
 */
function runCommand(file: string, args: readonly string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawnChild(file, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stdout.resume();
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('error', reject);
    child.on('close', (code, signal) =>
      code === 0 ? resolve() : reject(new Error(`${file} exited ${code ?? signal}: ${lastLines(stderr)}`)),
    );
  });
}

/** Warm-up runs (page cache, JIT, lazy kernel setup) are discarded; each sample is one sequential run. */
async function measure(name: string, fn: () => Promise<void>, iterations: number, warmup: number): Promise<number[]> {
  log(`${name}: ${warmup} warm-up + ${iterations} timed runs`);
  for (let i = 0; i < warmup; i++) await fn();
  const samples: number[] = [];
  for (let i = 0; i < iterations; i++) {
    const t0 = performance.now();
    await fn();
    samples.push(performance.now() - t0);
  }
  return samples;
}

function ok(name: string, command: string, samples: number[]): Result {
  return { name, command, status: 'ok', summary: summarize(samples), samples };
}

/**
 * The same root MiniSandbox builds by default, from the same policy lists:
 * host dirs and /etc entries bound read-only, symlinks (merged /usr) kept as
 * symlinks. Only the /proc masking and MiniSandbox's own /etc/hosts and
 * /etc/hostname have no counterpart here.
 */
function bwrapArgs(): string[] {
  const mirror = (path: string): string[] => {
    try {
      const st = lstatSync(path);
      return st.isSymbolicLink() ? ['--symlink', readlinkSync(path), path] : ['--ro-bind', path, path];
    } catch {
      return []; // missing on this host: MiniSandbox skips it too
    }
  };
  return [
    '--unshare-all', '--die-with-parent', '--new-session',
    ...policy.HOST_ROOT_DIRS.flatMap((dir) => mirror(dir)),
    ...policy.HOST_ETC_ENTRIES.flatMap((entry) => mirror(`/etc/${entry}`)),
    '--proc', '/proc', '--dev', '/dev', '--tmpfs', '/tmp', '--tmpfs', '/work', '--chdir', '/work',
    TRUE,
  ];
}

async function benchFloor(o: Options): Promise<Result> {
  return ok('child_process.spawn (floor)', TRUE, await measure('floor', () => runCommand(TRUE, []), o.iterations, o.warmup));
}

/**
 * The defaults against the same without the seccomp filter, in ABBA order:
 * what the filter costs a spawn, measured in one run.
 */
async function benchMiniSandbox(o: Options): Promise<[Result, Result]> {
  const once = (seccomp: 'default' | 'none') => async () => {
    const r = await run({ argv: [TRUE], seccomp });
    if (r.exitCode !== 0) throw new Error(`MiniSandbox run exited ${r.exitCode ?? r.signal}: ${r.stderr}`);
  };
  log(`MiniSandbox, with and without the seccomp filter: ${o.warmup} warm-up + ${o.iterations} timed runs each, ABBA`);
  const [withFilter, without] = await timePair(o.iterations, o.warmup, once('default'), once('none'));
  return [
    ok('MiniSandbox run()', `run({ argv: ['${TRUE}'] })`, withFilter),
    ok("MiniSandbox run(), seccomp 'none'", `run({ argv: ['${TRUE}'], seccomp: 'none' })`, without),
  ];
}

async function benchBwrap(o: Options): Promise<Result> {
  const name = 'bubblewrap';
  let bwrap = which('bwrap');
  if (!bwrap) {
    const err = await aptInstall(['bubblewrap'], log);
    bwrap = which('bwrap');
    if (!bwrap) return skipped(name, 'bwrap', `bwrap missing and ${err ?? 'not found after install'}`);
  }
  const args = bwrapArgs();
  const command = `bwrap ${args.join(' ')}`;
  try {
    // A bwrap failure (e.g. user namespaces disabled) is a skip with its own message.
    return ok(name, command, await measure(name, () => runCommand(bwrap, args), o.iterations, o.warmup));
  } catch (err) {
    return skipped(name, command, describe(err));
  }
}

/**
 * Last, so a dockerd idling in the background cannot perturb the other
 * measurements. Any Docker problem becomes a skip with its reason.
 */
async function benchDocker(o: Options): Promise<Result> {
  const name = 'docker run';
  const runArgs = ['run', '--rm', '--network', 'none', IMAGE, TRUE];
  if (!o.docker) return skipped(name, `docker ${runArgs.join(' ')}`, 'disabled with --no-docker');
  let handle;
  try {
    handle = await ensureDocker(log);
  } catch (err) {
    return skipped(name, `docker ${runArgs.join(' ')}`, describe(err));
  }
  try {
    await importImage(handle, IMAGE, hostImagePaths(), log);
    const [file, args] = dockerCommand(handle, runArgs);
    const command = `${file} ${args.join(' ')}`;
    const warmup = Math.min(o.warmup, 3); // each run costs hundreds of ms
    const samples = await measure(name, () => runCommand(file, args), o.dockerIterations, warmup);
    return ok(`${name} (engine ${handle.serverVersion})`, command, samples);
  } catch (err) {
    return skipped(name, `docker ${runArgs.join(' ')}`, describe(err));
  } finally {
    await stopDocker(handle, log);
  }
}

function describe(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

function skipped(name: string, command: string, reason: string): Result {
  log(`skipping ${name}: ${reason}`);
  return { name, command, status: 'skipped', reason };
}

interface Verdict {
  ratio: number | null;
  target: string;
  pass: boolean | null;
  text: string;
}

function verdict(label: string, num: Result, den: Result, target: number, cmp: '<=' | '>='): Verdict {
  const targetText = `${cmp} ${target}`;
  if (!num.summary || !den.summary) {
    const missing = [num, den].filter((r) => !r.summary).map((r) => r.name).join(', ');
    return { ratio: null, target: targetText, pass: null, text: `${label}: n/a (${missing} skipped)` };
  }
  const ratio = num.summary.median / den.summary.median;
  const pass = cmp === '<=' ? ratio <= target : ratio >= target;
  return {
    ratio,
    target: targetText,
    pass,
    text: `${label} = ${formatRatio(ratio)} (target ${targetText}): ${pass ? 'PASS' : 'FAIL'}`,
  };
}

async function main(): Promise<void> {
  const o = parseOptions();
  const floor = await benchFloor(o);
  const [mini, noFilter] = await benchMiniSandbox(o);
  const bwrap = await benchBwrap(o);
  const docker = await benchDocker(o);
  const results = [floor, mini, noFilter, bwrap, docker];

  const verdicts = {
    filterCost: verdict("MiniSandbox median / MiniSandbox seccomp 'none' median", mini, noFilter, TARGET_FILTER_COST, '<='),
    minisandboxOverBwrap: verdict('MiniSandbox median / bwrap median', mini, bwrap, TARGET_VS_BWRAP, '<='),
    dockerOverMinisandbox: verdict('docker median / MiniSandbox median', docker, mini, TARGET_DOCKER_VS, '>='),
  };
  // Load average at the end: on a shared machine it explains noisy runs.
  const environment = {
    node: process.version,
    kernel: release(),
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model ?? '',
    loadavg: loadavg().map((x) => Math.round(x * 100) / 100),
  };

  if (o.json) {
    const round = (x: number) => Math.round(x * 1000) / 1000;
    const out = {
      environment,
      options: o,
      results: results.map((r) => ({ ...r, samples: r.samples?.map(round) })),
      ratios: verdicts,
    };
    console.log(JSON.stringify(out, null, 2));
    return;
  }

  console.log(`\nstart-to-exit latency of ${TRUE}, measured from Node (ms)`);
  console.log(`node ${environment.node}, kernel ${environment.kernel}, ${environment.cpus} CPUs (${environment.cpuModel}), load ${environment.loadavg.join(' ')}\n`);
  const rows = [['', 'n', 'median', 'p95', 'mean', 'min', 'max']];
  for (const r of results) {
    const s = r.summary;
    rows.push(s ? [r.name, String(s.n), ...[s.median, s.p95, s.mean, s.min, s.max].map(formatMs)] : [r.name, 'skipped', '', '', '', '', '']);
  }
  console.log(formatTable(rows));
  for (const r of results.filter((x) => x.status === 'skipped')) console.log(`\n${r.name} skipped: ${r.reason}`);
  console.log('');
  for (const v of Object.values(verdicts)) console.log(v.text);
  console.log('\ncommands:');
  for (const r of results) console.log(`  ${r.name}: ${r.command}`);
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.stack : err);
  process.exit(1);
});
