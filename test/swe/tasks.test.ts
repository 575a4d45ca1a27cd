import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadPredictions, loadTasks, parsePredictions, parseTasks } from '../../lib/swe/tasks.js';
import { makeTempDir, removeDir } from './helpers.js';

const SHA = 'a'.repeat(40);
const valid = (overrides: Record<string, unknown> = {}): Record<string, unknown> => ({
  instance_id: 'org__proj-1',
  repo: 'org/proj',
  base_commit: SHA,
  version: '1.0',
  patch: 'diff --git a/x b/x\n',
  test_patch: 'diff --git a/t b/t\n',
  // SWE-bench ships these as JSON strings of lists.
  FAIL_TO_PASS: '["tests/t.py::test_a", "tests/t.py::test_p[a b-1]"]',
  PASS_TO_PASS: ['tests/t.py::test_b'],
  python: '3.11',
  install: ['python -m pip install -e .'],
  test_cmd: 'python -m pytest -rA tests/t.py',
  repo_path: 'repos/proj',
  ...overrides,
});
const jsonl = (...records: unknown[]): string => records.map((r) => JSON.stringify(r)).join('\n');

describe('parseTasks', () => {
  it('reads JSONL, decoding JSON-string test lists', () => {
    const { tasks, errors } = parseTasks(jsonl(valid()), 'jsonl');
    expect(errors).toEqual([]);
    expect(tasks[0]?.FAIL_TO_PASS).toEqual(['tests/t.py::test_a', 'tests/t.py::test_p[a b-1]']);
    expect(tasks[0]?.PASS_TO_PASS).toEqual(['tests/t.py::test_b']);
    expect(tasks[0]?.repo_path).toBe('repos/proj'); // no baseDir: left as written
  });

  it('reports each bad task with its id or line and the reasons, and keeps the good ones', () => {
    const text = [
      JSON.stringify(valid({ instance_id: 'good-1' })),
      '',
      JSON.stringify(valid({ instance_id: 'bad-fields', patch: undefined, PASS_TO_PASS: 'not json', python: 3.1 })),
      '{"instance_id": "broken", ',
      JSON.stringify(valid({ instance_id: 'bad-commit', base_commit: 'main', repo_path: undefined, FAIL_TO_PASS: [] })),
      JSON.stringify(['not', 'an', 'object']),
      JSON.stringify(valid({ instance_id: 'good-1' })),
      JSON.stringify(valid({ instance_id: 'bad-parser', log_parser: 'nose', install: [1] })),
      JSON.stringify(valid({ instance_id: 'good-2', repo_path: undefined, repo_url: 'https://example.org/x.git' })),
    ].join('\r\n');
    const { tasks, errors } = parseTasks(text, 'jsonl');
    expect(tasks.map((t) => t.instance_id)).toEqual(['good-1', 'good-2']);
    expect(errors.map((e) => [e.line, e.instance_id])).toEqual([
      [3, 'bad-fields'],
      [4, undefined],
      [5, 'bad-commit'],
      [6, undefined],
      [7, 'good-1'],
      [8, 'bad-parser'],
    ]);
    const [fields, json, commit, notObject, duplicate, parser] = errors;
    expect(fields?.message).toMatch(/^task "bad-fields" \(line 3\): /);
    expect(fields?.problems).toEqual([
      'missing field "patch"',
      '"PASS_TO_PASS" is a string but not a JSON list: ' + fields?.problems[1]?.split(': ').slice(1).join(': '),
      '"python" must be a string, got a number',
    ]);
    expect(json?.message).toMatch(/^task at line 4: invalid JSON/);
    expect(commit?.problems).toEqual([
      '"base_commit" must be a commit SHA (7-40 lowercase hex digits), got "main"',
      '"FAIL_TO_PASS" must list at least one test',
      'needs "repo_path" or "repo_url" to know where the git repository is (or an "image" that holds it)',
    ]);
    expect(notObject?.problems).toEqual(['must be a JSON object, got an array']);
    expect(duplicate?.problems).toEqual(['duplicate instance_id (first defined at line 1)']);
    expect(parser?.problems).toEqual([
      '"install"[0] must be a string, got a number',
      '"log_parser" must be one of pytest, unittest, got "nose"',
    ]);
  });

  it('reads a JSON array and names entries by index', () => {
    const { tasks, errors } = parseTasks(JSON.stringify([valid(), valid({ instance_id: 'x', FAIL_TO_PASS: [1] })]), 'json');
    expect(tasks).toHaveLength(1);
    expect(errors[0]?.message).toBe('task "x" (entry 1): "FAIL_TO_PASS"[0] must be a string, got a number');
  });

  it('takes install as one string, as SWE-bench specs write it: one command', () => {
    const { tasks, errors } = parseTasks(jsonl(valid({ install: 'pip install -e . && pip install pytest' }), valid({ instance_id: 'empty', install: ' ' })), 'jsonl');
    expect(tasks.map((t) => t.install)).toEqual([['pip install -e . && pip install pytest']]);
    expect(errors.map((e) => e.message)).toEqual(['task "empty" (line 2): "install" must not be empty']);
  });

  it('accepts tasks without test lists when they are to be derived, and only then', () => {
    const bare = valid({ instance_id: 'bare', FAIL_TO_PASS: undefined, PASS_TO_PASS: undefined });
    const withEmpty = valid({ instance_id: 'empty-f2p', FAIL_TO_PASS: [] });
    const derived = parseTasks(jsonl(bare, withEmpty), 'jsonl', { testLists: 'optional' });
    expect(derived.errors).toEqual([]);
    expect(derived.tasks.map((t) => [t.FAIL_TO_PASS, t.PASS_TO_PASS])).toEqual([[[], []], [[], ['tests/t.py::test_b']]]);
    const strict = parseTasks(jsonl(bare, withEmpty), 'jsonl');
    expect(strict.errors.map((e) => e.problems)).toEqual([
      ['missing field "FAIL_TO_PASS"', 'missing field "PASS_TO_PASS"'],
      ['"FAIL_TO_PASS" must list at least one test'],
    ]);
  });

  it('takes an image instead of the venv recipe and the repository, with isolation and repo_dir checked', () => {
    const imageOnly = valid({ instance_id: 'img-1', python: undefined, install: undefined, repo_path: undefined, image: 'sweb.eval.x86_64.org__proj-1:latest' });
    const withAll = valid({ instance_id: 'img-2', image: 'reg.example.org/x:1', repo_dir: '/src/proj', isolation: 'docker' });
    const { tasks, errors } = parseTasks(
      jsonl(
        imageOnly,
        withAll,
        valid({ instance_id: 'bad-iso', image: 'x:1', isolation: 'vm' }),
        valid({ instance_id: 'docker-no-image', isolation: 'docker' }),
        valid({ instance_id: 'dir-no-image', repo_dir: '/testbed' }),
        valid({ instance_id: 'bad-dir', image: 'x:1', repo_dir: 'testbed' }),
        valid({ instance_id: 'no-python', python: undefined }),
      ),
      'jsonl',
    );
    expect(tasks.map((t) => [t.instance_id, t.image, t.python, t.install, t.repo_dir, t.isolation])).toEqual([
      ['img-1', 'sweb.eval.x86_64.org__proj-1:latest', undefined, [], undefined, undefined],
      ['img-2', 'reg.example.org/x:1', '3.11', ['python -m pip install -e .'], '/src/proj', 'docker'],
    ]);
    expect(errors.map((e) => [e.instance_id, e.problems])).toEqual([
      ['bad-iso', ['"isolation" must be one of sandbox, docker, got "vm"']],
      ['docker-no-image', ['"isolation": "docker" needs an "image" to run (Docker cannot run a venv recipe)']],
      ['dir-no-image', ['"repo_dir" needs an "image" (a venv task\'s repository is always at /testbed)']],
      ['bad-dir', ['"repo_dir" must be an absolute path below / without "..", got "testbed"']],
      ['no-python', ['missing field "python"']],
    ]);
  });

  it('throws for a JSON document that is not an array of tasks', () => {
    expect(() => parseTasks('{"a": 1}', 'json')).toThrow('tasks JSON must be an array of objects, got an object');
    expect(() => parseTasks('[{', 'json')).toThrow(/tasks JSON is not valid JSON/);
  });
});

describe('loadTasks / loadPredictions', () => {
  let dir = '';
  beforeAll(() => {
    dir = makeTempDir('tasks');
  });
  afterAll(() => removeDir(dir));

  it('resolves relative repo_path against the task file and picks the format from the name', () => {
    writeFileSync(join(dir, 'set.jsonl'), jsonl(valid()));
    writeFileSync(join(dir, 'set.json'), JSON.stringify([valid()]));
    writeFileSync(join(dir, 'set.txt'), `\ufeff  ${JSON.stringify([valid()])}`);
    for (const name of ['set.jsonl', 'set.json', 'set.txt']) {
      const { tasks, errors } = loadTasks(join(dir, name));
      expect(errors).toEqual([]);
      expect(tasks[0]?.repo_path).toBe(join(dir, 'repos/proj'));
    }
  });

  it('resolves an image file given as ./ or ../ against the task file, and leaves references alone', () => {
    const file = valid({ instance_id: 'f', image: './images/app.tar' });
    const ref = valid({ instance_id: 'r', image: 'msbx-test/app:1' });
    writeFileSync(join(dir, 'images.jsonl'), jsonl(file, ref));
    const { tasks } = loadTasks(join(dir, 'images.jsonl'));
    expect(tasks.map((t) => t.image)).toEqual([join(dir, 'images/app.tar'), 'msbx-test/app:1']);
  });

  it('names the file when it cannot be read', () => {
    expect(() => loadTasks(join(dir, 'missing.jsonl'))).toThrow(`cannot read task file ${join(dir, 'missing.jsonl')}: ENOENT`);
  });

  it('loads predictions from JSONL, arrays and id-keyed objects', () => {
    const a = { instance_id: 'a', model_patch: 'diff', model_name_or_path: 'm' };
    const b = { instance_id: 'b', model_patch: null, model_name_or_path: 'm' };
    writeFileSync(join(dir, 'preds.jsonl'), jsonl(a, b, { instance_id: 'c', model_name_or_path: 'm' }, a));
    const fromJsonl = loadPredictions(join(dir, 'preds.jsonl'));
    expect(fromJsonl.predictions).toEqual([a, b]);
    expect(fromJsonl.errors.map((e) => e.message)).toEqual([
      'prediction "c" (line 3): missing field "model_patch" (use null for "no patch")',
      'prediction "a" (line 4): duplicate instance_id (first defined at line 1)',
    ]);
    expect(parsePredictions(JSON.stringify([a, b]), 'json').predictions).toEqual([a, b]);
    const keyed = parsePredictions(JSON.stringify({ a: { model_patch: 'diff', model_name_or_path: 'm' }, z: b }), 'json');
    expect(keyed.predictions).toEqual([a]);
    expect(keyed.errors[0]?.message).toBe('prediction "b" (entry "z"): instance_id "b" does not match its key "z"');
  });
});
