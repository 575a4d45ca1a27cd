/**
 * The benchmark suite (benchmarks/suite): its writers on the samples of a
 * tiny real run (the demo workload, extract and layers, N = 1, 2, no
 * Docker), and its cleanup when interrupted.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { findPython } from '../../lib/env/python.js';
import { removeTree } from '../../lib/files/fsTree.js';
import { renderCharts } from '../../benchmarks/suite/charts.js';
import { parseOptions, parseTimed, rolloutSteps, runSuite, timed } from '../../benchmarks/suite/main.js';
import { cpuTimes, settle } from '../../benchmarks/suite/quiet.js';
import { renderReport, writeResults } from '../../benchmarks/suite/report.js';
import { judgeBars, scalingRows, setupSpread, type SuiteResults } from '../../benchmarks/suite/results.js';

const root = path.resolve(import.meta.dirname, '../..');
const compiled = path.join(root, 'dist/benchmarks/suite/main.js');
// The demo tasks run offline: their tests need a base Python with pytest.
const python = findPython({ version: '3.11', modules: ['pytest'] });

describe.skipIf(!python)('benchmark suite, a tiny real run (demo workload, no Docker)', () => {
  const dir = mkdtempSync(path.join(tmpdir(), 'msbx-suite-test-'));
  let results: SuiteResults;
  let files: string[];

  beforeAll(async () => {
    const o = { ...parseOptions(['--workload', 'demo', '--no-docker', '--methods', 'docker,layers,extract', '--scale', '2,1', '--repeat', '1', '--tasks', '2', '--cold-tasks', '1']), cacheDir: path.join(dir, 'cache'), out: path.join(dir, 'out') };
    results = await runSuite(o, new AbortController().signal);
    files = await writeResults(o.out, results);
  }, 240_000);
  afterAll(() => removeTree(dir));

  it('keeps every raw sample and the machine', () => {
    const json = JSON.parse(readFileSync(path.join(dir, 'out', 'results.json'), 'utf8')) as SuiteResults;
    expect(json.methods).toEqual(['extract', 'layers']);
    expect(json.skipped).toMatchObject({ docker: '--no-docker' });
    expect(json.skipped.image).toBeUndefined();
    // 2 tasks x 1 repeat x 2 methods warm starts; one cold (layers: build into an empty store).
    expect(json.setup.filter((s) => s.kind === 'warm')).toHaveLength(4);
    expect(json.setup.filter((s) => s.kind === 'cold').map((s) => s.method)).toEqual(['layers']);
    expect(json.scaling.map((s) => [s.method, s.n, s.failures]).sort()).toEqual([['extract', 1, 0], ['extract', 2, 0], ['layers', 1, 0], ['layers', 2, 0]]);
    expect(json.scaling.find((s) => s.n === 2)!.perEnvMs).toHaveLength(2);
    expect(json.rollout).toHaveLength(4);
    for (const r of json.rollout) {
      expect(r.steps).toBe(30);
      expect(r.failedSteps).toBe(0);
      // The demo's tests fail at base_commit (the bug is there): a result, not an error.
      expect(r.testExitCode).not.toBeNull();
      expect(r.stepsInnerMs).toBeGreaterThan(0);
      expect(r.stepsWallMs).toBeGreaterThanOrEqual(r.stepsInnerMs);
    }
    expect(json.latency.map((l) => `${l.method} ${l.kind}`).sort()).toEqual(['extract exec', 'extract step', 'layers exec', 'layers step']);
    expect(json.disk.set.layers!.bytes).toBeGreaterThan(0);
    expect(json.disk.set.extract!.bytes).toBeGreaterThan(0);
    // An extract instance is a private copy of the venv and the repository; a layers instance only its upper.
    expect(json.disk.perInstance.extract!).toBeGreaterThan(json.disk.perInstance.layers!);
    expect(json.machine.cpus).toBeGreaterThan(0);
    expect(json.machine.kernel).toMatch(/^\d+\./);
    expect(json.machine.loadEnd).toHaveLength(3);
  });

  it('judges the bars it can, and says why not the others', () => {
    const byName = new Map(results.bars.map((b) => [b.name, b]));
    expect(byName.get('warm setup, layers / docker')).toMatchObject({ ok: undefined, note: expect.stringContaining('--no-docker') });
    expect(byName.get('layers: N=2 at once without failure')).toMatchObject({ ok: true, value: '0 failures' });
    // Measured to N=2 only: a growth figure, but no verdict on the bar (N=256).
    expect(byName.get('layers: per-environment setup (all ready / N), N=2 / N=1')).toMatchObject({ note: expect.stringContaining('N=256') });
    expect(byName.get('layers: per-environment setup (all ready / N), N=2 / N=1')!.ok).not.toBe(true);
    // With a Docker figure in the same results, the ratios get verdicts: here
    // the layers samples stand in for Docker's at 100x their time.
    const withDocker = { ...results, methods: [...results.methods, 'docker' as const], skipped: {} };
    withDocker.setup = [...results.setup, ...results.setup.filter((s) => s.method === 'layers' && s.kind === 'warm').map((s) => ({ ...s, method: 'docker' as const, ms: s.ms * 100 }))];
    const bar = judgeBars(withDocker).find((b) => b.name === 'warm setup, layers / docker')!;
    expect(bar.ok).toBe(true);
    expect(bar.value).toBe('1.00%');
  });

  it('writes a report with the paper\'s rows and the figures of the samples', () => {
    const report = readFileSync(path.join(dir, 'out', 'report.md'), 'utf8');
    for (const heading of ['## The bars', '## Environment preparation', '## Disk', '## Scaling', '## Agent-like rollout', '## Per-command latency', '## Charts']) expect(report).toContain(heading);
    expect(report).toContain('~25%');
    expect(report).toContain('~5% SWE-smith, ~15% SWE-bench Verified');
    const warm = setupSpread(results, 'layers', 'warm');
    expect(report).toContain(`| layers | ${(warm.median).toFixed(warm.median < 10 ? 2 : warm.median < 100 ? 1 : 0)} ms`);
    expect(scalingRows(results, 'layers').map((r) => r.n)).toEqual([1, 2]);
    expect(report).toContain('![scaling.svg](scaling.svg)');
    expect(renderReport(results, [])).not.toContain('## Charts');
  });

  it('draws valid SVG charts with the expected series', () => {
    expect(files.map((f) => path.basename(f)).sort()).toEqual(['eval.svg', 'latency.svg', 'report.md', 'results.json', 'scaling.svg', 'setup.svg']);
    const svg = (name: string) => readFileSync(path.join(dir, 'out', name), 'utf8');
    for (const name of ['setup.svg', 'scaling.svg', 'latency.svg', 'eval.svg']) {
      const text = svg(name);
      expect(text.startsWith('<svg')).toBe(true);
      expect(text.trimEnd().endsWith('</svg>')).toBe(true);
      // Well-formed: xmllint (libxml2) reads it without an error.
      const lint = spawnSync('xmllint', ['--noout', '-'], { input: text, encoding: 'utf8' });
      if (lint.error === undefined) expect(lint.status, lint.stderr).toBe(0);
    }
    // Series appear as legend or axis labels (<text> elements).
    const labels = (name: string) => [...svg(name).matchAll(/<text[^>]*>([^<]*)<\/text>/g)].map((m) => m[1]);
    expect(labels('scaling.svg')).toEqual(expect.arrayContaining(['extract', 'layers']));
    expect(labels('setup.svg')).toEqual(expect.arrayContaining(['extract', 'layers', 'warm', 'cold']));
    expect(labels('latency.svg')).toEqual(expect.arrayContaining(['layers exec', 'layers session.run', 'extract exec', 'extract session.run']));
    expect(labels('eval.svg')).toEqual(expect.arrayContaining(['setup', 'commands', 'step overhead', 'tests', 'teardown']));
    expect(labels('scaling.svg')).not.toContain('docker');
  });

  it('renders no chart for data it does not have', async () => {
    const charts = await renderCharts({ ...results, methods: [], latency: [], setup: [], scaling: [], rollout: [] });
    expect([...charts.keys()]).toEqual([]);
  });
});

describe('benchmark suite helpers', () => {
  it('times a command inside bash, and reads the time back', () => {
    const r = spawnSync('bash', ['-c', timed('sleep 0.2; false')], { encoding: 'utf8' });
    const t = parseTimed(r.stdout)!;
    expect(t.exitCode).toBe(1);
    expect(t.innerMs).toBeGreaterThan(190);
    expect(t.innerMs).toBeLessThan(2000);
    expect(parseTimed('no marker')).toBeUndefined();
  });

  it('reads busy and total CPU time from /proc/stat, iowait counted busy', () => {
    const stat = 'cpu  100 5 50 1000 20 3 2 7 40 0\ncpu0 50 2 25 500 10 1 1 3 20 0\nintr 1 2\n';
    // user nice system idle iowait irq softirq steal: guest (40) is inside user already.
    expect(cpuTimes(stat)).toEqual({ busy: 187, total: 1187 });
    expect(() => cpuTimes('intr 1\n')).toThrow(/no "cpu " line/);
    const now = cpuTimes(readFileSync('/proc/stat', 'utf8'));
    expect(now.total).toBeGreaterThan(now.busy);
  });

  it('waits for a quiet machine, and gives up on a busy one', async () => {
    // Both CPUs kept busy by two spinning processes: never quiet.
    const spinners = [0, 1].map(() => spawn('sh', ['-c', 'while :; do :; done']));
    try {
      await new Promise((r) => setTimeout(r, 100));
      const q = await settle({ threshold: 0.3, windowMs: 50, maxMs: 400 });
      expect(q.quiet).toBe(false);
      expect(q.waitedMs).toBeGreaterThanOrEqual(400);
      expect(q.waitedMs).toBeLessThan(2000);
    } finally {
      for (const s of spinners) s.kill('SIGKILL');
    }
  });

  it('makes 30 agent steps', () => {
    const steps = rolloutSteps("src/it's.py");
    expect(steps).toHaveLength(30);
    expect(steps.filter((s) => s.startsWith('sed -i'))).toHaveLength(2);
    expect(steps.some((s) => s.startsWith('git diff'))).toBe(true);
    expect(steps).toContain(`cat 'src/it'\\''s.py'`);
  });

  it('reads its options, and refuses bad ones', () => {
    expect(parseOptions(['--quick'])).toMatchObject({ quick: true, workload: 'quick', scale: [1, 8], repeat: 2 });
    expect(parseOptions([])).toMatchObject({ workload: 'full', scale: [1, 8, 32, 128, 256], repeat: 3, docker: true, methods: ['docker', 'extract', 'layers', 'image'] });
    expect(() => parseOptions(['--methods', 'docker,lxc'])).toThrow(/unknown method "lxc"/);
    expect(() => parseOptions(['--repeat', '0'])).toThrow(/--repeat needs a positive integer/);
    expect(() => parseOptions(['--workload', 'huge'])).toThrow(/--workload must be full, quick or demo/);
  });
});

/** Pids of every descendant of `pid`, with their start times (to tell a reused pid). */
function descendants(pid: number): Map<number, string> {
  const children = new Map<number, number[]>();
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = readFileSync(`/proc/${e}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), Number(e)]);
    } catch {
      // gone meanwhile
    }
  }
  const out = new Map<number, string>();
  const visit = (p: number) => {
    for (const c of children.get(p) ?? []) {
      try {
        const stat = readFileSync(`/proc/${c}/stat`, 'utf8');
        out.set(c, stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19]!);
      } catch {
        continue;
      }
      visit(c);
    }
  };
  visit(pid);
  return out;
}

function alive(pid: number, start: string): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return rest[19] === start && rest[0] !== 'Z';
  } catch {
    return false;
  }
}

function dockerWorks(): boolean {
  const r = spawnSync('docker', ['info', '--format', '{{.ServerVersion}}'], { encoding: 'utf8', timeout: 15_000 });
  return r.status === 0;
}

function comm(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
  } catch {
    return '';
  }
}

function named(pid: number): string {
  try {
    return `${pid} (${readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim().slice(0, 120)})`;
  } catch {
    return String(pid);
  }
}

describe.skipIf(!python || !existsSync(compiled))('benchmark suite, interrupted', () => {
  // Two moments: while the env builds run sandboxes of the library's (in its
  // default state dir, not the suite's), and mid-rollout with the suite's
  // own instances, docker CLIs and session shells open.
  it.each([
    ['while preparing the MiniSandbox side', /preparing the MiniSandbox side/],
    ['mid-rollout', /\] rollout \w+ \S+: steps /],
  ])('removes every container and sandbox it made on SIGINT %s', async (_when, moment) => {
    const dir = mkdtempSync(path.join(tmpdir(), 'msbx-suite-int-'));
    // Docker's part of the check needs an engine this user may use (root
    // here; msbx-ci is not in the docker group): without one, sandboxes only.
    const withDocker = dockerWorks();
    const methods = withDocker ? 'docker,layers,extract' : 'layers,extract';
    const tmp = path.join(dir, 'tmp');
    mkdirSync(tmp);
    try {
      const child = spawn(process.execPath, [compiled, '--workload', 'demo', '--methods', methods, '--scale', '8', '--repeat', '2', '--cache', path.join(dir, 'cache'), '--out', path.join(dir, 'out'), ...(withDocker ? [] : ['--no-docker'])], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, TMPDIR: tmp } });
      let stderr = '';
      const seen = new Map<number, string>();
      const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
      child.stdout.resume();
      await new Promise<void>((resolve, reject) => {
        child.stderr.setEncoding('utf8').on('data', (s: string) => {
          stderr += s;
          if (moment.test(stderr)) resolve();
        });
        void exited.then(() => reject(new Error(`the suite ended before the moment ${moment}: ${stderr}`)));
      });
      // Sample the suite's process tree (its sandboxes, msbx-init and their
      // children, and docker CLIs) until a sandbox is seen, then a moment more.
      let sampled = 0;
      for (let i = 0; i < 300 && sampled < 10; i++) {
        for (const [p, s] of descendants(child.pid!)) seen.set(p, s);
        if (sampled || [...seen.keys()].some((p) => comm(p) === 'msbx-init')) sampled++;
        await new Promise((r) => setTimeout(r, 30));
      }
      expect(sampled, `no sandbox seen: ${stderr}`).toBe(10);
      child.kill('SIGINT');
      expect(await exited).toBe(130);
      expect(stderr).toContain('SIGINT: stopping');
      expect(stderr).toContain('cleaned up');
      expect(stderr).not.toContain('benchmark suite failed');
      const left = [...seen].filter(([p, s]) => alive(p, s));
      expect(left, `still running: ${left.map(([p]) => named(p)).join(', ')}`).toEqual([]);
      if (withDocker) {
        const ps = spawnSync('docker', ['ps', '-aq', '--filter', 'label=msbx-suite=runner'], { encoding: 'utf8' });
        expect(ps.stdout.trim()).toBe('');
      }
      // Its temp dir (sandbox state, extracted copies, cold stores) is gone too.
      // (minisandbox-<uid> is the library's shared state dir, used by the
      // env builds of prepare: no sandbox of the suite's may be left in it.)
      expect(readdirSync(tmp).filter((e) => !/^minisandbox-\d+$/.test(e))).toEqual([]);
      for (const e of readdirSync(tmp)) expect(readdirSync(path.join(tmp, e)).filter((x) => x.startsWith('sbx'))).toEqual([]);
    } finally {
      await removeTree(dir);
    }
  }, 300_000);
});
