/**
 * `tasks derive`: FAIL_TO_PASS and PASS_TO_PASS found from scratch on the
 * built-in demo set (real sandboxes, real pytest runs before and after the
 * gold patch) must be the demo's own lists.
 */
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createDemoTaskSet, type DemoTaskSet } from '../../lib/swe/demo/index.js';
import { classifyTests } from '../../lib/swe/derive.js';
import { loadTasks } from '../../lib/swe/tasks.js';
import type { TestStatus } from '../../lib/swe/testStatus.js';
import { tempDir } from '../helpers.js';
import { NO_PYTEST_REASON, pytestPython } from './helpers.js';

const CLI = fileURLToPath(new URL('../../dist/lib/cli/main.js', import.meta.url));
const statuses = (entries: Record<string, TestStatus>) => new Map(Object.entries(entries));

describe('classifyTests', () => {
  it("sorts every test by its move, with SWE-bench's notion of a pass", () => {
    const before = statuses({ 'a::fixed': 'FAILED', 'a::kept': 'PASSED', 'a::xfail': 'XFAIL', 'a::broken': 'PASSED', 'a::still': 'ERROR', 'a::skip': 'SKIPPED', 'a::gone': 'PASSED' });
    const after = statuses({ 'a::new': 'PASSED', 'a::fixed': 'PASSED', 'a::kept': 'PASSED', 'a::xfail': 'PASSED', 'a::broken': 'FAILED', 'a::still': 'FAILED', 'a::skip': 'SKIPPED' });
    expect(classifyTests(before, after)).toEqual({
      // absent before counts as failing (a test the test patch adds, which could not even be collected)
      FAIL_TO_PASS: ['a::new', 'a::fixed'],
      PASS_TO_PASS: ['a::kept', 'a::xfail'],
      // a skipped test proves nothing either way; a test gone after the fix no longer passes
      FAIL_TO_FAIL: ['a::still', 'a::skip'],
      PASS_TO_FAIL: ['a::broken', 'a::gone'],
    });
  });

  it('matches unittest ids across Python versions, listing each test once', () => {
    const before = statuses({ 'test_a (pkg.T)': 'FAILED' });
    const after = statuses({ 'test_a (pkg.T.test_a)': 'PASSED' });
    expect(classifyTests(before, after)).toEqual({ FAIL_TO_PASS: ['test_a (pkg.T.test_a)'], PASS_TO_PASS: [], FAIL_TO_FAIL: [], PASS_TO_FAIL: [] });
  });
});

describe('tasks command usage', () => {
  const cli = (...args: string[]) => spawnSync(process.execPath, [CLI, ...args], { encoding: 'utf8', timeout: 20_000 });

  it('names the subcommand and the argument it needs', () => {
    expect(cli('tasks').stderr).toBe("minisandbox tasks: no subcommand: expected derive (see 'minisandbox tasks --help')\n");
    expect(cli('tasks', 'derivate', 'x').stderr).toContain("unknown subcommand 'derivate'");
    expect(cli('tasks', 'derive').stderr).toContain('expected TASKS');
    expect(cli('tasks', 'derive', CLI, '--jobs', 'two').stderr).toContain("--jobs: expected a positive integer, got 'two'");
  });

  it('has --help', () => {
    const r = cli('tasks', 'derive', '--help');
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/^Usage: minisandbox tasks derive TASKS/);
    expect(cli('--help').stdout).toMatch(/^ {2}tasks +Build task sets/m);
  });
});

const suite = pytestPython ? describe : describe.skip;
if (!pytestPython) console.warn(`skipping tasks derive: ${NO_PYTEST_REASON}`);

suite('minisandbox tasks derive on the demo set', () => {
  let dir: ReturnType<typeof tempDir>;
  let demo: DemoTaskSet;
  let run: ReturnType<typeof spawnSync>;
  const output = () => join(demo.dir, 'derived', 'tasks.jsonl');

  beforeAll(() => {
    dir = tempDir('msbx-swe-derive-');
    demo = createDemoTaskSet(join(dir.path, 'taskset'));
    // The demo set as someone building it would have it: no test lists yet,
    // a field MiniSandbox does not read, and a task whose "fix" fixes nothing.
    const records = readFileSync(demo.tasksFile, 'utf8').trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>);
    const bare = records.map(({ FAIL_TO_PASS: _f, PASS_TO_PASS: _p, ...rest }) => ({ ...rest, note: `kept for ${String(rest.instance_id)}` }));
    const noFix = { ...bare[0]!, instance_id: 'minisandbox-demo__nofix-1', patch: 'diff --git a/NOTES b/NOTES\nnew file mode 100644\n--- /dev/null\n+++ b/NOTES\n@@ -0,0 +1 @@\n+nothing fixed\n' };
    const input = join(demo.dir, 'to-derive.jsonl');
    writeFileSync(input, [...bare, noFix].map((r) => JSON.stringify(r)).join('\n'));
    mkdirSync(join(demo.dir, 'derived'));
    run = spawnSync(process.execPath, [CLI, 'tasks', 'derive', input, '--output', output(), '--store', join(dir.path, 'store'), '--jobs', '2', '--timeout', '120'], {
      encoding: 'utf8',
      timeout: 170_000,
    });
  }, 180_000);
  afterAll(() => dir?.remove());

  it("finds exactly the demo's FAIL_TO_PASS and PASS_TO_PASS", () => {
    expect(run.error).toBeUndefined();
    const { tasks, errors } = loadTasks(output());
    expect(errors).toEqual([]);
    expect(tasks.map((t) => t.instance_id)).toEqual(demo.tasks.map((t) => t.instance_id));
    for (const task of tasks) {
      const own = demo.tasks.find((t) => t.instance_id === task.instance_id)!;
      expect({ id: task.instance_id, f2p: [...task.FAIL_TO_PASS].sort(), p2p: [...task.PASS_TO_PASS].sort() }).toEqual({
        id: own.instance_id,
        f2p: [...own.FAIL_TO_PASS].sort(),
        p2p: [...own.PASS_TO_PASS].sort(),
      });
      // Relative repo paths still lead to the repository from the output's directory.
      expect(task.repo_path).toBe(own.repo_path);
    }
  });

  it('keeps every field of the record as written', () => {
    const first = JSON.parse(readFileSync(output(), 'utf8').split('\n')[0]!) as Record<string, unknown>;
    expect(first.note).toBe(`kept for ${demo.tasks[0]!.instance_id}`);
    expect(first.repo_path).toBe('../repos/strkit');
  });

  it('leaves out, names and counts a task whose gold patch fixes nothing', () => {
    expect(run.status).toBe(1);
    expect(run.stderr).toContain('not derived: task "minisandbox-demo__nofix-1": the gold patch makes no failing test pass');
    expect(run.stderr).toMatch(/^minisandbox-demo__strkit-1 +4 +7 +0 +0$/m);
    expect(run.stderr).toMatch(/derived 4\/5 tasks; written to /);
  });
});
