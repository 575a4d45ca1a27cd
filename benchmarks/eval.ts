/**
 * Per-instance overhead of a SWE evaluation: MiniSandbox against Docker.
 *
 * Overhead = an evaluation's wall time minus the test command's own time
 * (measured by bash inside the sandbox/container around the command alone),
 * i.e. what the harness adds: environment start, patch writes, the three
 * apply steps, teardown. Both sides run the very same scripts
 * (lib/swe/pipeline/evalScript.ts) on the very same files:
 * - MiniSandbox: evaluate(): a fresh sandbox per evaluation, venv and repo
 *   layers stacked by overlay, the base Python bound read-only.
 * - Docker: one image per task made of the host files a MiniSandbox root
 *   shows (/usr, /bin, /lib*, part of /etc) + that task's venv and repo
 *   layers; per evaluation `docker run -d` (base Python bound read-only,
 *   --network none), `docker exec` for each step, `docker rm -f`, as
 *   SWE-bench's harness does with its instance images.
 *
 * Usage: node dist/benchmarks/eval.js [--rounds N] [--no-docker]
 */
import { mkdtempSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { removeTree } from '../lib/files/fsTree.js';
import { openStore } from '../lib/layers/store.js';
import * as policy from '../lib/sandbox/policy.js';
import { createDemoTaskSet } from '../lib/swe/demo/createDemoTaskSet.js';
import { evaluate } from '../lib/swe/pipeline/evaluate.js';
import { applyScript, APPLY_OK, parseTestTime, PATCH_FILE, TEST_PATCH_FILE, testPatchScript, testScript } from '../lib/swe/pipeline/evalScript.js';
import { prepareTasks } from '../lib/swe/pipeline/prepare.js';
import { TESTBED, type PreparedTask } from '../lib/swe/pipeline/types.js';
import type { Task } from '../lib/swe/tasks.js';
import { dockerCommand, DockerUnavailable, ensureDocker, importImage, stopDocker, type DockerHandle } from './lib/docker.js';
import { count, flag, readArgs } from './lib/args.js';
import { exec, execOk, type ExecResult } from './lib/proc.js';
import { formatMs, formatRatio, formatTable } from '../lib/format.js';
import { median } from './lib/stats.js';

const log = (msg: string) => process.stderr.write(`[eval-bench] ${msg}\n`);
const BASE_IMAGE = 'minisandbox-bench-swe-host';

interface Sample {
  totalMs: number;
  testCommandMs: number;
  overheadMs: number;
}

/** Host paths (relative to /) that a default MiniSandbox root shows. */
function hostPaths(): string[] {
  return [...policy.HOST_ROOT_DIRS.map((d) => d.slice(1)), ...policy.HOST_ETC_ENTRIES.map((e) => `etc/${e}`)];
}

async function existingPaths(paths: string[]): Promise<string[]> {
  const { lstat } = await import('node:fs/promises');
  const out: string[] = [];
  for (const p of paths) if (await lstat(`/${p}`).then(() => true, () => false)) out.push(p);
  return out;
}

async function benchMiniSandbox(tasks: Task[], prepared: Map<string, PreparedTask>, rounds: number, stateDir: string): Promise<Map<string, Sample[]>> {
  const samples = new Map<string, Sample[]>();
  for (let round = 0; round <= rounds; round++) {
    for (const task of tasks) {
      const r = await evaluate(task, task.patch, { prepared: prepared.get(task.instance_id)!, timeoutMs: 300_000, sandbox: { stateDir } });
      if (!r.reward.resolved || r.timings.testCommandMs === undefined) throw new Error(`minisandbox: ${task.instance_id} not resolved: ${r.reward.reason} ${r.error ?? ''}`);
      if (round === 0) continue; // warm-up: first .pyc compile, page cache
      const list = samples.get(task.instance_id) ?? [];
      list.push({ totalMs: r.timings.totalMs, testCommandMs: r.timings.testCommandMs, overheadMs: r.timings.totalMs - r.timings.testCommandMs });
      samples.set(task.instance_id, list);
    }
  }
  return samples;
}

/** Runs the docker CLI; throws with its stderr on failure unless allowFail. */
function docker(h: DockerHandle, args: string[], input?: string, allowFail = false): Promise<ExecResult> {
  const [file, fullArgs] = dockerCommand(h, args);
  const opts = input === undefined ? {} : { input };
  return allowFail ? exec(file, fullArgs, opts) : execOk(file, fullArgs, { ...opts, what: `docker ${args.slice(0, 2).join(' ')}` });
}

/** One image per task: host files + the task's venv and repo layers at their sandbox paths. */
async function buildTaskImage(h: DockerHandle, task: Task, p: PreparedTask, storeRoot: string): Promise<string> {
  const image = `minisandbox-bench-swe:${task.instance_id.toLowerCase().replace(/[^a-z0-9_.-]/g, '-')}-${p.env!.repoDigest!.slice(0, 12)}`;
  const inspect = dockerCommand(h, ['image', 'inspect', image]);
  if ((await exec(inspect[0], inspect[1], { timeoutMs: 30_000 })).code === 0) return image;
  const store = await openStore({ root: storeRoot });
  const venv = await store.get(p.env!.venvDigest!);
  const repo = await store.get(p.env!.repoDigest!);
  if (!venv || !repo) throw new Error(`${task.instance_id}: layers not in the store`);
  // docker cp needs existing parent dirs: stage both trees at their final
  // paths and copy the staging root over / in one go.
  const staging = mkdtempSync(join(tmpdir(), 'minisandbox-eval-image-'));
  const id = (await docker(h, ['create', BASE_IMAGE, '/bin/true'])).stdout.trim();
  try {
    for (const [layer, target] of [[venv, p.env!.venvPath], [repo, TESTBED]] as const) {
      await mkdir(join(staging, target), { recursive: true });
      await execOk('cp', ['-a', `${layer.path}/.`, join(staging, target)], { timeoutMs: 300_000 });
    }
    await docker(h, ['cp', `${staging}/.`, `${id}:/`]);
    await docker(h, ['commit', id, image]);
  } finally {
    await docker(h, ['rm', '-f', id]);
    await removeTree(staging);
  }
  return image;
}

async function dockerEvaluate(h: DockerHandle, task: Task, p: PreparedTask, image: string): Promise<Sample> {
  const t0 = performance.now();
  const py = p.env!.python.prefix;
  const env = ['-e', `PATH=${p.env!.venvPath}/bin:${policy.DEFAULT_PATH}`, '-e', `VIRTUAL_ENV=${p.env!.venvPath}`, '-e', 'HOME=/root', '-e', 'LANG=C.UTF-8'];
  const bind = py.startsWith('/usr/') ? [] : ['-v', `${py}:${py}:ro`];
  const id = (await docker(h, ['run', '-d', '--network', 'none', '--tmpfs', '/tmp', ...bind, ...env, '-w', TESTBED, image, 'sleep', 'infinity'])).stdout.trim();
  let testCommandMs = 0;
  try {
    await docker(h, ['exec', '-i', id, 'sh', '-c', `cat > ${PATCH_FILE}`], task.patch);
    await docker(h, ['exec', '-i', id, 'sh', '-c', `cat > ${TEST_PATCH_FILE}`], task.test_patch);
    const apply = await docker(h, ['exec', id, 'bash', '-c', applyScript()]);
    if (!apply.stdout.includes(APPLY_OK)) throw new Error(`docker: ${task.instance_id}: patch did not apply`);
    await docker(h, ['exec', id, 'bash', '-c', testPatchScript(task)]);
    // Failing tests exit non-zero: that is a result, not a harness error.
    const tests = await docker(h, ['exec', id, 'bash', '-c', testScript(task)], undefined, true);
    testCommandMs = parseTestTime(tests.stdout) ?? NaN;
  } finally {
    await docker(h, ['rm', '-f', id]);
  }
  const totalMs = performance.now() - t0;
  return { totalMs, testCommandMs, overheadMs: totalMs - testCommandMs };
}

async function benchDocker(tasks: Task[], prepared: Map<string, PreparedTask>, rounds: number, storeRoot: string): Promise<Map<string, Sample[]> | string> {
  let h: DockerHandle | undefined;
  try {
    h = await ensureDocker(log);
    await importImage(h, BASE_IMAGE, await existingPaths(hostPaths()), log);
    const images = new Map<string, string>();
    for (const task of tasks) images.set(task.instance_id, await buildTaskImage(h, task, prepared.get(task.instance_id)!, storeRoot));
    const samples = new Map<string, Sample[]>();
    for (let round = 0; round <= rounds; round++) {
      for (const task of tasks) {
        const s = await dockerEvaluate(h, task, prepared.get(task.instance_id)!, images.get(task.instance_id)!);
        if (round === 0) continue;
        const list = samples.get(task.instance_id) ?? [];
        list.push(s);
        samples.set(task.instance_id, list);
      }
    }
    return samples;
  } catch (err) {
    return err instanceof DockerUnavailable ? `Docker unavailable: ${err.message}` : `Docker run failed: ${(err as Error).message}`;
  } finally {
    if (h) await stopDocker(h, log);
  }
}

async function main(): Promise<void> {
  const values = readArgs('usage: node dist/benchmarks/eval.js [--rounds N] [--no-docker]', { rounds: count(5), 'no-docker': flag() });
  const rounds = values.rounds;
  const dir = mkdtempSync(join(tmpdir(), 'minisandbox-eval-bench-'));
  try {
    const demo = createDemoTaskSet(join(dir, 'taskset'));
    const storeRoot = join(dir, 'store');
    const store = await openStore({ root: storeRoot });
    const prep = await prepareTasks(demo.tasks, { store, concurrency: 2 });
    if (prep.failures.length) throw new Error(prep.failures.map((f) => f.message).join('\n'));
    log(`prepared ${demo.tasks.length} demo tasks in ${formatMs(prep.summary.durationMs)}; ${rounds} rounds (+1 warm-up) each`);
    const msbx = await benchMiniSandbox(demo.tasks, prep.prepared, rounds, join(dir, 'state'));
    const dock = values['no-docker'] ? 'disabled with --no-docker' : await benchDocker(demo.tasks, prep.prepared, rounds, storeRoot);

    const med = (list: Sample[] | undefined, f: (s: Sample) => number) => (list ? median(list.map(f)) : NaN);
    const rows = [['instance', 'msbx overhead', 'msbx total', 'docker overhead', 'docker total', 'tests (msbx)', 'overhead ratio']];
    const allM: number[] = [];
    const allD: number[] = [];
    for (const task of demo.tasks) {
      const m = msbx.get(task.instance_id);
      const d = typeof dock === 'string' ? undefined : dock.get(task.instance_id);
      const mo = med(m, (s) => s.overheadMs);
      const dov = med(d, (s) => s.overheadMs);
      allM.push(...(m ?? []).map((s) => s.overheadMs));
      allD.push(...(d ?? []).map((s) => s.overheadMs));
      rows.push([task.instance_id, formatMs(mo), formatMs(med(m, (s) => s.totalMs)), formatMs(dov), formatMs(med(d, (s) => s.totalMs)), formatMs(med(m, (s) => s.testCommandMs)), formatRatio(dov / mo)]);
    }
    const mAll = median(allM);
    const dAll = allD.length ? median(allD) : NaN;
    rows.push(['all (median)', formatMs(mAll), '', formatMs(dAll), '', '', formatRatio(dAll / mAll)]);
    process.stdout.write(`\nPer-instance evaluation overhead (wall time minus the test command's own time), medians of ${rounds} rounds:\n\n`);
    process.stdout.write(`${formatTable(rows)}\n`);
    if (typeof dock === 'string') process.stdout.write(`\nDocker skipped: ${dock}\n`);
    else process.stdout.write(`\nDocker's overhead is ${formatRatio(dAll / mAll)} MiniSandbox's.\n`);
  } finally {
    await removeTree(dir);
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`eval benchmark failed: ${(err as Error).stack ?? String(err)}\n`);
  process.exitCode = 1;
});
