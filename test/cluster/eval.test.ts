/**
 * Evaluation across nodes: 40 instances through a real Redis and 3 worker
 * processes (each a node: its own network namespace as root, its own
 * store) give the report a local `eval` gives; a worker SIGKILLed mid-run
 * loses no instance and none is counted twice; an interrupted `eval
 * --queue` resumes without running graded instances again.
 */
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Queue } from 'bullmq';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { evalJobId, type EvalJobResult } from '../../lib/cluster/index.js';
import { pytestPython, NO_PYTEST_REASON } from '../swe/helpers.js';
import { cli, comparable, jobsIn, leftoverNet, NO_REDIS_REASON, REDIS_SERVER, startBench, taskSet40, waitFor, type Bench, type TaskSet40 } from './queueHelpers.js';

const skip = !REDIS_SERVER ? NO_REDIS_REASON : !pytestPython ? NO_PYTEST_REASON : undefined;
if (skip) console.warn(`test/cluster/eval.test.ts skipped: ${skip}`);

describe.skipIf(skip !== undefined)('eval --queue across 3 workers', () => {
  let bench: Bench;
  let set: TaskSet40;
  let local: Record<string, unknown>;
  let queue: Queue;

  const queueArgs = (runId: string, report: string) => [
    'eval', set.tasksFile, '--predictions', set.predsFile, '--queue', bench.url(undefined), '--redis-password-file', bench.passwordFile, '--run-id', runId, '--report', report,
  ];
  const readReport = (file: string) => JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
  const allLogs = () => bench.nodes.map((n) => n.worker?.log() ?? '');

  beforeAll(async () => {
    bench = await startBench(3, 'eval');
    console.log(`cluster bench: ${bench.why}`);
    set = taskSet40(join(bench.dir, 'tasks'));
    await Promise.all(bench.nodes.map((n) => bench.startWorker(n)));
    // The reference: a local eval of the same predictions, in a store of its own.
    const ref = cli(['eval', set.tasksFile, '--predictions', set.predsFile, '--store', join(bench.dir, 'local-store'), '--jobs', '2', '--report', join(bench.dir, 'local.json')]);
    const code = await ref.done;
    if (code !== 0 && code !== 1) throw new Error(`local eval failed (${code}): ${ref.stderr()}`);
    local = readReport(join(bench.dir, 'local.json'));
    const { password } = { password: readFileSync(bench.passwordFile, 'utf8').trim() };
    queue = new Queue(bench.queue, { connection: { host: '127.0.0.1', port: bench.port, password } });
  }, 600_000);

  afterAll(async () => {
    await queue?.close();
    await bench?.close();
    if (bench?.mode === 'netns') expect(leftoverNet()).toEqual([]);
  }, 60_000);

  /** Every job of a run: completed once, by whom. */
  async function jobsOf(runId: string): Promise<Map<string, EvalJobResult>> {
    const out = new Map<string, EvalJobResult>();
    for (const t of set.tasks) {
      const job = await queue.getJob(evalJobId(runId, t.instance_id));
      expect(job, t.instance_id).toBeDefined();
      expect(await job!.getState(), t.instance_id).toBe('completed');
      out.set(t.instance_id, job!.returnvalue as EvalJobResult);
    }
    return out;
  }

  it('the local reference graded the mix: resolved, unresolved, not applied, empty', () => {
    const r = local as { resolved_instances: number; empty_patch_instances: number; unresolved_instances: number; error_instances: number; total_instances: number };
    expect(r.total_instances).toBe(40);
    expect(r.resolved_instances).toBeGreaterThan(0);
    expect(r.unresolved_instances).toBeGreaterThan(0);
    expect(r.empty_patch_instances).toBe(8);
    expect(r.error_instances).toBe(0);
  });

  it('40 instances across the 3 workers give the local report', async () => {
    const file = join(bench.dir, 'queue.json');
    const run = cli(queueArgs('all', file));
    expect(await run.done, run.stderr()).toBe(0);
    expect(comparable(readReport(file))).toEqual(comparable(local));
    expect(run.stderr()).toMatch(/\[40\/40\]/);
    const jobs = await jobsOf('all');
    const byWorker = new Map<string, number>();
    for (const j of jobs.values()) byWorker.set(j.worker, (byWorker.get(j.worker) ?? 0) + 1);
    console.log(`graded per worker (${bench.mode}): ${JSON.stringify(Object.fromEntries(byWorker))}`);
    expect(byWorker.size).toBe(3);
    // No instance ran twice: each job started once, on one worker.
    const started = allLogs().flatMap((l) => jobsIn(l, 'all').started);
    expect(started.length).toBe(40);
  }, 600_000);

  it('a worker SIGKILLed mid-run loses no instance and none is counted twice', async () => {
    const file = join(bench.dir, 'kill.json');
    const run = cli(queueArgs('kill', file));
    const victim = bench.nodes[0]!;
    // Kill it while it holds jobs: started and not finished.
    const inFlight = () => {
      const { started, finished } = jobsIn(victim.worker!.log(), 'kill');
      return started.filter((j) => !finished.includes(j));
    };
    await waitFor('node0 to hold a started job', () => inFlight().length > 0 && jobsIn(victim.worker!.log(), 'kill').finished.length >= 1);
    const held = inFlight();
    const killedId = /worker (\S+): \d+ slot/.exec(victim.worker!.log())![1]!;
    victim.worker!.child.kill('SIGKILL');
    await victim.worker!.exited;
    expect(await run.done, run.stderr()).toBe(0);
    expect(comparable(readReport(file))).toEqual(comparable(local));

    const jobs = await jobsOf('kill');
    expect(jobs.size).toBe(40);
    // The jobs it held were graded by the others once their locks expired.
    for (const id of held) {
      const instance = decodeURIComponent(id.slice('kill.'.length));
      expect(jobs.get(instance)!.worker, id).not.toBe(killedId);
    }
    const others = bench.nodes.slice(1).map((n) => jobsIn(n.worker!.log(), 'kill'));
    const recovered = others.flatMap((o) => o.started).filter((j) => held.includes(j));
    expect(recovered.sort()).toEqual([...held].sort());
    // Finished once on a live worker for every job the victim did not finish.
    const victimFinished = jobsIn(victim.worker!.log(), 'kill').finished;
    const finishedByOthers = others.flatMap((o) => o.finished);
    expect(new Set(finishedByOthers).size).toBe(finishedByOthers.length);
    expect(finishedByOthers.length + victimFinished.length).toBe(40);
    expect((await queue.getJobCounts('failed')).failed).toBe(0);
    console.log(`killed ${killedId} holding ${held.length} job(s); recovered by the others`);
    await bench.startWorker(victim); // back to 3 for the next test
  }, 600_000);

  it('SIGTERM twice: a worker returns its running jobs to the queue, the others grade them, and it exits 0', async () => {
    const preds = join(bench.dir, 'preds-term.jsonl');
    writeFileSync(preds, set.tasks.slice(0, 12).map((t) => JSON.stringify({ instance_id: t.instance_id, model_patch: t.patch, model_name_or_path: 'gold' })).join('\n') + '\n');
    const file = join(bench.dir, 'term.json');
    const run = cli(['eval', set.tasksFile, '--predictions', preds, '--queue', bench.url(undefined), '--redis-password-file', bench.passwordFile, '--run-id', 'term', '--report', file]);
    const node = bench.nodes[1]!;
    const w = node.worker!;
    const inFlight = () => {
      const { started, finished } = jobsIn(w.log(), 'term');
      return started.filter((j) => !finished.includes(j));
    };
    await waitFor('node1 to hold a started job', () => inFlight().length > 0);
    const workerId = /worker (\S+): \d+ slot/.exec(w.log())![1]!;
    w.child.kill('SIGTERM');
    await new Promise((r) => setTimeout(r, 200));
    w.child.kill('SIGTERM');
    expect(await w.exited).toBe(0);
    expect(w.log()).toMatch(/stopping: running jobs finish/);
    const returned = [...w.log().matchAll(/(term\.\S+): returned to the queue|returned (term\.\S+) to the queue/g)].map((m) => m[1] ?? m[2]!);
    expect(returned.length).toBeGreaterThan(0);
    expect(await run.done, run.stderr()).toBe(0);
    const report = readReport(file) as { resolved_instances: number; submitted_instances: number };
    expect(report.submitted_instances).toBe(12);
    expect(report.resolved_instances).toBe(12);
    for (const id of returned) {
      const job = await queue.getJob(id);
      expect((job!.returnvalue as EvalJobResult).worker, id).not.toBe(workerId);
    }
    console.log(`SIGTERM x2: ${returned.length} job(s) returned by ${workerId}, graded by the others`);
    await bench.startWorker(node);
  }, 600_000);

  it('an interrupted eval --queue resumes: graded instances are not run again', async () => {
    const file = join(bench.dir, 'resume.json');
    const first = cli(queueArgs('resume', file));
    await waitFor('10 results', () => /\[1\d\/40\]/.test(first.stderr()));
    first.child.kill('SIGINT');
    expect(await first.done).toBe(1);
    expect(first.stderr()).toMatch(/interrupted: the queue's workers go on with run resume; run the same command again to resume it/);

    const second = cli(queueArgs('resume', file));
    expect(await second.done, second.stderr()).toBe(0);
    const resumed = Number(/(\d+) already graded before this call/.exec(second.stderr())?.[1]);
    expect(resumed).toBeGreaterThanOrEqual(10);
    expect(comparable(readReport(file))).toEqual(comparable(local));
    // Each instance started exactly once over the two calls.
    const started = allLogs().flatMap((l) => jobsIn(l, 'resume').started);
    expect(started.length).toBe(40);
    expect(new Set(started).size).toBe(40);
  }, 600_000);
});
