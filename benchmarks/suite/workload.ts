/**
 * The benchmark suite's workload (issue 13): real Python projects with
 * their git histories and test suites, SWE-bench-like tasks on them, a venv
 * of 100 MB or more per environment, and, on request, Docker images built
 * the way SWE-bench builds them. What it is made of: specs.ts.
 *
 * Usage: node dist/benchmarks/suite/workload.js [--quick] [--docker] [--cache DIR] [--check]
 *
 * Layout of the cache (everything keyed by WORKLOAD_VERSION, so a changed
 * builder builds anew next to the old one):
 *   <cache>/w<V>/repos/<name>/          git repositories (shared by quick and full)
 *   <cache>/w<V>/store/                 the layer store the tasks were derived in
 *   <cache>/w<V>/<size>/tasks.jsonl     the task set (repo_path relative to it)
 *   <cache>/w<V>/<size>/predictions.gold.jsonl
 *   <cache>/w<V>/<size>/timings.json    how long each part took (Docker images too)
 *   <cache>/w<V>/<size>/workload.json   written last: a set without it is rebuilt
 */
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, readdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, relative, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { openStore } from '../../lib/layers/index.js';
import { deriveTestLists } from '../../lib/swe/derive.js';
import { git } from '../../lib/swe/demo/git.js';
import { SweError } from '../../lib/swe/errors.js';
import { TaskEnvs } from '../../lib/swe/pipeline/taskEnvs.js';
import { evaluateAll, prepareTasks } from '../../lib/swe/pipeline/index.js';
import { loadTasks, type Task } from '../../lib/swe/tasks.js';
import { dockerCommand, DockerUnavailable, ensureDocker, hostImagePaths, importImage, stopDocker, type DockerHandle } from '../lib/docker.js';
import { flag, readArgs, text } from '../lib/args.js';
import { exec } from '../lib/proc.js';
import { indexesMissing, serveIndexes, WHEEL_DIRS } from './packageIndex.js';
import { BUGS, ENVS, instanceId, QUICK, releaseOf, REPOS, type BugSpec, type EnvSpec, type RepoSpec } from './specs.js';
import type { BuildWorkloadOptions, Workload, WorkloadDockerImages, WorkloadEnv, WorkloadSize } from './workload-types.js';

/** Bump when anything that goes into the workload changes: a new version builds anew. */
export const WORKLOAD_VERSION = 1;
/** Every image the suite builds is named under this prefix (the runner cleans up and measures by it). */
export const IMAGE_PREFIX = 'msbx-suite';
/** How long one test command may run while deriving (they take a few seconds). */
const TEST_TIMEOUT_MS = 5 * 60_000;

export function defaultCacheDir(): string {
  return process.getuid?.() === 0 ? '/var/cache/minisandbox/bench-suite' : join(process.env.XDG_CACHE_HOME ?? join(homedir(), '.cache'), 'minisandbox', 'bench-suite');
}

export interface WorkloadTimings {
  reposMs: number;
  /** prepare (venvs, repository layers) and the two test runs per task. */
  deriveMs: number;
  docker?: {
    /** Whole image build, from an engine that has none of them. */
    totalMs: number;
    base: { image: string; ms: number; reused: boolean };
    envs: Record<string, { image: string; ms: number; reused: boolean }>;
    instances: Record<string, { image: string; ms: number; reused: boolean }>;
  };
}

type Log = (message: string) => void;

function checkAbort(signal?: AbortSignal): void {
  if (signal?.aborted) throw new SweError(`building the workload was aborted: ${String(signal.reason ?? 'abort')}`);
}

// ---------------------------------------------------------------- repositories

function findWheel(project: string, version: string): string {
  const prefix = `${project.toLowerCase().replace(/-/g, '_')}-${version}-`;
  for (const dir of WHEEL_DIRS) {
    if (!existsSync(dir)) continue;
    const hit = readdirSync(dir).find((f) => f.startsWith(prefix) && f.endsWith('-none-any.whl'));
    if (hit) return join(dir, hit);
  }
  throw new SweError(`workload: no wheel of ${project} ${version} in ${WHEEL_DIRS.join(', ')} (the local package indexes)`);
}

/** Lines of the top-level or method `def <name>(` with its decorators, to hold the test back. */
function testBlock(lines: string[], name: string, file: string): [number, number] {
  // "Class::method" (pytest's id) or a top-level "function".
  const [cls, method] = name.includes('::') ? name.split('::') : [undefined, name];
  const from = cls === undefined ? 0 : lines.findIndex((l) => new RegExp(`^class ${cls}\\b`).test(l));
  const at = from < 0 ? -1 : lines.findIndex((l, i) => i > from && new RegExp(`^${cls === undefined ? '' : '\\s+'}def ${method}\\(`).test(l));
  if (at < 0) throw new SweError(`workload spec: no test ${name} in ${file}`);
  const indent = lines[at]!.length - lines[at]!.trimStart().length;
  let start = at;
  while (start > 0 && lines[start - 1]!.trimStart().startsWith('@') && lines[start - 1]!.length - lines[start - 1]!.trimStart().length === indent) start--;
  let end = at + 1;
  while (end < lines.length && (lines[end]!.trim() === '' || lines[end]!.length - lines[end]!.trimStart().length > indent)) end++;
  return [start, end];
}

interface Draft {
  bug: BugSpec;
  env: EnvSpec;
  baseCommit: string;
  setupCommit: string;
  patch: string;
  testPatch: string;
}

/**
 * One repository: a commit per release (the wheel's package tree, tests
 * included), tagged v<release>; then per bug a commit on its release that
 * brings the bug and holds its test back (tagged task/<n>), with the fix and
 * the test as diffs against it. Deterministic (fixed identity and dates):
 * the same specs give the same SHAs on every machine, so a rebuilt
 * repository keeps the store's venvs and repository layers valid.
 */
function buildRepository(spec: RepoSpec, dir: string, bugs: readonly BugSpec[]): Map<number, Omit<Draft, 'env'>> {
  const tmp = `${dir}.tmp`;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { recursive: true });
  git(tmp, ['init', '-q', '-b', 'main']);
  const releaseCommits = new Map<string, string>();
  for (const release of spec.releases) {
    for (const entry of readdirSync(tmp)) if (entry !== '.git') rmSync(join(tmp, entry), { recursive: true, force: true });
    execFileSync('unzip', ['-q', '-o', findWheel(spec.project, release), '-x', '*.dist-info/*', '-d', tmp], { stdio: ['ignore', 'ignore', 'pipe'] });
    writeFileSync(join(tmp, '.gitignore'), '__pycache__/\n*.pyc\n.pytest_cache/\n.hypothesis/\n');
    writeFileSync(join(tmp, 'README.md'), `# ${spec.project} ${release}\n\nThe package tree of ${spec.project} ${release} as released (upstream: https://github.com/${spec.repo}), for MiniSandbox's benchmark suite.\n`);
    git(tmp, ['add', '-A']);
    git(tmp, ['commit', '-q', '-m', `Release ${release}`]);
    git(tmp, ['tag', `v${release}`]);
    releaseCommits.set(release, git(tmp, ['rev-parse', 'HEAD']).trim());
  }
  const drafts = new Map<number, Omit<Draft, 'env'>>();
  for (const bug of bugs) {
    const release = releaseOf(spec, bug.version);
    git(tmp, ['checkout', '-q', `v${release}`]);
    const path = join(tmp, bug.file);
    const source = readFileSync(path, 'utf8');
    if (source.split(bug.find).length !== 2) throw new SweError(`workload spec: ${spec.name}-${bug.n}: the text to change must occur once in ${bug.file} at ${release}`);
    const testPath = join(tmp, bug.testFile);
    const tests = readFileSync(testPath, 'utf8');
    const lines = tests.split('\n');
    const [start, end] = testBlock(lines, bug.testName, bug.testFile);
    writeFileSync(path, source.replace(bug.find, bug.replace));
    writeFileSync(testPath, [...lines.slice(0, start), ...lines.slice(end)].join('\n'));
    git(tmp, ['add', '-A']);
    git(tmp, ['commit', '-q', '-m', `${bug.file}: ${bug.statement.split('.')[0]}`]);
    git(tmp, ['tag', `task/${bug.n}`]);
    const baseCommit = git(tmp, ['rev-parse', 'HEAD']).trim();
    const diff = (file: string, text: string) => {
      writeFileSync(join(tmp, file), text);
      const d = git(tmp, ['diff', '--no-color', '--no-ext-diff', '--', file]);
      git(tmp, ['checkout', '-q', '--', file]);
      return d;
    };
    drafts.set(bug.n, { bug, baseCommit, setupCommit: releaseCommits.get(release)!, patch: diff(bug.file, source), testPatch: diff(bug.testFile, tests) });
  }
  git(tmp, ['checkout', '-q', 'main']);
  rmSync(dir, { recursive: true, force: true });
  renameSync(tmp, dir);
  return drafts;
}

/**
 * The repository, built once per content (its spec, its bugs, the wheels'
 * names, the builder's version): a record next to it holds what the build
 * found, so a later build (the other size, a rebuild after an interruption)
 * leaves a repository another process may be reading alone.
 */
function repository(spec: RepoSpec, dir: string, bugs: readonly BugSpec[]): Map<number, Omit<Draft, 'env'>> {
  const key = createHash('sha256').update(JSON.stringify({ v: WORKLOAD_VERSION, spec, bugs, wheels: spec.releases.map((r) => findWheel(spec.project, r)) })).digest('hex');
  const record = `${dir}.json`;
  if (existsSync(record) && existsSync(dir)) {
    const saved = JSON.parse(readFileSync(record, 'utf8')) as { key: string; drafts: [number, Omit<Draft, 'env'>][] };
    if (saved.key === key) return new Map(saved.drafts);
  }
  rmSync(record, { force: true });
  const drafts = buildRepository(spec, dir, bugs);
  writeFileSync(record, JSON.stringify({ key, drafts: [...drafts] }) + '\n');
  return drafts;
}

/**
 * An environment's install: from the served package indexes, which pip finds
 * in PIP_INDEX_URL / PIP_EXTRA_INDEX_URL (packageIndex.ts), so the command,
 * and with it the venv's recipe key, names no port.
 */
function installCommands(packages: readonly string[]): string[] {
  return [`python -m pip install --no-cache-dir --disable-pip-version-check --only-binary=:all: ${packages.map((p) => `'${p}'`).join(' ')}`];
}

function taskOf(draft: Draft, repoPath: string): Task {
  const { bug, env } = draft;
  const repo = REPOS.find((r) => r.name === bug.repo)!;
  const tests = [bug.testFile, ...(bug.alsoRun ?? [])];
  return {
    instance_id: instanceId(bug),
    repo: repo.repo,
    base_commit: draft.baseCommit,
    environment_setup_commit: draft.setupCommit,
    version: bug.version,
    patch: draft.patch,
    test_patch: draft.testPatch,
    FAIL_TO_PASS: [],
    PASS_TO_PASS: [],
    python: env.python,
    install: installCommands(env.packages),
    // `python -m` puts /testbed first on sys.path: the repository's package,
    // not a copy the base interpreter may have, is what is tested.
    test_cmd: `python -m pytest -rA -p no:cacheprovider ${tests.join(' ')}`,
    repo_path: repoPath,
    problem_statement: bug.statement,
    created_at: '2026-11-01T00:00:00Z',
    log_parser: 'pytest',
  };
}

// ---------------------------------------------------------------- Docker

function imageTag(text: string): string {
  return text.toLowerCase().replace(/[^a-z0-9_.-]/g, '-').slice(0, 120);
}

async function dockerRun(h: DockerHandle, args: string[], timeoutMs = 30 * 60_000): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const [cli, full] = dockerCommand(h, args);
  return exec(cli, full, { timeoutMs });
}

async function imageId(h: DockerHandle, name: string): Promise<string | undefined> {
  const r = await dockerRun(h, ['image', 'inspect', '--format', '{{.Id}}', name], 30_000);
  return r.code === 0 ? r.stdout.trim() : undefined;
}

/** A short content hash for a tag: what an image is built from (its parent's id, its Dockerfile, its context). */
function contentTag(...parts: string[]): string {
  return createHash('sha256').update(JSON.stringify(parts)).digest('hex').slice(0, 12);
}

/** `buildArgs` fill the Dockerfile's ARGs: not in its text, so not in the image's content tag. */
async function dockerBuild(h: DockerHandle, name: string, context: string, dockerfile: string, network: boolean, buildArgs: Record<string, string> = {}): Promise<void> {
  writeFileSync(join(context, 'Dockerfile'), dockerfile);
  const args = Object.entries(buildArgs).flatMap(([k, v]) => ['--build-arg', `${k}=${v}`]);
  const r = await dockerRun(h, ['build', '-q', ...(network ? ['--network', 'host'] : []), ...args, '--label', `${IMAGE_PREFIX}=${WORKLOAD_VERSION}`, '-t', name, context]);
  if (r.code !== 0) throw new SweError(`docker build of ${name} failed (${r.code}): ${(r.stderr || r.stdout).trim().split('\n').slice(-8).join('\n')}`);
}

function freshDir(path: string): string {
  rmSync(path, { recursive: true, force: true });
  mkdirSync(path, { recursive: true });
  return path;
}

/**
 * SWE-bench's three tiers: a base image (the host files a MiniSandbox root
 * shows plus the base interpreter's install, at the same path, and the
 * directories an OS image has: /tmp, /root, /var/tmp, ...), one env image
 * per environment FROM it (the venv built by the task's install commands at
 * the path the sandbox uses), one instance image per task FROM its env image
 * (the repository at base_commit in /testbed). Built with `docker build`, so
 * the tiers are shared layers. Tags carry a hash of what each image is made
 * from (its parent's id included), so a changed tier rebuilds what is above.
 */
async function buildDockerImages(h: DockerHandle, tasks: Task[], envs: WorkloadEnv[], scratch: string, taskEnvs: TaskEnvs, log: Log, signal?: AbortSignal): Promise<{ images: WorkloadDockerImages; timings: NonNullable<WorkloadTimings['docker']> }> {
  const t0 = performance.now();
  const byId = new Map(tasks.map((t) => [t.instance_id, t]));
  const python = taskEnvs.python(tasks[0]!);
  if (typeof python === 'string') throw new SweError(`workload: ${python}`);
  // Importing the host's files takes minutes (several GB): done once per
  // interpreter, whatever the workload's version.
  const host = `${IMAGE_PREFIX}/host:py${python.version}`;
  let t = performance.now();
  let baseReused = true;
  if (!(await imageId(h, host))) {
    baseReused = false;
    await importImage(h, host, [...hostImagePaths(), python.prefix.slice(1)], log);
  }
  const baseFile = [`FROM ${host}`, 'RUN ["/bin/bash", "-c", "mkdir -p /root /home /opt /srv /mnt /var/tmp /var/log /var/cache /run && mkdir -p -m 1777 /tmp && chmod 1777 /var/tmp"]', `ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8`, ''].join('\n');
  const base = `${IMAGE_PREFIX}/base:py${python.version}-${contentTag((await imageId(h, host))!, baseFile)}`;
  if (!(await imageId(h, base))) {
    baseReused = false;
    await dockerBuild(h, base, freshDir(join(scratch, 'base')), baseFile, false);
  }
  const timings: NonNullable<WorkloadTimings['docker']> = { totalMs: 0, base: { image: base, ms: performance.now() - t, reused: baseReused }, envs: {}, instances: {} };
  const images: WorkloadDockerImages = { base, envs: {}, instances: {} };
  const baseId = (await imageId(h, base))!;
  const index = await serveIndexes();
  try {
    for (const env of envs) {
      checkAbort(signal);
      const task = byId.get(env.tasks[0]!)!;
      const venv = `/opt/venvs/${taskEnvs.envKey(task).slice(0, 16)}`;
      const install = [`${python.path} -m venv --system-site-packages --without-pip ${venv}`, ...task.install].join(' && ');
      const envFile = [
        `FROM ${base}`,
        // The index's address, for the install only (an ARG is not kept in the image).
        ...Object.keys(index.variables).map((k) => `ARG ${k}`),
        `ENV VIRTUAL_ENV=${venv} PATH=${venv}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONNOUSERSITE=1`,
        `RUN ["/bin/bash", "-c", ${JSON.stringify(`set -e; mkdir -p /testbed; cd /testbed; ${install}`)}]`,
        '',
      ].join('\n');
      const name = `${IMAGE_PREFIX}/env:${imageTag(env.key)}-${contentTag(baseId, envFile)}`;
      t = performance.now();
      const reused = (await imageId(h, name)) !== undefined;
      if (!reused) {
        log(`docker: building ${name}`);
        await dockerBuild(h, name, freshDir(join(scratch, 'env')), envFile, true, index.variables);
      }
      images.envs[env.key] = name;
      timings.envs[env.key] = { image: name, ms: performance.now() - t, reused };
      const envId = (await imageId(h, name))!;
      for (const id of env.tasks) {
        checkAbort(signal);
        const task = byId.get(id)!;
        const instFile = [`FROM ${name}`, 'COPY testbed /testbed', 'WORKDIR /testbed', ''].join('\n');
        const inst = `${IMAGE_PREFIX}/instance:${imageTag(id)}-${contentTag(envId, instFile, task.base_commit)}`;
        t = performance.now();
        const instReused = (await imageId(h, inst)) !== undefined;
        if (!instReused) {
          log(`docker: building ${inst}`);
          const ctx = freshDir(join(scratch, 'instance'));
          execFileSync('git', ['clone', '-q', '--no-hardlinks', task.repo_path!, join(ctx, 'testbed')], { stdio: 'ignore' });
          git(join(ctx, 'testbed'), ['checkout', '-q', task.base_commit]);
          await dockerBuild(h, inst, ctx, instFile, false);
        }
        images.instances[id] = inst;
        timings.instances[id] = { image: inst, ms: performance.now() - t, reused: instReused };
      }
    }
  } finally {
    await index.close();
    rmSync(scratch, { recursive: true, force: true });
  }
  timings.totalMs = performance.now() - t0;
  return { images, timings };
}

// ---------------------------------------------------------------- the build

interface Manifest {
  version: number;
  specKey: string;
  size: WorkloadSize;
  envs: WorkloadEnv[];
  docker?: WorkloadDockerImages;
  timings: WorkloadTimings;
}

function selected(size: WorkloadSize): { envs: EnvSpec[]; bugs: BugSpec[] } {
  const envs = size === 'quick' ? ENVS.filter((e) => QUICK.envs.includes(e.key)) : [...ENVS];
  const bugs = BUGS.filter((b) => envs.some((e) => e.repo === b.repo && e.version === b.version) && (size === 'full' || QUICK.tasks.includes(instanceId(b))));
  return { envs, bugs };
}

/**
 * Builds the workload once and returns it; later calls read the cache. A
 * set without its workload.json (an interrupted build) is built again; the
 * repositories are deterministic and the store reuses every venv and
 * repository layer already built, so a rebuild redoes only what was missing.
 */
export async function buildWorkload(opts: BuildWorkloadOptions): Promise<Workload> {
  const log: Log = opts.onProgress ?? (() => {});
  const { signal } = opts;
  const root = resolve(opts.cacheDir ?? defaultCacheDir(), `w${WORKLOAD_VERSION}`);
  const dir = join(root, opts.size);
  const reposDir = join(root, 'repos');
  const storeDir = join(root, 'store');
  const tasksFile = join(dir, 'tasks.jsonl');
  const goldPredictionsFile = join(dir, 'predictions.gold.jsonl');
  const manifestFile = join(dir, 'workload.json');
  const timingsFile = join(dir, 'timings.json');

  // What the set is made of: a spec edited without bumping WORKLOAD_VERSION still builds anew.
  const specKey = createHash('sha256').update(JSON.stringify({ v: WORKLOAD_VERSION, size: opts.size, ...selected(opts.size), repos: REPOS, install: installCommands(['PACKAGES']) })).digest('hex');
  let manifest: Manifest | undefined;
  if (existsSync(manifestFile)) {
    const cached = JSON.parse(readFileSync(manifestFile, 'utf8')) as Manifest;
    if (cached.specKey === specKey) {
      manifest = cached;
      log(`workload ${opts.size}: cached in ${dir}`);
    }
  }
  if (!manifest) {
    const missing = indexesMissing();
    if (missing) throw new SweError(`cannot build the suite's workload: ${missing}; it installs its environments and takes its sources from them`);
    rmSync(dir, { recursive: true, force: true });
    mkdirSync(dir, { recursive: true });
    mkdirSync(reposDir, { recursive: true });
    const { envs, bugs } = selected(opts.size);

    let t = performance.now();
    const drafts: Draft[] = [];
    for (const repo of REPOS.filter((r) => envs.some((e) => e.repo === r.name))) {
      checkAbort(signal);
      log(`repository ${repo.name}: ${repo.releases.length} release(s), ${bugs.filter((b) => b.repo === repo.name).length} task(s)`);
      const made = repository(repo, join(reposDir, repo.name), BUGS.filter((b) => b.repo === repo.name));
      for (const bug of bugs.filter((b) => b.repo === repo.name)) {
        drafts.push({ ...made.get(bug.n)!, env: envs.find((e) => e.repo === bug.repo && e.version === bug.version)! });
      }
    }
    const reposMs = performance.now() - t;
    const drafted = drafts.map((d) => taskOf(d, join(reposDir, d.bug.repo)));

    checkAbort(signal);
    t = performance.now();
    const store = await openStore({ root: storeDir });
    const index = await serveIndexes();
    let derived;
    try {
      log(`deriving FAIL_TO_PASS / PASS_TO_PASS of ${drafted.length} tasks (builds ${envs.length} venvs from the local indexes the first time)`);
      derived = await deriveTestLists(drafted, {
        store,
        installNetwork: 'host',
        installVariables: index.variables,
        concurrency: 2,
        timeoutMs: TEST_TIMEOUT_MS,
        ...(signal ? { signal } : {}),
        onProgress: (e) => log(`  prepare ${e.done}/${e.total} ${e.status} ${e.label}`),
        onResult: (r, done, total) => log(`  derive ${done}/${total} ${r.instance_id}${r.error ? `: ${r.error}` : `: ${r.task?.FAIL_TO_PASS.length} fail-to-pass, ${r.task?.PASS_TO_PASS.length} pass-to-pass`}`),
      });
    } finally {
      await index.close();
    }
    checkAbort(signal);
    const problems: string[] = [];
    const tasks: Task[] = [];
    for (const [i, result] of derived.results.entries()) {
      const draft = drafts[i]!;
      const held = `${draft.bug.testFile}::${draft.bug.testName}`;
      if (!result.task) problems.push(`${result.instance_id}: ${result.error}`);
      else if (!result.task.FAIL_TO_PASS.includes(held)) problems.push(`${result.instance_id}: its test ${held} is not among FAIL_TO_PASS (${result.task.FAIL_TO_PASS.join(', ') || 'none'})`);
      else if ((result.tests?.PASS_TO_FAIL.length ?? 0) > 0) problems.push(`${result.instance_id}: the fix breaks ${result.tests!.PASS_TO_FAIL.join(', ')}`);
      else tasks.push(result.task);
    }
    if (problems.length) throw new SweError(`workload ${opts.size}: ${problems.length} task(s) could not be derived:\n${problems.join('\n')}`);
    const deriveMs = performance.now() - t;

    // repo_path relative to the task file, so the cache can move as a whole.
    writeFileSync(tasksFile, tasks.map((task) => JSON.stringify({ ...task, repo_path: relative(dir, task.repo_path!) })).join('\n') + '\n');
    writeFileSync(goldPredictionsFile, tasks.map((task) => JSON.stringify({ instance_id: task.instance_id, model_name_or_path: 'gold', model_patch: task.patch })).join('\n') + '\n');
    const workloadEnvs: WorkloadEnv[] = envs.map((e) => ({ key: e.key, repo: e.repo, version: e.version, python: e.python, tasks: tasks.filter((task) => task.version === e.version && task.repo === REPOS.find((r) => r.name === e.repo)!.repo).map((task) => task.instance_id) }));
    manifest = { version: WORKLOAD_VERSION, specKey, size: opts.size, envs: workloadEnvs, timings: { reposMs, deriveMs } };
    writeFileSync(timingsFile, JSON.stringify(manifest.timings, null, 2) + '\n');
    writeFileSync(manifestFile, JSON.stringify(manifest, null, 2) + '\n');
  }

  const loaded = loadTasks(tasksFile);
  if (loaded.errors.length) throw new SweError(`workload ${tasksFile}: ${loaded.errors.map((e) => e.message).join('; ')}`);
  const workload: Workload = { size: opts.size, dir, tasksFile, tasks: loaded.tasks, goldPredictionsFile, reposDir, envs: manifest.envs, storeDir, timingsFile, packageIndex: { installNetwork: 'host', serve: serveIndexes } };

  if (opts.docker) {
    // Checked every time (a few `docker image inspect`s when all is there):
    // the runner may have removed the images since (they are its to clean up).
    let h: DockerHandle | undefined;
    try {
      h = await ensureDocker(log);
      const store = await openStore({ root: storeDir });
      const built = await buildDockerImages(h, loaded.tasks, manifest.envs, join(dir, 'docker-build'), new TaskEnvs({ store, installNetwork: 'host' }), log, signal);
      const reusedAll = built.timings.base.reused && [...Object.values(built.timings.envs), ...Object.values(built.timings.instances)].every((i) => i.reused);
      manifest.docker = built.images;
      // The timings of the build that made the images, not of a check that found them.
      if (!reusedAll || !manifest.timings.docker) manifest.timings.docker = built.timings;
      writeFileSync(timingsFile, JSON.stringify(manifest.timings, null, 2) + '\n');
      writeFileSync(manifestFile, JSON.stringify(manifest, null, 2) + '\n');
      workload.docker = built.images;
    } catch (err) {
      if (!(err instanceof DockerUnavailable)) throw err;
      workload.dockerSkipped = err.message;
    } finally {
      if (h) await stopDocker(h, log);
    }
  }
  return workload;
}

// ---------------------------------------------------------------- CLI

async function du(path: string): Promise<number> {
  const r = await exec('du', ['-sb', path], { timeoutMs: 120_000 });
  return Number(r.stdout.split('\t')[0]) || 0;
}

function mb(bytes: number): string {
  return `${(bytes / 1e6).toFixed(0)} MB`;
}

/**
 * --check: every task's gold patch through the real pipeline, in a sandbox
 * of its venv and (with --docker) in a container of its instance image;
 * each must resolve. (An empty patch is never run, so never resolves.)
 */
async function check(w: Workload): Promise<boolean> {
  const store = await openStore({ root: w.storeDir! });
  const index = await w.packageIndex!.serve();
  let ok = true;
  try {
    const sets: Array<[string, Task[]]> = [['sandbox', w.tasks]];
    if (w.docker) {
      const images = w.docker.instances;
      sets.push(['docker', w.tasks.map((t) => ({ ...t, image: images[t.instance_id]!, isolation: 'docker' as const, repo_path: undefined }))]);
    }
    for (const [label, tasks] of sets) {
      const prep = await prepareTasks(tasks, { store, installNetwork: w.packageIndex!.installNetwork, installVariables: index.variables });
      const gold = tasks.map((t) => ({ instance_id: t.instance_id, model_name_or_path: 'gold', model_patch: t.patch }));
      const { results, report } = await evaluateAll(tasks, gold, { prepared: prep.prepared, prepareFailures: prep.failures, concurrency: 2 });
      const bad = results.filter((r) => !r.report.resolved).map((r) => r.instance_id);
      const totals = results.map((r) => r.timings.totalMs).sort((a, b) => a - b);
      console.log(`  check ${label}: gold resolves ${report.resolved_instances}/${tasks.length}${bad.length ? ` (not: ${bad.join(' ')})` : ''}; median evaluation ${(totals[totals.length >> 1]! / 1000).toFixed(2)} s`);
      ok &&= bad.length === 0 && results.length === tasks.length;
    }
  } finally {
    await index.close();
  }
  return ok;
}

async function main(): Promise<void> {
  const values = readArgs('usage: node dist/benchmarks/suite/workload.js [--quick] [--docker] [--cache DIR] [--check]', { quick: flag(), docker: flag(), cache: text(), check: flag() });
  const controller = new AbortController();
  process.once('SIGINT', () => controller.abort(new Error('SIGINT')));
  const t0 = performance.now();
  const w = await buildWorkload({
    size: values.quick ? 'quick' : 'full',
    docker: values.docker === true,
    ...(values.cache ? { cacheDir: values.cache } : {}),
    onProgress: (m) => console.error(m),
    signal: controller.signal,
  });
  console.log(`workload ${w.size}: ${w.tasks.length} tasks, ${w.envs.length} envs, in ${w.dir} (${((performance.now() - t0) / 1000).toFixed(1)} s)`);
  for (const repo of new Set(w.tasks.map((t) => t.repo))) {
    console.log(`  ${repo}: ${w.tasks.filter((t) => t.repo === repo).map((t) => t.instance_id).join(' ')}`);
  }
  const store = await openStore({ root: w.storeDir! });
  const envs = new TaskEnvs({ store, installNetwork: 'host' });
  for (const env of w.envs) {
    const task = w.tasks.find((t) => t.instance_id === env.tasks[0])!;
    const key = envs.envKey(task);
    const recipes = join(w.storeDir!, 'envs');
    const venvDigest = readdirSync(recipes).filter((f) => f.endsWith('.json')).map((f) => JSON.parse(readFileSync(join(recipes, f), 'utf8')) as { venvPath?: string; venv?: { digest: string } }).find((m) => m.venvPath === `/opt/venvs/${key.slice(0, 16)}`)?.venv?.digest;
    const layer = venvDigest ? await store.get(venvDigest) : undefined;
    console.log(`  env ${env.key}: venv ${layer ? mb(layer.manifest.size) : '?'} (${layer?.manifest.fileCount ?? '?'} files), tasks ${env.tasks.join(' ')}`);
  }
  console.log(`  store ${w.storeDir}: ${mb(await du(w.storeDir!))} on disk`);
  const timings = JSON.parse(readFileSync(w.timingsFile!, 'utf8')) as WorkloadTimings;
  console.log(`  built: repositories ${(timings.reposMs / 1000).toFixed(1)} s, venvs + derivation ${(timings.deriveMs / 1000).toFixed(1)} s`);
  if (w.docker) {
    const h = await ensureDocker(() => {});
    const size = async (image: string) => {
      const r = await dockerRun(h, ['image', 'inspect', '--format', '{{.Size}}', image], 30_000);
      return Number(r.stdout.trim()) || 0;
    };
    // `docker image inspect`'s Size counts the parents' layers too: each tier's own bytes are the difference.
    const baseSize = await size(w.docker.base);
    console.log(`  docker base ${w.docker.base}: ${mb(baseSize)}`);
    const envSizes = new Map<string, number>();
    for (const [key, image] of Object.entries(w.docker.envs)) {
      envSizes.set(key, await size(image));
      console.log(`  docker env ${image}: ${mb(envSizes.get(key)!)} (+${mb(envSizes.get(key)! - baseSize)} over the base)`);
    }
    for (const env of w.envs) {
      for (const id of env.tasks) {
        const image = w.docker.instances[id]!;
        console.log(`  docker instance ${image}: +${mb((await size(image)) - envSizes.get(env.key)!)} over its env image`);
      }
    }
    if (timings.docker) console.log(`  docker images built in ${(timings.docker.totalMs / 1000).toFixed(1)} s (base ${(timings.docker.base.ms / 1000).toFixed(1)} s${timings.docker.base.reused ? ', reused' : ''})`);
    const df = await dockerRun(h, ['system', 'df'], 60_000);
    console.log(df.stdout.trimEnd());
    await stopDocker(h, () => {});
  } else if (w.dockerSkipped) console.log(`  docker: skipped: ${w.dockerSkipped}`);
  if (values.check && !(await check(w))) process.exitCode = 1;
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  main().catch((err: unknown) => {
    console.error(err instanceof Error ? err.message : String(err));
    process.exitCode = 1;
  });
}
