/**
 * minisandbox/swe's parsers and grader are pure functions people use on
 * machines where the addon cannot load (another OS, no compiler): importing
 * the module must not load it. Checked on a copy of the built package that
 * has no build/ directory, in a fresh Node process.
 */
import { spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { tempDir } from '../helpers.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

describe('importing minisandbox/swe without the addon', () => {
  const dir = tempDir('msbx-swe-noaddon-');
  const pkg = join(dir.path, 'minisandbox');
  const node = (script: string) => spawnSync(process.execPath, ['--input-type=module', '-e', script], { cwd: dir.path, encoding: 'utf8', timeout: 30_000 });

  beforeAll(() => {
    mkdirSync(join(pkg, 'dist'), { recursive: true });
    for (const f of ['package.json', 'binding.gyp']) cpSync(join(ROOT, f), join(pkg, f));
    cpSync(join(ROOT, 'dist', 'lib'), join(pkg, 'dist', 'lib'), { recursive: true });
    // The loader itself, without what it loads (no build/, no prebuilds/).
    mkdirSync(join(pkg, 'lib', 'native'), { recursive: true });
    cpSync(join(ROOT, 'lib', 'native', 'addon.cjs'), join(pkg, 'lib', 'native', 'addon.cjs'));
    symlinkSync(join(ROOT, 'node_modules'), join(pkg, 'node_modules'));
  });
  afterAll(() => dir.remove());

  it('the copy really has no addon: lib/sandbox fails to load', () => {
    const r = node(`await import(${JSON.stringify(join(pkg, 'dist/lib/sandbox/index.js'))});`);
    expect(r.status).not.toBe(0);
    expect(r.stderr).toContain('Could not locate the bindings file');
  });

  it('parses a log and grades it', () => {
    const r = node(`
      const swe = await import(${JSON.stringify(join(pkg, 'dist/lib/swe/index.js'))});
      const log = '>>>>> Start Test Output\\nPASSED t.py::test_a\\nFAILED t.py::test_b - boom\\n>>>>> End Test Output\\n';
      const statuses = swe.parseTestLog(log, { parser: 'pytest' });
      const graded = swe.gradeInstance({ instance_id: 'x', FAIL_TO_PASS: ['t.py::test_a'], PASS_TO_PASS: ['t.py::test_b'] }, { modelPatch: 'diff', patchApplied: true, statuses });
      console.log(JSON.stringify({ statuses: Object.fromEntries(statuses), resolved: graded.report.resolved, exports: typeof swe.prepareTasks }));
    `);
    expect(r.stderr).toBe('');
    expect(JSON.parse(r.stdout)).toEqual({ statuses: { 't.py::test_a': 'PASSED', 't.py::test_b': 'FAILED' }, resolved: false, exports: 'function' });
  });
});
