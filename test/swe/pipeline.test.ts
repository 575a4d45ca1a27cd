/**
 * The SWE pipeline end to end on the built-in demo set: real sandboxes,
 * real venvs, real pytest runs. Runs as root and as an unprivileged user
 * (CI runs the suite both ways).
 */
import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { buildEnv, EnvError, listEnvs, loadEnv, removeEnv } from '../../lib/env/index.js';
import { openStore } from '../../lib/layers/store.js';
import { createDemoTaskSet, type DemoTaskSet } from '../../lib/swe/demo/index.js';
import { evaluate } from '../../lib/swe/pipeline/evaluate.js';
import { prepareTasks, type PrepareResult } from '../../lib/swe/pipeline/prepare.js';
import { evaluateAll } from '../../lib/swe/pipeline/runReport.js';
import type { Task } from '../../lib/swe/tasks.js';
import { hostPidsMatching, ownSandboxInits, tempDir, uniqueSleep, waitFor } from '../helpers.js';
import { NO_PYTEST_REASON, pytestPython } from './helpers.js';

const suite = pytestPython ? describe : describe.skip;
if (!pytestPython) console.warn(`skipping pipeline tests: ${NO_PYTEST_REASON}`);

let dir: ReturnType<typeof tempDir>;
let demo: DemoTaskSet;
let prep: PrepareResult;
let stateDir: string;
const progress: string[] = [];
const sandbox = () => ({ stateDir });

/** A task whose recipe cannot build: it must fail alone. */
function brokenRecipe(base: Task): Task {
  return { ...base, instance_id: 'broken__recipe-1', version: '99.0', install: ['echo "no such package: frobnicate" >&2; exit 3'] };
}

function unknownCommit(base: Task): Task {
  return { ...base, instance_id: 'broken__commit-1', base_commit: 'deadbeefdeadbeefdeadbeefdeadbeefdeadbeef' };
}

function noPython(base: Task): Task {
  return { ...base, instance_id: 'broken__python-1', python: '2.1' };
}

function missingField(base: Task): Task {
  const { test_cmd: _drop, ...rest } = base;
  return { ...rest, instance_id: 'broken__fields-1' } as Task;
}

beforeAll(async () => {
  if (!pytestPython) return;
  dir = tempDir('msbx-swe-pipeline-');
  stateDir = join(dir.path, 'state');
  demo = createDemoTaskSet(join(dir.path, 'taskset'));
  const store = await openStore({ root: join(dir.path, 'store') });
  const [first] = demo.tasks;
  prep = await prepareTasks([...demo.tasks, brokenRecipe(first!), unknownCommit(first!), missingField(first!), noPython(first!)], {
    store,
    stateDir,
    concurrency: 2,
    onProgress: (e) => progress.push(`${e.status} ${e.label}`),
  });
}, 120_000);

afterAll(() => dir?.remove());

suite('prepareTasks', () => {
  it('prepares every good task and reports each bad one with its reason', () => {
    expect([...prep.prepared.keys()].sort()).toEqual(demo.tasks.map((t) => t.instance_id).sort());
    const byId = Object.fromEntries(prep.failures.map((f) => [f.instance_id, f]));
    expect(Object.keys(byId).sort()).toEqual(['broken__commit-1', 'broken__fields-1', 'broken__python-1', 'broken__recipe-1']);
    expect(byId['broken__recipe-1']!.stage).toBe('venv');
    expect(byId['broken__recipe-1']!.message).toMatch(/step 0 \(run "echo .*"\) failed \(exit 3\)[\s\S]*no such package: frobnicate/);
    expect(byId['broken__python-1']!.stage).toBe('python');
    expect(byId['broken__python-1']!.message).toMatch(/^task "broken__python-1": python 2\.1: no usable interpreter found in .*versions/);
    expect(byId['broken__commit-1']!.stage).toBe('repo');
    expect(byId['broken__commit-1']!.message).toMatch(/commit deadbeef.* not found/);
    expect(byId['broken__fields-1']!.stage).toBe('validate');
    expect(byId['broken__fields-1']!.message).toMatch(/missing "test_cmd"/);
  });

  it('builds one venv per recipe group and reports progress', () => {
    const s = prep.summary;
    // 4 demo groups + the broken recipe's group (the unknown-commit task shares strkit's).
    expect(s.envs).toEqual({ built: 4, reused: 0, failed: 1 });
    // The broken recipe's repo state is strkit's: built once, then reused.
    expect(s.repos).toEqual({ built: 4, reused: 1, failed: 1 });
    expect(s.prepared).toBe(4);
    expect(s.failed).toBe(4);
    expect(s.diskBytes).toBeGreaterThan(0);
    expect(progress.filter((p) => p.startsWith('failed'))).toHaveLength(2);
  });

  it('reuses everything from the store on a second run', async () => {
    const store = await openStore({ root: join(dir.path, 'store') });
    const again = await prepareTasks(demo.tasks, { store, stateDir });
    expect(again.summary.envs).toEqual({ built: 0, reused: 4, failed: 0 });
    expect(again.summary.repos).toEqual({ built: 0, reused: 4, failed: 0 });
    expect(again.prepared.get(demo.tasks[0]!.instance_id)!.env!.venvDigest).toBe(prep.prepared.get(demo.tasks[0]!.instance_id)!.env!.venvDigest);
  });
});

suite('evaluate', () => {
  it('resolves every task with its gold patch', async () => {
    const predictions = demo.tasks.map((t) => ({ instance_id: t.instance_id, model_patch: t.patch, model_name_or_path: 'gold' }));
    const { results, report } = await evaluateAll(demo.tasks, predictions, { prepared: prep.prepared, concurrency: 2, timeoutMs: 120_000, sandbox: sandbox() });
    for (const r of results) expect({ id: r.instance_id, reason: r.reward.reason, error: r.error }).toEqual({ id: r.instance_id, reason: 'all tests pass', error: undefined });
    expect(report.resolved_instances).toBe(demo.tasks.length);
    expect(report.totals.mean_reward).toBe(1);
    for (const r of results) {
      expect(r.reward.reward).toBe(1);
      expect(r.applyMethod).toBe('git apply --verbose');
      expect(r.timings.testCommandMs).toBeGreaterThan(0);
      expect(r.timings.setupMs).toBeGreaterThan(0);
    }
  }, 120_000);

  it('resolves nothing with empty patches (and runs nothing)', async () => {
    for (const task of demo.tasks) {
      const r = await evaluate(task, '', { prepared: prep.prepared.get(task.instance_id)!, sandbox: sandbox() });
      expect(r.reward).toMatchObject({ reward: 0, resolved: false, reason: 'empty patch' });
      expect(r.report.patch_exists).toBe(false);
    }
    const none = await evaluate(demo.tasks[0]!, null, { prepared: prep.prepared.get(demo.tasks[0]!.instance_id)!, sandbox: sandbox() });
    expect(none.report.patch_is_None).toBe(true);
  });

  it('does not resolve with a partial fix and lists exactly the failing tests', async () => {
    expect(demo.partialFixes.length).toBeGreaterThan(0);
    for (const fix of demo.partialFixes) {
      const task = demo.tasks.find((t) => t.instance_id === fix.instance_id)!;
      const r = await evaluate(task, fix.patch, { prepared: prep.prepared.get(task.instance_id)!, timeoutMs: 120_000, sandbox: sandbox() });
      expect(r.report.patch_successfully_applied).toBe(true);
      expect(r.reward.resolved).toBe(false);
      expect(r.report.tests_status!.FAIL_TO_PASS.failure.sort()).toEqual([...fix.stillFailing].sort());
      expect(r.report.tests_status!.FAIL_TO_PASS.success.sort()).toEqual([...fix.fixes].sort());
      expect(r.report.tests_status!.PASS_TO_PASS.failure).toEqual([]);
      expect(r.reward.failToPassFraction).toBeCloseTo(fix.fixes.length / task.FAIL_TO_PASS.length);
    }
  }, 60_000);

  it('reports a patch that does not apply', async () => {
    const task = demo.tasks[0]!;
    const bogus = 'diff --git a/nope.py b/nope.py\n--- a/nope.py\n+++ b/nope.py\n@@ -1,1 +1,1 @@\n-old line\n+new line\n';
    const r = await evaluate(task, bogus, { prepared: prep.prepared.get(task.instance_id)!, sandbox: sandbox() });
    expect(r.patchApplied).toBe(false);
    expect(r.report).toMatchObject({ patch_exists: true, patch_successfully_applied: false, resolved: false });
    expect(r.reward.reason).toBe('model patch did not apply');
    expect(r.log).toContain('>>>>> Patch Apply Failed');
    expect(r.timings.testsMs).toBe(0);
  });

  it('kills a hanging test run at its timeout and reports it', async () => {
    const marker = uniqueSleep();
    const task = { ...demo.tasks[1]!, test_cmd: `sleep ${marker}` };
    const started = Date.now();
    const r = await evaluate(task, task.patch, { prepared: prep.prepared.get(task.instance_id)!, timeoutMs: 1500, sandbox: sandbox() });
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(r.timedOut).toBe(true);
    expect(r.reward).toMatchObject({ reward: 0, resolved: false, reason: 'tests timed out' });
    expect(r.log).toContain('Tests Timed Out');
    expect(await waitFor(() => hostPidsMatching(marker).length === 0)).toBe(true);
  });

  it('does not leak state between evaluations', async () => {
    const task = demo.tasks[2]!;
    const prepared = prep.prepared.get(task.instance_id)!;
    const evil = { ...task, test_cmd: 'echo leaked > /testbed/LEAK && echo leaked > $VIRTUAL_ENV/LEAK && touch /tmp/LEAK && false' };
    await evaluate(evil, task.patch, { prepared, sandbox: sandbox() });
    const probe = { ...task, test_cmd: 'ls /testbed/LEAK $VIRTUAL_ENV/LEAK /tmp/LEAK; git -C /testbed status --porcelain' };
    const r = await evaluate(probe, task.patch, { prepared, sandbox: sandbox() });
    expect(r.log).toMatch(/\/testbed\/LEAK': No such file/);
    expect(r.log).toMatch(/venvs\/\w+\/LEAK': No such file/);
    expect(r.log).toMatch(/\/tmp\/LEAK': No such file/);
  });

  it('leaves no sandbox directories or processes behind', async () => {
    const leftovers = existsSync(stateDir) ? readdirSync(stateDir).filter((n) => !n.startsWith('.')) : [];
    expect(leftovers).toEqual([]);
    expect(ownSandboxInits()).toEqual([]);
  });
});

suite('the store after prepare, used as a library', () => {
  it('store.gc() keeps every layer prepared tasks and envs use; after removeEnv the env goes', async () => {
    const store = await openStore({ root: join(dir.path, 'store') });
    const task = demo.tasks[0]!;
    // An env a user builds themselves, next to what prepare built, and a layer nothing uses.
    const own = await buildEnv({ python: pytestPython!.path, name: 'mine', repo: { source: task.repo_path!, commit: task.base_commit } }, { store, stateDir });
    const strayDir = join(dir.path, 'stray');
    mkdirSync(strayDir);
    writeFileSync(join(strayDir, 'x.txt'), 'nobody uses this');
    const stray = await store.addDirectory(strayDir);

    const gc = await store.gc();
    expect(gc.removedLayers).toEqual([stray.digest]);
    const inUse = [...prep.prepared.values()].flatMap((p) => [p.env!.venvDigest, p.env!.repoDigest]);
    for (const d of [...inUse, own.venv.digest, own.repo!.digest]) expect(await store.get(d), d).toBeDefined();
    const labels = (await store.pins()).map((p) => p.label);
    expect(labels.filter((l) => l.startsWith('prepared repo '))).toHaveLength(demo.tasks.length);
    expect(labels).toContain(`env ${own.id} (mine)`);
    // What prepare built still serves: the gold patch resolves.
    const r = await evaluate(task, task.patch, { prepared: prep.prepared.get(task.instance_id)!, sandbox: sandbox() });
    expect(r.reward.reason).toBe('all tests pass');

    await removeEnv(own.id, { store });
    await expect(loadEnv(own.id, { store })).rejects.toThrow(EnvError);
    expect((await listEnvs({ store })).map((e) => e.id)).not.toContain(own.id);
    const after = await store.gc();
    // Both its layers are its own (its repo layer is packed from an archive, prepare's from a directory).
    expect(after.removedLayers.sort()).toEqual([own.venv.digest, own.repo!.digest].sort());
    for (const d of inUse) expect(await store.get(d), d).toBeDefined();
    await expect(removeEnv(own.id, { store })).rejects.toThrow(`env ${own.id}: no such env in the store ${store.root}`);
  }, 120_000);
});
