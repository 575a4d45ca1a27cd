/** The prepare/eval/demo commands as a user runs them: files in, report and summary out. */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createProgress } from '../../lib/swe/pipeline/progress.js';
import { createDemoTaskSet, type DemoTaskSet } from '../../lib/swe/demo/index.js';
import type { EvalRunReport } from '../../lib/swe/pipeline/runReport.js';
import { tempDir } from '../helpers.js';
import { NO_PYTEST_REASON, pytestPython } from '../swe/helpers.js';
import { cli } from './helpers.js';

const suite = pytestPython ? describe : describe.skip;
if (!pytestPython) console.warn(`skipping CLI pipeline tests: ${NO_PYTEST_REASON}`);

let dir: ReturnType<typeof tempDir>;
let demo: DemoTaskSet;

/** A command to its end; progress goes to a pipe, not a terminal. */
const run = (args: string[]) => {
  const r = cli(args, { timeout: 120_000 });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
};

beforeAll(() => {
  if (!pytestPython) return;
  dir = tempDir('msbx-swe-cli-');
  demo = createDemoTaskSet(join(dir.path, 'taskset'));
});
afterAll(() => dir?.remove());

suite('swe commands', () => {
  it('prepare builds, then reuses, with plain progress lines off a terminal', () => {
    const store = join(dir.path, 'store');
    const first = run(['prepare', demo.tasksFile, '--store', store, '--jobs', '2']);
    expect(first.code).toBe(0);
    expect(first.stderr).toMatch(/^\[\d\/8\] built venv /m);
    expect(first.stderr).toMatch(/prepared 4\/4 tasks .*venvs 4 built, 0 reused/);
    expect(first.stderr).not.toContain('\r');
    const second = run(['prepare', demo.tasksFile, '--store', store]);
    expect(second.stderr).toMatch(/venvs 0 built, 4 reused, 0 failed; repos 0 built, 4 reused/);
  }, 60_000);

  it('prepare counts the tasks it rejected when reading the file', () => {
    const file = join(demo.dir, 'with-rejected.jsonl'); // next to the repos its relative repo_paths name
    writeFileSync(file, `${readFileSync(demo.tasksFile, 'utf8').trim()}\n{"instance_id": "broken-1"}\n`);
    const r = run(['prepare', file, '--store', join(dir.path, 'store')]);
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^skipping task "broken-1" \(line 5\): missing field "repo"/m);
    expect(r.stderr).toMatch(/prepared 4\/5 tasks .*; 1 task\(s\) rejected, 0 failed/);
  }, 60_000);

  it('eval writes a SWE-bench report with rewards and timings, and per-instance logs', () => {
    const report = join(dir.path, 'report.json');
    const logs = join(dir.path, 'logs');
    const r = run(['eval', demo.tasksFile, '--predictions', demo.partialPredictionsFile, '--store', join(dir.path, 'store'), '--report', report, '--logs', logs, '--timeout', '120']);
    expect(r.code).toBe(0);
    const parsed = JSON.parse(readFileSync(report, 'utf8')) as EvalRunReport;
    const partialIds = demo.partialFixes.map((p) => p.instance_id).sort();
    expect(parsed.schema_version).toBe(2);
    expect(parsed.total_instances).toBe(demo.tasks.length);
    expect(parsed.submitted_ids).toEqual(partialIds);
    expect(parsed.unresolved_ids).toEqual(partialIds);
    expect(parsed.resolved_instances).toBe(0);
    for (const id of partialIds) {
      const task = demo.tasks.find((t) => t.instance_id === id)!;
      const instance = parsed.instances[id]!;
      expect(instance.tests_status!.FAIL_TO_PASS.failure.length).toBeGreaterThan(0);
      // SWE-bench's four groups, and every test of the run with its status.
      expect(Object.keys(instance.tests_status!)).toEqual(['FAIL_TO_PASS', 'PASS_TO_PASS', 'FAIL_TO_FAIL', 'PASS_TO_FAIL']);
      expect(Object.keys(instance.test_statuses!).sort()).toEqual([...task.FAIL_TO_PASS, ...task.PASS_TO_PASS].sort());
      expect(Object.values(instance.test_statuses!)).toContain('FAILED');
      const perInstance = JSON.parse(readFileSync(join(logs, id, 'report.json'), 'utf8')) as Record<string, EvalRunReport['instances'][string]>;
      expect(perInstance).toEqual({ [id]: instance });
      expect(parsed.rewards[id]!.reward).toBe(0);
      expect(parsed.timings[id]!.testsMs).toBeGreaterThan(0);
      expect(existsSync(join(logs, id, 'test_output.txt'))).toBe(true);
    }
    expect(r.stdout).toMatch(/resolved 0\/4 \(submitted \d, completed \d/);
    expect(r.stdout).toMatch(/median per instance: setup .* harness overhead/);
  }, 60_000);

  it('demo prepares, resolves every gold patch and removes its temporary directory', () => {
    const r = run(['demo', '--jobs', '2']);
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/resolved 4\/4/);
    const tmp = /demo task set: \d+ tasks in (\S+)\/taskset/.exec(r.stderr)?.[1];
    expect(tmp).toBeDefined();
    expect(existsSync(tmp!)).toBe(false);
  }, 60_000);

});

describe('progress line', () => {
  it('redraws one line on a terminal and prints plain lines otherwise', () => {
    const written: string[] = [];
    const stream = { write: (s: string) => (written.push(s), true), columns: 80 } as unknown as NodeJS.WriteStream;
    const tty = createProgress(stream, true);
    tty.update(1, 4, 'building venv a');
    tty.update(2, 4, 'building venv b');
    tty.end();
    expect(written.join('')).toContain('\r\x1b[K');
    expect(written.join('')).not.toContain('\n');
    written.length = 0;
    const plain = createProgress(stream, false);
    plain.update(1, 4, 'built venv a');
    expect(written).toEqual(['[1/4] built venv a\n']);
  });
});
