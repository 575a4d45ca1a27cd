/**
 * Built-in demo task set: small pure-Python repositories generated on the
 * fly (no network, no PyPI), each a real git repository whose HEAD is the
 * buggy base_commit, with gold/test patches produced by `git diff` so that
 * they apply with `git apply` exactly like SWE-bench's.
 */
import { existsSync, mkdirSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { SweError } from '../errors.js';
import type { Prediction } from '../predictions.js';
import type { Task } from '../tasks.js';
import { renderBuildBackend, renderPyproject } from './buildFiles.js';
import { git } from './git.js';
import { miniini } from './repos/miniini.js';
import { stackq } from './repos/stackq.js';
import { strkit } from './repos/strkit.js';
import { tinydate } from './repos/tinydate.js';
import type { DemoRepoSpec } from './spec.js';

export const DEMO_REPO_SPECS: readonly DemoRepoSpec[] = [strkit, tinydate, miniini, stackq];

export const DEMO_PYTHON = '3.11';
export const DEMO_INSTALL = ['python -m pip install --no-build-isolation --no-deps -e .'];
export const DEMO_MODEL_NAME = 'gold';

/** A fix that repairs only part of a task's bug (for grading tests/demos). */
export interface DemoPartialFix {
  instance_id: string;
  description: string;
  /** Unified git diff against base_commit. */
  patch: string;
  /** FAIL_TO_PASS tests this patch makes pass. */
  fixes: string[];
  /** FAIL_TO_PASS tests that still fail with it. */
  stillFailing: string[];
}

export interface DemoTaskSet {
  dir: string;
  /** `tasks.jsonl` (repo_path relative to it, so the directory can move). */
  tasksFile: string;
  /** `predictions.gold.jsonl`: the gold patches as SWE-bench predictions. */
  goldPredictionsFile: string;
  /** `predictions.partial.jsonl`: the partial fixes as predictions. */
  partialPredictionsFile: string;
  /** Tasks with absolute repo_path, as loadTasks(tasksFile) returns them. */
  tasks: Task[];
  partialFixes: DemoPartialFix[];
}

const CREATED_AT = '2024-03-01T12:00:00Z';

function writeFiles(root: string, files: Record<string, string>): void {
  for (const [path, text] of Object.entries(files)) {
    const target = join(root, path);
    mkdirSync(dirname(target), { recursive: true });
    writeFileSync(target, text);
  }
}

/** Diff of `files` written over HEAD (new files included), then undone. */
function diffOf(repoDir: string, files: Record<string, string>): string {
  writeFiles(repoDir, files);
  git(repoDir, ['add', '-A']);
  const diff = git(repoDir, ['diff', '--cached', '--no-color', '--no-ext-diff', 'HEAD']);
  git(repoDir, ['reset', '-q', '--hard', 'HEAD']);
  git(repoDir, ['clean', '-q', '-fdx']);
  if (diff.trim() === '') throw new SweError(`demo repo ${repoDir}: patch files produce an empty diff`);
  return diff;
}

function buildRepository(spec: DemoRepoSpec, repoDir: string): string {
  mkdirSync(repoDir, { recursive: true });
  const build = { name: spec.name, version: `${spec.version}.0`, sourceRoot: spec.sourceRoot, packages: spec.packages };
  writeFiles(repoDir, {
    ...spec.baseFiles,
    'pyproject.toml': renderPyproject(build),
    '_build/backend.py': renderBuildBackend(build),
    '.gitignore': '__pycache__/\n*.egg-info/\n.pytest_cache/\nbuild/\ndist/\n',
  });
  git(repoDir, ['init', '-q', '-b', 'main']);
  git(repoDir, ['add', '-A']);
  git(repoDir, ['commit', '-q', '-m', `${spec.name}: initial import`]);
  return git(repoDir, ['rev-parse', 'HEAD']).trim();
}

function makeTask(spec: DemoRepoSpec, repoPath: string, baseCommit: string, patch: string, testPatch: string): Task {
  return {
    instance_id: spec.instanceId,
    repo: spec.repo,
    base_commit: baseCommit,
    environment_setup_commit: baseCommit,
    version: spec.version,
    patch,
    test_patch: testPatch,
    FAIL_TO_PASS: [...spec.FAIL_TO_PASS],
    PASS_TO_PASS: [...spec.PASS_TO_PASS],
    python: DEMO_PYTHON,
    install: [...DEMO_INSTALL],
    // -p no:cacheprovider: the run must not write .pytest_cache into the repo.
    test_cmd: `python -m pytest -rA -p no:cacheprovider ${spec.testPaths.join(' ')}`,
    repo_path: repoPath,
    problem_statement: spec.problemStatement,
    created_at: CREATED_AT,
    log_parser: 'pytest',
  };
}

function toJsonl(records: object[]): string {
  return records.map((record) => JSON.stringify(record)).join('\n') + '\n';
}

/**
 * Writes the demo repositories under `dir/repos/` plus `tasks.jsonl` and
 * prediction files in `dir`, and returns the tasks. Refuses to overwrite an
 * existing demo repository rather than silently mixing old and new state.
 */
export function createDemoTaskSet(dir: string): DemoTaskSet {
  const root = resolve(dir);
  mkdirSync(root, { recursive: true });
  const tasks: Task[] = [];
  const partialFixes: DemoPartialFix[] = [];
  const fileTasks: Task[] = [];

  for (const spec of DEMO_REPO_SPECS) {
    const relativeRepo = join('repos', spec.name);
    const repoDir = join(root, relativeRepo);
    if (existsSync(repoDir)) {
      throw new SweError(`createDemoTaskSet: ${repoDir} already exists; use an empty directory`);
    }
    const baseCommit = buildRepository(spec, repoDir);
    const patch = diffOf(repoDir, spec.fixFiles);
    const testPatch = diffOf(repoDir, spec.testFiles);
    const task = makeTask(spec, repoDir, baseCommit, patch, testPatch);
    tasks.push(task);
    fileTasks.push({ ...task, repo_path: relativeRepo });
    if (spec.partialFix) {
      const stillFailing = spec.partialFix.stillFailing;
      partialFixes.push({
        instance_id: spec.instanceId,
        description: spec.partialFix.description,
        patch: diffOf(repoDir, spec.partialFix.files),
        fixes: spec.FAIL_TO_PASS.filter((id) => !stillFailing.includes(id)),
        stillFailing: [...stillFailing],
      });
    }
  }

  const tasksFile = join(root, 'tasks.jsonl');
  const goldPredictionsFile = join(root, 'predictions.gold.jsonl');
  const partialPredictionsFile = join(root, 'predictions.partial.jsonl');
  writeFileSync(tasksFile, toJsonl(fileTasks));
  const gold: Prediction[] = tasks.map((t) => ({ instance_id: t.instance_id, model_patch: t.patch, model_name_or_path: DEMO_MODEL_NAME }));
  writeFileSync(goldPredictionsFile, toJsonl(gold));
  const partial: Prediction[] = partialFixes.map((p) => ({ instance_id: p.instance_id, model_patch: p.patch, model_name_or_path: 'demo-partial' }));
  writeFileSync(partialPredictionsFile, toJsonl(partial));

  return { dir: root, tasksFile, goldPredictionsFile, partialPredictionsFile, tasks, partialFixes };
}
