/**
 * The pipeline on lib/env's builder (EnvLibProvider): one demo task, gold
 * and partial patch, so an API drift between the two shows up here.
 */
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { openStore } from '../../lib/layers/store.js';
import { createDemoTaskSet, type DemoTaskSet } from '../../lib/swe/demo/index.js';
import { EnvLibProvider } from '../../lib/swe/pipeline/envLibProvider.js';
import { evaluate } from '../../lib/swe/pipeline/evaluate.js';
import { prepareTasks, type PrepareResult } from '../../lib/swe/pipeline/prepare.js';
import { tempDir } from '../helpers.js';
import { NO_PYTEST_REASON, pytestPython } from './helpers.js';

const suite = pytestPython ? describe : describe.skip;
if (!pytestPython) console.warn(`skipping lib/env pipeline tests: ${NO_PYTEST_REASON}`);

let dir: ReturnType<typeof tempDir>;
let demo: DemoTaskSet;
let prep: PrepareResult;

beforeAll(async () => {
  if (!pytestPython) return;
  dir = tempDir('msbx-swe-envlib-');
  demo = createDemoTaskSet(join(dir.path, 'taskset'));
  const store = await openStore({ root: join(dir.path, 'store') });
  const withPartial = demo.tasks.find((t) => demo.partialFixes.some((p) => p.instance_id === t.instance_id))!;
  prep = await prepareTasks([withPartial], { provider: new EnvLibProvider({ store, stateDir: join(dir.path, 'state') }) });
}, 120_000);
afterAll(() => dir?.remove());

suite('EnvLibProvider', () => {
  it('prepares, resolves with the gold patch and not with the partial one', async () => {
    expect(prep.failures).toEqual([]);
    const fix = demo.partialFixes.find((p) => prep.prepared.has(p.instance_id))!;
    const task = demo.tasks.find((t) => t.instance_id === fix.instance_id)!;
    const prepared = prep.prepared.get(task.instance_id)!;
    expect(prepared.env.provider).toBe('lib/env');
    const gold = await evaluate(task, task.patch, { prepared, timeoutMs: 120_000, sandbox: { stateDir: join(dir.path, 'state') } });
    expect(gold.reward.reason).toBe('all tests pass');
    const partial = await evaluate(task, fix.patch, { prepared, timeoutMs: 120_000, sandbox: { stateDir: join(dir.path, 'state') } });
    expect(partial.reward.resolved).toBe(false);
    expect(partial.report.tests_status!.FAIL_TO_PASS.failure.sort()).toEqual([...fix.stillFailing].sort());
  }, 60_000);
});
