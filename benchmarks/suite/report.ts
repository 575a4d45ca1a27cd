/**
 * The suite's output folder: results.json (every raw sample and the
 * machine), report.md (the paper's rows beside ours, the bars with their
 * verdicts) and the SVG charts (charts.ts), linked from the report.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { formatBytes, formatMs, formatTable } from '../../lib/format.js';
import { renderCharts } from './charts.js';
import type { MethodName } from './methods.js';
import { evalParts, scalingRows, setupSpread, spread, stepOverheads, type Spread, type SuiteResults } from './results.js';

/** What the paper claims, row by row (MiniSandbox's paper, "extract" is its method). */
export const PAPER_CLAIMS = {
  disk: 'about 5% of the image pipeline (SWE-smith), 15% (SWE-bench Verified)',
  setup: 'about 25% of Docker\'s environment preparation time',
  scaling: 'near-linear to 256 parallel environments per node',
  rollout: 'rollout and reward time dominated by the commands, not the sandbox',
} as const;

const fmtSpread = (s: Spread) => (s.n ? `${formatMs(s.median)} (p95 ${formatMs(s.p95)}, n=${s.n})` : '-');
const ratio = (a: number, b: number) => (Number.isFinite(a / b) && b > 0 ? `${((a / b) * 100).toFixed(a / b < 0.1 ? 2 : 1)}%` : '-');
const verdict = (ok: boolean | undefined) => (ok === undefined ? 'n/a' : ok ? 'ok' : 'FAIL');

export function barsTable(r: Pick<SuiteResults, 'bars'>): string[][] {
  return [['bar', 'target', 'measured', 'verdict'], ...r.bars.map((b) => [b.name, b.target, b.value + (b.note ? ` (${b.note})` : ''), verdict(b.ok)])];
}

function mdTable(rows: string[][]): string {
  const [head, ...body] = rows;
  if (!head) return '';
  return [`| ${head.join(' | ')} |`, `|${head.map(() => '---').join('|')}|`, ...body.map((r) => `| ${r.join(' | ')} |`)].join('\n');
}

export function renderReport(r: SuiteResults, charts: string[]): string {
  const m = r.machine;
  const has = (x: MethodName) => r.methods.includes(x);
  const dockerWarm = setupSpread(r, 'docker', 'warm').median;
  const dockerCold = setupSpread(r, 'docker', 'cold').median;
  const out: string[] = [];
  out.push(`# MiniSandbox benchmark suite: ${r.workload.name} workload`, '');
  out.push(`${r.startedAt}, ${formatMs(r.durationMs)} in all. Machine: ${m.cpus} CPUs (${m.cpuModel}), ${formatBytes(m.memoryBytes)} RAM, Linux ${m.kernel}, Node ${m.node}, ${m.docker ? `Docker ${m.docker}` : 'no Docker'}, MiniSandbox ${m.minisandbox}, as ${m.user}; load ${m.loadStart.map((x) => x.toFixed(2)).join(' ')} at the start, ${m.loadEnd.map((x) => x.toFixed(2)).join(' ')} at the end.`, '');
  out.push(`Workload: ${r.workload.tasks} tasks, ${r.workload.envs} environments, ${r.workload.repos} repositories. Methods: ${r.methods.join(', ')}. Every figure is a median over the samples (n given) with its spread; ratios are to Docker in this same run, contenders interleaved (ABBA).`, '');
  const skipped = Object.entries(r.skipped);
  if (skipped.length) out.push('Not run:', '', ...skipped.map(([k, v]) => `- ${k}: ${v}`), '');

  out.push('## The bars', '', mdTable(barsTable(r)), '');

  out.push('## Environment preparation (nothing to first command ready, per task)', '');
  out.push(mdTable([
    ['method', 'warm', 'warm / docker', 'cold', 'cold / docker'],
    ...r.methods.map((x) => {
      const w = setupSpread(r, x, 'warm');
      const c = setupSpread(r, x, 'cold');
      return [x, fmtSpread(w), ratio(w.median, dockerWarm), fmtSpread(c), ratio(c.median, dockerCold)];
    }),
    ['paper (extract / docker)', '', '~25%', '', ''],
  ]), '');
  out.push("Warm: everything built and cached; an instance started and `true` run in it, right after an unmeasured start of the same method (the suite's Node forks the docker CLI and tar, which leaves it cold for the next start; not for extract, whose start is an unpack of most of a second that a second unpack just before would slow), on a quiet machine (each timed start waits, at most 2 s, until the CPUs are under 10% busy over 50 ms: Docker's teardown goes on after `docker rm` returns, and it is not the next start's cost). Cold: the task's own part built then, its environment already built and shared (a new task of a known environment): docker builds the instance image as SWE-bench does (FROM the env image, the repository cloned at base_commit into /testbed, --no-cache); layers builds the repository layer into an empty store. extract and image build nothing per instance: their warm figure is their cold one.", '');

  out.push('## Disk', '');
  const dSet = r.disk.set.docker?.bytes;
  out.push(mdTable([
    ['method', 'the whole set', '/ docker', 'per extra running instance', 'what is counted'],
    ...r.methods.map((x) => [x, r.disk.set[x] ? formatBytes(r.disk.set[x]!.bytes) : '-', dSet && r.disk.set[x] ? ratio(r.disk.set[x]!.bytes, dSet) : '-', r.disk.perInstance[x] !== undefined ? formatBytes(r.disk.perInstance[x]!) : '-', r.disk.set[x]?.what ?? '']),
    ...(r.disk.dockerWithoutBase !== undefined ? [['docker without the base image', formatBytes(r.disk.dockerWithoutBase), '', '', 'env and instance layers only'] as string[]] : []),
    ...(r.disk.dockerPerTaskImages !== undefined ? [['docker, one full image per task', formatBytes(r.disk.dockerPerTaskImages), '', '', 'no sharing: the per-task-image construction'] as string[]] : []),
    ['paper (extract / docker)', '', '~5% SWE-smith, ~15% SWE-bench Verified', '', ''],
  ]), '');
  if (r.disk.set.layers && r.disk.dockerPerTaskImages) out.push(`Layers against one full image per task: ${ratio(r.disk.set.layers.bytes, r.disk.dockerPerTaskImages)}.`, '');

  out.push('## Scaling (N environments started at once)', '');
  const scaleRows: string[][] = [['method', 'N', 'all ready', 'per environment (all ready / N)', 'growth from the first N', 'each one\'s start latency', 'failures', 'memory in use']];
  for (const x of r.methods) {
    const rows = scalingRows(r, x);
    for (const row of rows) scaleRows.push([x, String(row.n), fmtSpread(row.total), formatMs(row.perEnv.median), `${(row.perEnv.median / rows[0]!.perEnv.median).toFixed(2)}x`, fmtSpread(row.latency), String(row.failures), formatBytes(row.memoryBytes)]);
  }
  out.push(mdTable(scaleRows), '', `Per environment = the time until all N are ready divided by N: flat when scaling is linear. Each one's own latency grows with N here, as the N starts share ${r.machine.cpus} CPUs. Paper: ${PAPER_CLAIMS.scaling}.`, '');
  const errors = r.scaling.filter((s) => s.error);
  if (errors.length) out.push('First failures:', '', ...errors.slice(0, 5).map((s) => `- ${s.method} N=${s.n}: ${s.error}`), '');

  out.push('## Agent-like rollout (30 shell steps, then the test command)', '');
  const dStep = spread(stepOverheads(r, 'docker')).median;
  out.push(mdTable([
    ['method', 'rollout (30 steps)', 'of which sandbox overhead', 'overhead per step', '/ docker', 'reward (tests)', 'of which overhead', 'failed steps'],
    ...r.methods.flatMap((x) => {
      const s = r.rollout.filter((y) => y.method === x);
      if (!s.length) return [];
      const per = spread(stepOverheads(r, x));
      return [[x, fmtSpread(spread(s.map((y) => y.stepsWallMs))), formatMs(spread(s.map((y) => y.stepsWallMs - y.stepsInnerMs)).median), fmtSpread(per), ratio(per.median, dStep), fmtSpread(spread(s.map((y) => y.testWallMs))), formatMs(spread(s.map((y) => y.testWallMs - y.testInnerMs)).median), String(s.reduce((a, y) => a + y.failedSteps, 0))]];
    }),
  ]), '');
  out.push('Overhead = wall time seen by the caller minus the command\'s own time, measured by bash around the command inside the sandbox or container. Sandboxes run the steps with `session.run` in one bash session; Docker with one `docker exec` per step.', '');
  const parts = r.methods.map((x) => [x, evalParts(r, x)] as const).filter(([, p]) => p);
  if (parts.length) {
    const keys = Object.keys(parts[0]![1]!);
    out.push('Per-instance evaluation, medians:', '', mdTable([['method', ...keys, 'total'], ...parts.map(([x, p]) => [x, ...Object.values(p!).map(formatMs), formatMs(Object.values(p!).reduce((a, b) => a + b, 0))])]), '');
  }

  out.push('## Per-command latency (`true`)', '');
  out.push(mdTable([['method', 'exec (docker exec)', 'session.run'], ...r.methods.map((x) => {
    const e = r.latency.find((l) => l.method === x && l.kind === 'exec');
    const s = r.latency.find((l) => l.method === x && l.kind === 'step');
    return [x, e ? fmtSpread(spread(e.ms)) : '-', x === 'docker' ? '(docker exec)' : s ? fmtSpread(spread(s.ms)) : '-'];
  })]), '');

  if (charts.length) out.push('## Charts', '', ...charts.map((c) => `![${c}](${c})`), '');
  out.push('Raw samples: [results.json](results.json).', '');
  return out.join('\n');
}

/** Writes results.json, the charts and report.md into `dir`; returns the files written. */
export async function writeResults(dir: string, r: SuiteResults): Promise<string[]> {
  mkdirSync(dir, { recursive: true });
  const files: string[] = [];
  const write = (name: string, text: string) => {
    writeFileSync(path.join(dir, name), text);
    files.push(path.join(dir, name));
  };
  write('results.json', `${JSON.stringify(r, null, 1)}\n`);
  const charts = await renderCharts(r);
  for (const [name, svg] of charts) write(name, svg);
  write('report.md', renderReport(r, [...charts.keys()]));
  return files;
}

/** The bars as a plain text table for stdout. */
export function barsText(r: Pick<SuiteResults, 'bars'>): string {
  return formatTable(barsTable(r));
}
