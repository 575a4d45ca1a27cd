import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDemoTaskSet, type DemoTaskSet } from '../../lib/swe/demo/index.js';
import { gradeInstance, gradeTests } from '../../lib/swe/grading.js';
import { parseTestLog } from '../../lib/swe/logParsers.js';
import { loadPredictions, loadTasks, type Task } from '../../lib/swe/tasks.js';
import { makeTempDir, NO_PYTEST_REASON, pytestPython, pythonEnv, pythonShimDir, removeDir, run } from './helpers.js';

let workDir = '';
let demo: DemoTaskSet;

beforeAll(() => {
  workDir = makeTempDir('demo');
  demo = createDemoTaskSet(join(workDir, 'taskset'));
});
afterAll(() => removeDir(workDir));

describe('createDemoTaskSet', () => {
  it('writes tasks.jsonl that loads back to the returned tasks', () => {
    expect(demo.tasks.length).toBeGreaterThanOrEqual(3);
    const loaded = loadTasks(demo.tasksFile);
    expect(loaded.errors).toEqual([]);
    expect(loaded.tasks).toEqual(demo.tasks);
    const line = JSON.parse(readFileSync(demo.tasksFile, 'utf8').split('\n')[0] as string) as Task;
    expect(line.repo_path).toBe('repos/strkit'); // relative: the set can be moved
  });

  it('writes gold and partial predictions in SWE-bench format', () => {
    const gold = loadPredictions(demo.goldPredictionsFile);
    expect(gold.errors).toEqual([]);
    expect(gold.predictions.map((p) => p.model_patch)).toEqual(demo.tasks.map((t) => t.patch));
    const partial = loadPredictions(demo.partialPredictionsFile);
    expect(partial.predictions.map((p) => p.instance_id)).toEqual(demo.partialFixes.map((p) => p.instance_id));
  });

  it('is deterministic: the same base commits and patches every time', () => {
    const again = createDemoTaskSet(join(workDir, 'taskset-again'));
    expect(again.tasks.map((t) => [t.base_commit, t.patch, t.test_patch])).toEqual(
      demo.tasks.map((t) => [t.base_commit, t.patch, t.test_patch]),
    );
  });

  it('refuses to overwrite an existing demo repository', () => {
    expect(() => createDemoTaskSet(demo.dir)).toThrow(/repos\/strkit already exists/);
  });

  it('leaves each repository clean at base_commit with real git diffs as patches', () => {
    for (const task of demo.tasks) {
      const repo = task.repo_path!;
      expect(run('git', ['rev-parse', 'HEAD'], { cwd: repo }).output.trim()).toBe(task.base_commit);
      expect(run('git', ['status', '--porcelain'], { cwd: repo }).output).toBe('');
      expect(task.patch).toMatch(/^diff --git a\//);
      expect(task.test_patch).toMatch(/^diff --git a\/tests\//);
    }
  });
});

/** A clone of `task`'s repo at base_commit with test_patch and `patch` (if any) applied. */
function checkout(task: Task, name: string, patch?: string): string {
  const dir = join(workDir, 'runs', `${task.instance_id}-${name}`);
  run('git', ['clone', '-q', '--no-checkout', task.repo_path!, dir], { cwd: workDir });
  const steps: Array<[string, string[]]> = [['git', ['checkout', '-q', task.base_commit]]];
  for (const [label, diff] of [['test_patch', task.test_patch], ['patch', patch]] as const) {
    if (!diff) continue;
    const file = join(dir, `..`, `${task.instance_id}-${name}.${label}.diff`);
    writeFileSync(file, diff);
    steps.push(['git', ['apply', '--verbose', file]]);
  }
  for (const [cmd, args] of steps) {
    const result = run(cmd, args, { cwd: dir });
    if (result.status !== 0) throw new Error(`${cmd} ${args.join(' ')} failed in ${dir}: ${result.output}`);
  }
  return dir;
}

/** Runs the task's literal test_cmd with `python` = the pytest interpreter, no venv. */
function runTaskTests(task: Task, dir: string): string {
  const bin = pythonShimDir(join(dir, '..', `${task.instance_id}-${dir.split('-').pop()}-shim`), pytestPython!.path);
  const env = pythonEnv({ PATH: `${bin}:${process.env.PATH}`, PYTHONPATH: `${join(dir, 'src')}:${dir}` });
  return run('/bin/sh', ['-c', task.test_cmd], { cwd: dir, env }).output;
}

describe.skipIf(!pytestPython)(`demo tasks graded from real pytest runs (${pytestPython?.path ?? NO_PYTEST_REASON})`, () => {
  it.each(['strkit', 'tinydate', 'miniini', 'stackq'])('%s: FAIL_TO_PASS fail and PASS_TO_PASS pass at base', (name) => {
    const task = demo.tasks.find((t) => t.repo.endsWith(`/${name}`))!;
    const log = runTaskTests(task, checkout(task, 'base'));
    const statuses = parseTestLog(log, { parser: task.log_parser ?? 'auto' });
    const tests = gradeTests(task, statuses);
    expect(tests.FAIL_TO_PASS).toEqual({ success: [], failure: task.FAIL_TO_PASS });
    expect(tests.PASS_TO_PASS).toEqual({ success: task.PASS_TO_PASS, failure: [] });
    for (const id of task.FAIL_TO_PASS) expect(statuses.get(id), id).toBe('FAILED');
    // Nothing beyond the declared lists: they describe the whole suite.
    expect([...statuses.keys()].sort()).toEqual([...task.FAIL_TO_PASS, ...task.PASS_TO_PASS].sort());
    // An empty model patch leaves the repo as it is: nothing is resolved.
    const empty = gradeInstance(task, { modelPatch: '', patchApplied: true, statuses });
    expect(empty.report).toEqual({ patch_is_None: false, patch_exists: false, patch_successfully_applied: false, resolved: false });
    expect(empty.reward).toMatchObject({ reward: 0, resolved: false, reason: 'empty patch' });
  });

  it.each(['strkit', 'tinydate', 'miniini', 'stackq'])('%s: the gold patch resolves the task', (name) => {
    const task = demo.tasks.find((t) => t.repo.endsWith(`/${name}`))!;
    const log = runTaskTests(task, checkout(task, 'gold', task.patch));
    const result = gradeInstance(task, { modelPatch: task.patch, patchApplied: true, statuses: parseTestLog(log) });
    expect(result.report).toEqual({
      patch_is_None: false,
      patch_exists: true,
      patch_successfully_applied: true,
      resolved: true,
      tests_status: {
        FAIL_TO_PASS: { success: task.FAIL_TO_PASS, failure: [] },
        PASS_TO_PASS: { success: task.PASS_TO_PASS, failure: [] },
        FAIL_TO_FAIL: { success: [], failure: [] },
        PASS_TO_FAIL: { success: [], failure: [] },
      },
      test_statuses: expect.any(Object),
    });
    expect(result.reward).toEqual({ reward: 1, resolved: true, failToPassFraction: 1, passToPassFraction: 1, reason: 'all tests pass' });
  });

  it('the partial fix resolves nothing and lists exactly the still-failing tests', () => {
    expect(demo.partialFixes.length).toBeGreaterThanOrEqual(1);
    for (const partial of demo.partialFixes) {
      const task = demo.tasks.find((t) => t.instance_id === partial.instance_id)!;
      const log = runTaskTests(task, checkout(task, 'partial', partial.patch));
      const result = gradeInstance(task, { modelPatch: partial.patch, patchApplied: true, statuses: parseTestLog(log) });
      expect(result.report.resolved).toBe(false);
      expect(result.report.tests_status?.FAIL_TO_PASS).toEqual({ success: partial.fixes, failure: partial.stillFailing });
      expect(result.report.tests_status?.PASS_TO_PASS.failure).toEqual([]);
      expect(result.reward.reward).toBe(0);
      expect(result.reward.failToPassFraction).toBeCloseTo(partial.fixes.length / task.FAIL_TO_PASS.length);
      expect(partial.fixes.length).toBeGreaterThan(0);
    }
  });

  it('stackq also grades from a unittest run, matching pytest-style tasks by canonical ids', () => {
    const task = demo.tasks.find((t) => t.repo.endsWith('/stackq'))!;
    const dir = checkout(task, 'unittest', task.patch);
    const log = run(pytestPython!.path, ['-m', 'unittest', '-v', 'tests.test_collections'], { cwd: dir, env: pythonEnv({ PYTHONPATH: dir }) }).output;
    // The same tests in Django-style pre-3.11 ids, as SWE-bench lists them.
    const toUnittestId = (id: string): string => {
      const [, cls, method] = id.split('::');
      return `${method} (tests.test_collections.${cls})`;
    };
    const unittestTask = { ...task, FAIL_TO_PASS: task.FAIL_TO_PASS.map(toUnittestId), PASS_TO_PASS: task.PASS_TO_PASS.map(toUnittestId) };
    const result = gradeInstance(unittestTask, { modelPatch: task.patch, patchApplied: true, statuses: parseTestLog(log) });
    expect(result.report.resolved).toBe(true);
  });
});

describe.skipIf(!pytestPython)('demo repositories install offline', () => {
  it('pip install --no-build-isolation --no-deps -e . works in a bare venv', { timeout: 180_000 }, () => {
    const venv = join(workDir, 'venv');
    const created = run(pytestPython!.path, ['-m', 'venv', venv], { cwd: workDir });
    expect(created.status, created.output).toBe(0);
    const python = join(venv, 'bin', 'python');
    for (const task of demo.tasks) {
      const dir = checkout(task, 'install');
      for (const command of task.install) {
        const result = run('/bin/sh', ['-c', command], { cwd: dir, env: pythonEnv({ PATH: `${join(venv, 'bin')}:${process.env.PATH}` }) });
        expect(result.status, `${task.instance_id}: ${command}\n${result.output}`).toBe(0);
      }
      const pkg = task.repo.split('/')[1]!;
      const where = run(python, ['-c', `import ${pkg}; print(${pkg}.__file__)`], { cwd: workDir, env: pythonEnv() });
      expect(where.output.trim().startsWith(dir), where.output).toBe(true);
    }
    expect(existsSync(join(venv, 'lib'))).toBe(true);
  });
});
