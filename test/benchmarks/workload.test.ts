/**
 * The benchmark suite's quick workload, built from nothing in a temporary
 * cache: real repositories made from released wheels, venvs installed from
 * the machine's local package indexes, FAIL_TO_PASS / PASS_TO_PASS derived
 * by real test runs. Then, through the real `evaluate`: the gold patch
 * resolves every task, an empty patch none (derivation has run the tests
 * at base_commit: FAIL_TO_PASS fail there). An interrupted build is finished by the next one,
 * which reuses the venvs already in the store.
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { findPython } from '../../lib/env/python.js';
import { openStore } from '../../lib/layers/index.js';
import { evaluate, prepareTasks } from '../../lib/swe/index.js';
import { loadTasks } from '../../lib/swe/tasks.js';
import { indexesMissing } from '../../benchmarks/suite/packageIndex.js';
import { buildWorkload } from '../../benchmarks/suite/workload.js';
import { tempDir } from '../helpers.js';

// The workload takes its sources and its venvs' packages from the local
// indexes, and its tests need the Python 3.11 with pytest that it asks for.
const skipReason =
  indexesMissing() ??
  (findPython({ version: '3.11', modules: ['pytest'] }) ? undefined : 'no Python 3.11 with pytest (the workload asks for it)') ??
  (existsSync('/usr/bin/unzip') ? undefined : 'unzip is not installed');
const suite = skipReason ? describe.skip : describe;
if (skipReason) console.warn(`workload tests skipped: ${skipReason}`);

suite('the suite workload (quick)', () => {
  const cache = tempDir('msbx-workload-');
  afterAll(() => cache.remove());

  it('is built from nothing, also after an interrupted build, and its tasks are right', { timeout: 300_000 }, async () => {
    // Interrupted once the first venv is built (the other one is being built
    // at the same time): the next build finishes the job and reuses that venv.
    const controller = new AbortController();
    const first = buildWorkload({
      size: 'quick',
      cacheDir: cache.path,
      signal: controller.signal,
      onProgress: (m) => {
        if (/built venv/.test(m)) controller.abort(new Error('interrupted by the test'));
      },
    });
    await expect(first).rejects.toThrow();
    const root = join(cache.path, 'w1');
    expect(existsSync(join(root, 'quick', 'workload.json'))).toBe(false);

    const messages: string[] = [];
    const w = await buildWorkload({ size: 'quick', cacheDir: cache.path, onProgress: (m) => messages.push(m) });
    // The second build reused what the first had built.
    expect(messages.filter((m) => /reused venv/.test(m)).length).toBeGreaterThanOrEqual(1);
    expect(messages.filter((m) => /(reused|built) venv/.test(m))).toHaveLength(2);

    expect(w.tasks.map((t) => t.instance_id).sort()).toEqual(['mpmath__mpmath-3', 'mpmath__mpmath-5', 'pytoolz__toolz-1', 'pytoolz__toolz-2']);
    expect(new Set(w.tasks.map((t) => t.repo))).toEqual(new Set(['pytoolz/toolz', 'mpmath/mpmath']));
    expect(w.envs.map((e) => [e.key, e.tasks.length])).toEqual([['toolz-1.1', 2], ['mpmath-1.4', 2]]);
    const loaded = loadTasks(w.tasksFile);
    expect(loaded.errors).toEqual([]);
    expect(loaded.tasks).toEqual(w.tasks);
    for (const task of w.tasks) {
      expect(task.FAIL_TO_PASS.length).toBeGreaterThan(0);
      expect(task.PASS_TO_PASS.length).toBeGreaterThan(5);
      // A real history: releases tagged, base_commit a child of the release it breaks.
      const repo = task.repo_path!;
      expect(execFileSync('git', ['-C', repo, 'rev-parse', `${task.base_commit}^`], { encoding: 'utf8' }).trim()).toBe(task.environment_setup_commit);
    }
    expect(execFileSync('git', ['-C', join(w.reposDir, 'mpmath'), 'tag', '--list', 'v*'], { encoding: 'utf8' }).split('\n').filter(Boolean)).toEqual(['v1.3.0', 'v1.4.1']);

    // Cached now: the same workload without building anything.
    const again = await buildWorkload({ size: 'quick', cacheDir: cache.path });
    expect(again.tasks).toEqual(w.tasks);

    const store = await openStore({ root: w.storeDir! });
    const prep = await prepareTasks(w.tasks, { store, installNetwork: w.packageIndex!.installNetwork });
    expect(prep.failures).toEqual([]);
    expect(prep.summary.envs).toEqual({ built: 0, reused: 2, failed: 0 });
    for (const task of w.tasks) {
      const prepared = prep.prepared.get(task.instance_id)!;
      // Each venv is a real one of 100 MB or more.
      const venv = await store.get(prepared.env!.venvDigest);
      expect(venv!.manifest.size).toBeGreaterThan(100e6);
      const gold = await evaluate(task, task.patch, { prepared, timeoutMs: 120_000 });
      expect(gold.report.resolved, `${task.instance_id} gold:\n${gold.log.slice(-2000)}`).toBe(true);
      const empty = await evaluate(task, '', { prepared });
      expect(empty.report.resolved).toBe(false);
    }
  });
});
