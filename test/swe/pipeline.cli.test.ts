/** The prepare/eval commands as a user runs them: files in, report and summary out. */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { UsageError } from '../../lib/cli/args.js';
import { demoCommand, evalCommand, prepareCommand } from '../../lib/swe/cli.js';
import { createProgress } from '../../lib/swe/pipeline/progress.js';
import { createDemoTaskSet, type DemoTaskSet } from '../../lib/swe/demo/index.js';
import type { EvalRunReport } from '../../lib/swe/pipeline/runReport.js';
import { tempDir } from '../helpers.js';
import { NO_PYTEST_REASON, pytestPython } from './helpers.js';

const suite = pytestPython ? describe : describe.skip;
if (!pytestPython) console.warn(`skipping CLI pipeline tests: ${NO_PYTEST_REASON}`);

let dir: ReturnType<typeof tempDir>;
let demo: DemoTaskSet;

/** Runs a command with stdout/stderr captured. */
async function capture(run: () => Promise<number>): Promise<{ code: number; stdout: string; stderr: string }> {
  let stdout = '';
  let stderr = '';
  const o = vi.spyOn(process.stdout, 'write').mockImplementation((s) => ((stdout += String(s)), true));
  const e = vi.spyOn(process.stderr, 'write').mockImplementation((s) => ((stderr += String(s)), true));
  try {
    return { code: await run(), stdout, stderr };
  } finally {
    o.mockRestore();
    e.mockRestore();
  }
}

beforeAll(() => {
  if (!pytestPython) return;
  dir = tempDir('msbx-swe-cli-');
  demo = createDemoTaskSet(join(dir.path, 'taskset'));
});
afterAll(() => dir?.remove());

suite('swe commands', () => {
  it('prepare builds, then reuses, with plain progress lines off a terminal', async () => {
    const store = join(dir.path, 'store');
    const first = await capture(() => prepareCommand([demo.tasksFile, '--store', store, '--jobs', '2']));
    expect(first.code).toBe(0);
    expect(first.stderr).toMatch(/^\[\d\/8\] built venv /m);
    expect(first.stderr).toMatch(/prepared 4\/4 tasks .*venvs 4 built, 0 reused/);
    expect(first.stderr).not.toContain('\r');
    const second = await capture(() => prepareCommand([demo.tasksFile, '--store', store]));
    expect(second.stderr).toMatch(/venvs 0 built, 4 reused, 0 failed; repos 0 built, 4 reused/);
  }, 60_000);

  it('prepare counts the tasks it rejected when reading the file', async () => {
    const file = join(demo.dir, 'with-rejected.jsonl'); // next to the repos its relative repo_paths name
    writeFileSync(file, `${readFileSync(demo.tasksFile, 'utf8').trim()}\n{"instance_id": "broken-1"}\n`);
    const r = await capture(() => prepareCommand([file, '--store', join(dir.path, 'store')]));
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^skipping task "broken-1" \(line 5\): missing field "repo"/m);
    expect(r.stderr).toMatch(/prepared 4\/5 tasks .*; 1 task\(s\) rejected, 0 failed/);
  }, 60_000);

  it('eval writes a SWE-bench report with rewards and timings, and per-instance logs', async () => {
    const report = join(dir.path, 'report.json');
    const logs = join(dir.path, 'logs');
    const r = await capture(() =>
      evalCommand([demo.tasksFile, '--predictions', demo.partialPredictionsFile, '--store', join(dir.path, 'store'), '--report', report, '--logs', logs, '--timeout', '120']),
    );
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

  it('demo prepares, resolves every gold patch and removes its temporary directory', async () => {
    const r = await capture(() => demoCommand(['--jobs', '2']));
    expect(r.code).toBe(0);
    expect(r.stdout).toMatch(/resolved 4\/4/);
    const tmp = /demo task set: \d+ tasks in (\S+)\/taskset/.exec(r.stderr)?.[1];
    expect(tmp).toBeDefined();
    expect(existsSync(tmp!)).toBe(false);
  }, 60_000);

  it('rejects bad usage with a UsageError naming the option', async () => {
    await expect(evalCommand([demo.tasksFile])).rejects.toThrow(UsageError);
    await expect(evalCommand([demo.tasksFile, '--gold', '--jobs', '0'])).rejects.toThrow(/--jobs: expected a positive integer/);
    await expect(prepareCommand([])).rejects.toThrow(/expected 1 argument/);
  });
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
