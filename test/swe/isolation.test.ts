/**
 * Per-task isolation: tasks that name an image, evaluated in a Docker
 * container of it and in a sandbox of it, against a plain `docker run` of
 * the same image as the reference. Real images (the fixtures' msbx-test/base:1,
 * Debian with python3, git and patch), a real engine. Skips with the reason
 * where Docker or the fixture image is missing.
 */
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { listImages, openImageStore, removeImage } from '../../lib/images/index.js';
import type { LayerStore } from '../../lib/layers/store.js';
import { dockerUnavailable, liveDockerContainers } from '../../lib/swe/pipeline/docker.js';
import { evaluate } from '../../lib/swe/pipeline/evaluate.js';
import { prepareTasks, type PrepareResult } from '../../lib/swe/pipeline/prepare.js';
import { evaluateAll } from '../../lib/swe/pipeline/runReport.js';
import type { IsolationKind } from '../../lib/swe/pipeline/types.js';
import { parseTestLog } from '../../lib/swe/logParsers.js';
import { parseTasks, type Task } from '../../lib/swe/tasks.js';
import { tempDir } from '../helpers.js';
import { imageFixtures, IMAGES } from '../images/fixtures.js';

const BASE = 'msbx-test/base:1';
/** The same image as a `docker save` archive (the fixtures'); used where it exists. */
const BASE_ARCHIVE = '/var/cache/minisandbox/images/base.tar';
const CLI = fileURLToPath(new URL('../../dist/lib/cli/main.js', import.meta.url));
/** Built here FROM the base, with the repository at /testbed as SWE-bench's instance images have it; removed after. */
const TASK_IMAGE = 'msbx-test/swe-task:1';

function sh(cmd: string, args: string[], opts: { cwd?: string; input?: string } = {}): { code: number | null; out: string; err: string } {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 300_000, ...opts });
  return { code: r.status, out: r.stdout ?? '', err: r.stderr ?? r.error?.message ?? '' };
}

/** Why these tests cannot run here, or undefined. */
async function skipReason(): Promise<string | undefined> {
  const why = await dockerUnavailable();
  if (why) return why;
  if (sh('docker', ['image', 'inspect', BASE]).code !== 0) return `the fixture image ${BASE} is not in Docker (scripts/test-images.sh builds it)`;
  return undefined;
}
const skip = await skipReason();
if (skip) console.warn(`skipping per-task isolation tests: ${skip}`);
const suite = skip ? describe.skip : describe;

const CALC = 'def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n';
const TESTS = 'import unittest\n\nfrom calc import add, mul\n\n\nclass TestCalc(unittest.TestCase):\n    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n';
const TEST_PATCH = [
  'diff --git a/tests/test_calc.py b/tests/test_calc.py',
  '--- a/tests/test_calc.py',
  '+++ b/tests/test_calc.py',
  '@@ -7,3 +7,6 @@ from calc import add, mul',
  ' class TestCalc(unittest.TestCase):',
  '     def test_mul(self):',
  '         self.assertEqual(mul(2, 3), 6)',
  '+',
  '+    def test_add(self):',
  '+        self.assertEqual(add(2, 3), 5)',
  '',
].join('\n');
const calcPatch = (line: string) =>
  ['diff --git a/calc.py b/calc.py', '--- a/calc.py', '+++ b/calc.py', '@@ -1,5 +1,5 @@', ' def add(a, b):', '-    return a - b', `+    ${line}`, ' ', ' ', ' def mul(a, b):', ''].join('\n');
const GOLD = calcPatch('return a + b');
const WRONG = calcPatch('return a + b + 1');
const ADD = 'tests.test_calc.TestCalc.test_add';
const MUL = 'tests.test_calc.TestCalc.test_mul';
const TEST_CMD = 'python3 -m unittest -v tests.test_calc';

let dir: ReturnType<typeof tempDir>;
let store: LayerStore;
let commit: string;
let repoPath: string;
let imageBuilt = false;

function task(id: string, fields: Partial<Task>): Task {
  return {
    instance_id: id,
    repo: 'msbx/calc',
    base_commit: commit,
    version: '1.0',
    patch: GOLD,
    test_patch: TEST_PATCH,
    FAIL_TO_PASS: [ADD],
    PASS_TO_PASS: [MUL],
    install: [],
    test_cmd: TEST_CMD,
    log_parser: 'unittest',
    ...fields,
  };
}

beforeAll(async () => {
  if (skip) return;
  dir = tempDir('msbx-swe-isolation-');
  // The images room's store: an unprivileged caller's image layers carry its
  // subordinate ids, which only the room's remover can delete.
  store = await openImageStore({ root: join(dir.path, 'store') });
  repoPath = join(dir.path, 'context', 'repo');
  mkdirSync(join(repoPath, 'tests'), { recursive: true });
  writeFileSync(join(repoPath, 'calc.py'), CALC);
  writeFileSync(join(repoPath, 'tests', '__init__.py'), '');
  writeFileSync(join(repoPath, 'tests', 'test_calc.py'), TESTS);
  const git = (...args: string[]) => sh('git', ['-c', 'user.name=t', '-c', 'user.email=t@example.org', '-c', 'init.defaultBranch=main', ...args], { cwd: repoPath });
  git('init', '-q');
  git('add', '-A');
  expect(git('commit', '-qm', 'calc with a bug').code).toBe(0);
  commit = git('rev-parse', 'HEAD').out.trim();
  writeFileSync(join(dir.path, 'context', 'Dockerfile'), `FROM ${BASE}\nCOPY repo /testbed\n`);
  const build = sh('docker', ['build', '--quiet', '--tag', TASK_IMAGE, join(dir.path, 'context')]);
  expect(build.code, build.err).toBe(0);
  imageBuilt = true;
}, 300_000);

afterAll(async () => {
  if (imageBuilt) sh('docker', ['image', 'rm', '--force', TASK_IMAGE]);
  if (store) {
    for (const r of await listImages(store)) await removeImage(store, r.id);
    await store.gc();
  }
  dir?.remove();
}, 120_000);

/**
 * The reference: `docker run` of the image, the patches applied by hand, the
 * test command, the log parsed by the same parser.
 */
function dockerRunStatuses(image: string, patch: string): Record<string, string> {
  const patches = join(dir.path, `patches-${Math.random().toString(36).slice(2)}`);
  mkdirSync(patches, { mode: 0o755 });
  writeFileSync(join(patches, 'patch.diff'), patch, { mode: 0o644 });
  writeFileSync(join(patches, 'test.diff'), TEST_PATCH, { mode: 0o644 });
  const r = sh('docker', ['run', '--rm', '--network', 'none', '--user', '0:0', '-v', `${patches}:/p:ro`, image,
    'bash', '-c', `cd /testbed && git apply /p/patch.diff && git apply /p/test.diff && ${TEST_CMD} 2>&1`]);
  return Object.fromEntries(parseTestLog(r.out, { parser: 'unittest' }));
}

const EXPECTED = {
  gold: { statuses: { [ADD]: 'PASSED', [MUL]: 'PASSED' }, resolved: true },
  wrong: { statuses: { [ADD]: 'FAILED', [MUL]: 'PASSED' }, resolved: false },
};

suite('tasks that name an image', () => {
  let prep: PrepareResult;
  const registry = imageFixtures().registry;
  if (!registry) console.warn(`per-task isolation: no pulled image: ${imageFixtures().registrySkip}`);
  // The repo in the image (as SWE-bench's instance images), or checked out
  // from repo_path into /testbed of the bare base image.
  const variants = (): Record<string, Partial<Task>> => ({
    'in-image': { image: TASK_IMAGE },
    'checked-out': { image: BASE, repo_path: repoPath },
    ...(existsSync(BASE_ARCHIVE) ? { 'from-file': { image: BASE_ARCHIVE, repo_path: repoPath } } : {}),
    // Pulled from the fixtures' loopback registry (plain HTTP, as Docker allows there); its USER is dev, the evaluation runs as root.
    ...(registry ? { pulled: { image: `${registry}/${IMAGES.app}`, repo_path: repoPath } } : {}),
  });
  const kinds: Array<{ isolation: 'docker' | 'sandbox'; kind: IsolationKind }> = [
    { isolation: 'docker', kind: 'docker' },
    { isolation: 'sandbox', kind: 'sandbox-image' },
  ];
  const tasks = () => kinds.flatMap(({ isolation }) => Object.entries(variants()).map(([v, fields]) => task(`calc-${v}-${isolation}`, { ...fields, isolation })));

  beforeAll(async () => {
    prep = await prepareTasks(tasks(), { store, concurrency: 2, stateDir: join(dir.path, 'state') });
  }, 300_000);

  it('prepares each image once per place, and each checkout', () => {
    expect(prep.failures).toEqual([]);
    expect(prep.summary.images.failed).toBe(0);
    // Each image (a name, or a file) once in Docker, and once in the store when sandboxes of images run here.
    const images = Object.keys(variants()).length;
    expect(prep.summary.images.fetched + prep.summary.images.reused).toBe(images * kinds.length);
    expect(prep.summary.isolation.docker).toBe(images);
    for (const p of prep.prepared.values()) expect(p.repoDir).toBe('/testbed');
    expect(prep.prepared.get('calc-checked-out-docker')!.image!.repoDigest).toMatch(/^[0-9a-f]{64}$/);
    expect(prep.prepared.get('calc-in-image-docker')!.image!.repoDigest).toBeUndefined();
  });

  for (const [which, patch] of [['gold', GOLD], ['wrong', WRONG]] as const) {
    it(`gives docker run's per-test outcomes for the ${which} patch, in every isolation`, async () => {
      const reference = dockerRunStatuses(TASK_IMAGE, patch);
      expect(reference).toEqual(EXPECTED[which].statuses);
      for (const t of tasks()) {
        const r = await evaluate(t, patch, { prepared: prep.prepared.get(t.instance_id)!, timeoutMs: 120_000, sandbox: { stateDir: join(dir.path, 'state') } });
        const seen = { id: t.instance_id, error: r.error, statuses: r.statuses, resolved: r.reward.resolved, isolation: r.isolation };
        expect(seen).toEqual({ id: t.instance_id, error: undefined, statuses: reference, resolved: EXPECTED[which].resolved, isolation: t.isolation === 'docker' ? 'docker' : 'sandbox-image' });
        expect(r.applyMethod).toBe('git apply --verbose');
        expect(r.timings.testCommandMs).toBeGreaterThan(0);
      }
    }, 300_000);
  }

  it('names each instance\'s isolation and time in the report', async () => {
    const all = tasks();
    const { report } = await evaluateAll(all, all.map((t) => ({ instance_id: t.instance_id, model_patch: GOLD, model_name_or_path: 'gold' })), {
      prepared: prep.prepared,
      concurrency: 2,
      timeoutMs: 120_000,
      sandbox: { stateDir: join(dir.path, 'state') },
    });
    expect(report.resolved_instances).toBe(all.length);
    expect(report.isolation).toEqual(Object.fromEntries(all.map((t) => [t.instance_id, t.isolation === 'docker' ? 'docker' : 'sandbox-image'])));
    expect(Object.keys(report.timing_medians_by_isolation)).toEqual(kinds.map((k) => k.kind).sort());
    for (const t of all) expect(report.timings[t.instance_id]!.totalMs).toBeGreaterThan(0);
  }, 300_000);

  it('kills a hanging test run in Docker at its timeout, and removes the container', async () => {
    const t = { ...task('calc-in-image-docker', { image: TASK_IMAGE, isolation: 'docker' }), test_cmd: 'sleep 600' };
    const started = Date.now();
    const r = await evaluate(t, GOLD, { prepared: prep.prepared.get(t.instance_id)!, timeoutMs: 2000 });
    expect(Date.now() - started).toBeLessThan(30_000);
    expect(r.timedOut).toBe(true);
    expect(r.reward.reason).toBe('tests timed out');
    expect(liveDockerContainers()).toEqual([]);
  }, 60_000);

  it('eval --isolation docker runs a task set in Docker and reports it (and removes what a killed run left)', () => {
    // A container as a run killed by SIGKILL leaves it: its owner (host:pid:start) is gone.
    const orphan = `msbx-swe-orphan-${process.pid}`;
    const made = sh('docker', ['create', '--name', orphan, '--label', `minisandbox.swe.owner=${hostname()}:2147483646:1`, TASK_IMAGE, 'true']);
    expect(made.code, made.err).toBe(0);
    const set = join(dir.path, 'cli-tasks.jsonl');
    const t = task('calc-cli', { image: TASK_IMAGE });
    writeFileSync(set, `${JSON.stringify(t)}\n`);
    const reportFile = join(dir.path, 'cli-report.json');
    const r = sh(process.execPath, [CLI, 'eval', set, '--gold', '--isolation', 'docker', '--store', store.root, '--report', reportFile]);
    expect(r.code, r.err).toBe(0);
    expect(r.out).toMatch(/calc-cli\s+docker\s+yes/);
    const report = JSON.parse(readFileSync(reportFile, 'utf8'));
    expect(report.isolation).toEqual({ 'calc-cli': 'docker' });
    expect(report.resolved_ids).toEqual(['calc-cli']);
    expect(sh('docker', ['ps', '--all', '--filter', `name=${orphan}`, '--format', '{{.Names}}']).out.trim()).toBe('');
    const bad = sh(process.execPath, [CLI, 'eval', set, '--gold', '--isolation', 'vm']);
    expect(bad.code).toBe(2);
    expect(bad.err).toContain("--isolation: expected sandbox or docker, got 'vm'");
  }, 120_000);

  it('removes the container when an evaluation is aborted', async () => {
    const t = { ...task('calc-in-image-docker', { image: TASK_IMAGE, isolation: 'docker' }), test_cmd: 'sleep 600' };
    const ac = new AbortController();
    const pending = evaluate(t, GOLD, { prepared: prep.prepared.get(t.instance_id)!, signal: ac.signal });
    while (liveDockerContainers().length === 0) await new Promise((r) => setTimeout(r, 50));
    await new Promise((r) => setTimeout(r, 1000)); // into the test command
    ac.abort();
    const r = await pending;
    expect(r.error).toMatch(/aborted/);
    expect(liveDockerContainers()).toEqual([]);
  }, 60_000);

  it('removes its containers when eval is interrupted (SIGINT, as Ctrl-C)', async () => {
    const set = join(dir.path, 'cli-hang.jsonl');
    writeFileSync(set, `${JSON.stringify({ ...task('calc-hang', { image: TASK_IMAGE, isolation: 'docker' }), test_cmd: 'sleep 600' })}\n`);
    const child = spawn(process.execPath, [CLI, 'eval', set, '--gold', '--store', store.root], { stdio: 'ignore' });
    const exited = new Promise<NodeJS.Signals | null>((resolve) => child.on('exit', (_code, signal) => resolve(signal)));
    const running = () => sh('docker', ['ps', '--filter', 'name=msbx-swe-calc-hang-', '--format', '{{.Names}}']).out.trim();
    const deadline = Date.now() + 30_000;
    while (running() === '' && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
    expect(running()).not.toBe('');
    child.kill('SIGINT');
    expect(await exited).toBe('SIGINT'); // it still dies of the signal, as without the handler
    expect(sh('docker', ['ps', '--all', '--filter', 'name=msbx-swe-calc-hang-', '--format', '{{.Names}}']).out.trim()).toBe('');
  }, 60_000);

  it('leaves no container behind', () => {
    expect(liveDockerContainers()).toEqual([]);
    const left = sh('docker', ['ps', '--all', '--filter', 'name=msbx-swe-calc-', '--format', '{{.Names}}']).out.trim();
    expect(left).toBe('');
  });
});

suite('isolation that cannot be', () => {
  it('refuses a task marked docker without an image when the file is read', () => {
    const line = JSON.stringify({ ...task('venv-only', { python: '3.11', install: [], repo_path: '/x' }), isolation: 'docker' });
    const { tasks, errors } = parseTasks(line, 'jsonl');
    expect(tasks).toEqual([]);
    expect(errors[0]!.message).toBe('task "venv-only" (line 1): "isolation": "docker" needs an "image" to run (Docker cannot run a venv recipe)');
  });

  it('fails a venv task alone under --isolation docker, with the reason', async () => {
    const venv = task('venv-only', { python: '3.11', install: [], repo_path: repoPath });
    const image = task('calc-in-image', { image: TASK_IMAGE });
    const r = await prepareTasks([venv, image], { store, isolation: 'docker' });
    expect(r.failures).toEqual([
      { instance_id: 'venv-only', stage: 'validate', message: 'task "venv-only": isolation docker (--isolation) needs an "image": the task has a venv recipe only, which Docker cannot run' },
    ]);
    expect(r.prepared.get('calc-in-image')!.isolation).toBe('docker');
  }, 120_000);

  it('fails a task whose image Docker cannot have, alone', async () => {
    const r = await prepareTasks([task('nope', { image: '127.0.0.1:1/msbx-test/none:1', isolation: 'docker' })], { store });
    expect(r.failures[0]).toMatchObject({ instance_id: 'nope', stage: 'image' });
    expect(r.failures[0]!.message).toMatch(/^task "nope": image 127\.0\.0\.1:1\/msbx-test\/none:1: not in Docker, and pulling it: docker pull failed/);
  }, 120_000);
});
