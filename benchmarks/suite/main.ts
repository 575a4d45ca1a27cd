/**
 * The benchmark suite (issue 13): one workload run four ways (Docker's
 * SWE-bench-style images, MiniSandbox's extract mode, its default layers,
 * MiniSandbox running the Docker images), measured side by side in one run:
 * environment preparation (cold, warm), disk, scaling to N at once, an
 * agent-like rollout, per-command latency. Writes results.json, report.md
 * and SVG charts to --out; prints the bars with their verdicts.
 *
 *   node dist/benchmarks/suite/main.js [--quick] [--workload full|quick|demo]
 *       [--methods docker,extract,layers,image] [--scale 1,8,32,128,256]
 *       [--repeat N] [--out DIR] [--cache DIR] [--no-docker] [--json]
 *
 * Progress goes to stderr. Every container (label msbx-suite) and sandbox
 * it made is removed at the end, and on SIGINT/SIGTERM.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { removeTree } from '../../lib/files/fsTree.js';
import { formatMs } from '../../lib/format.js';
import { importImage } from '../../lib/images/index.js';
import { IoBudget, openStore, type LayerStore } from '../../lib/layers/index.js';
import { packageRoot } from '../../lib/native/packageRoot.js';
import { prepareTasks } from '../../lib/swe/pipeline/prepare.js';
import type { Task } from '../../lib/swe/tasks.js';
import { TESTBED } from '../../lib/swe/pipeline/types.js';
import { buildDemoWorkload, defaultCacheDir, imageTag } from './demoWorkload.js';
import { docker, findDocker, imageSize, killDockerClis, removeSuiteContainers, SUITE_NAME, type DockerCli } from './dockerCli.js';
import { dockerMethod, extractMethod, imageMethod, layerArchive, layersMethod, liveInstances, METHODS, taskLayers, type Instance, type Method, type MethodName, type TaskLayers } from './methods.js';
import { settle } from './quiet.js';
import { barsText, writeResults } from './report.js';
import { judgeBars, spread, type DiskFigures, type LatencySamples, type Machine, type RolloutSample, type ScalingSample, type SetupSample, type SuiteResults } from './results.js';
import type { BuildWorkloadOptions, Workload } from './workload-types.js';
import { count, counts, file, flag, oneOf, parseFlags, text, UsageError } from '../lib/args.js';

const log = (msg: string) => process.stderr.write(`[suite ${new Date().toISOString().slice(11, 19)}] ${msg}\n`);

export interface SuiteOptions {
  quick: boolean;
  workload: 'full' | 'quick' | 'demo';
  methods: MethodName[];
  scale: number[];
  repeat: number;
  out: string;
  cacheDir: string;
  docker: boolean;
  json: boolean;
  /** Tasks used for setup, rollout and latency (the whole set counts for disk). */
  tasks: number;
  /** Tasks whose cold preparation is measured. */
  coldTasks: number;
}

const USAGE = 'usage: node dist/benchmarks/suite/main.js [--quick] [--workload full|quick|demo] [--methods docker,extract,layers,image] [--scale 1,8,32,128,256] [--repeat N] [--tasks N] [--cold-tasks N] [--out DIR] [--cache DIR] [--no-docker] [--json]';

export function parseOptions(argv: string[]): SuiteOptions {
  const v = parseFlags(argv, USAGE, {
    quick: flag(),
    workload: oneOf(['full', 'quick', 'demo']),
    methods: text(),
    scale: counts(),
    repeat: count(),
    tasks: count(),
    'cold-tasks': count(),
    out: file('bench-results'),
    cache: file(defaultCacheDir()),
    'no-docker': flag(),
    json: flag(),
  });
  const quick = v.quick;
  const methods = (v.methods ?? METHODS.join(',')).split(',').map((m) => m.trim()).filter(Boolean);
  for (const m of methods) if (!(METHODS as readonly string[]).includes(m)) throw new UsageError(`--methods: unknown method ${JSON.stringify(m)} (known: ${METHODS.join(', ')})\n${USAGE}`);
  const scale = v.scale ?? (quick ? [1, 8] : [1, 8, 32, 128, 256]);
  return {
    quick,
    workload: v.workload ?? (quick ? 'quick' : 'full'),
    methods: methods as MethodName[],
    scale: [...new Set(scale)].sort((a, b) => a - b),
    repeat: v.repeat ?? (quick ? 2 : 3),
    tasks: v.tasks ?? (quick ? 2 : 8),
    coldTasks: v['cold-tasks'] ?? (quick ? 1 : 2),
    out: v.out,
    cacheDir: v.cache,
    docker: !v['no-docker'],
    json: v.json,
  };
}

// ------------------------------------------------------------------ helpers

function machine(dockerVersion: string | undefined): Machine {
  const pkg = JSON.parse(readFileSync(path.join(packageRoot(), 'package.json'), 'utf8')) as { version: string };
  return {
    cpus: os.availableParallelism(),
    cpuModel: os.cpus()[0]?.model ?? 'unknown',
    memoryBytes: os.totalmem(),
    kernel: os.release(),
    loadStart: os.loadavg(),
    loadEnd: [],
    node: process.versions.node,
    ...(dockerVersion ? { docker: dockerVersion } : {}),
    minisandbox: pkg.version,
    user: os.userInfo().username,
    hostname: os.hostname(),
  };
}

/** Host memory in use (MemTotal - MemAvailable), bytes. */
function memoryInUse(): number {
  const info = readFileSync('/proc/meminfo', 'utf8');
  const kb = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(info)?.[1] ?? NaN) * 1024;
  return kb('MemTotal') - kb('MemAvailable');
}

/** Real blocks on disk (du -s, hard links once), bytes; 0 for a missing path. */
function duBytes(paths: string[]): number {
  const there = paths.filter((p) => existsSync(p));
  if (there.length === 0) return 0;
  // du exits 1 for what it cannot read (overlay's mode-000 work dirs, a
  // sandbox's files under other ids as a non-root user); its total of the
  // rest stands.
  const r = spawnSync('du', ['-s', '-c', '--block-size=1', ...there], { encoding: 'utf8', maxBuffer: 64 << 20 });
  const total = Number(r.stdout.trim().split('\n').pop()?.split('\t')[0]);
  if (!Number.isFinite(total)) throw new Error(`du ${there.join(' ')}: ${r.stderr.trim() || r.error?.message}`);
  return total;
}

/** Rotates the order each round (A B C, C B A, ...): drift falls on all contenders alike. */
function abba<T>(items: readonly T[], round: number): T[] {
  return round % 2 === 0 ? [...items] : [...items].reverse();
}

const MARK = '__MSBX_T';

/** The command with its own time measured by bash inside (EPOCHREALTIME: no fork), printed on a last line. */
export function timed(cmd: string): string {
  return `__s=$EPOCHREALTIME; { ${cmd}\n}; __r=$?; __e=$EPOCHREALTIME; printf '\\n${MARK} %s %s\\n' "$(( \${__e//[.,]/} - \${__s//[.,]/} ))" "$__r"`;
}

/** The inner time (ms) and exit code a timed() command printed. */
export function parseTimed(stdout: string): { innerMs: number; exitCode: number } | undefined {
  const m = [...stdout.matchAll(new RegExp(`${MARK} (\\d+) (\\d+)`, 'g'))].pop();
  return m ? { innerMs: Number(m[1]) / 1000, exitCode: Number(m[2]) } : undefined;
}

/** 30 steps of the kind an agent makes, on one source file of the task's repository. */
export function rolloutSteps(file: string): string[] {
  const q = `'${file.replace(/'/g, `'\\''`)}'`;
  const base = [
    'ls',
    'ls -la',
    'git status --short',
    'git log --oneline -5',
    "find . -name '*.py' -not -path './.git/*' | head -50",
    `cat ${q}`,
    "grep -rn 'def ' --include='*.py' . | head -40",
    `grep -n -e 'def ' -e 'import' ${q}`,
    `head -60 ${q}`,
    `wc -l ${q}`,
    'python -c "import sys; print(sys.version)"',
    `python -c 'import ast, sys; ast.parse(open(sys.argv[1]).read()); print("parsed")' ${q}`,
    `sed -i '1s/^/# edited by the suite\\n/' ${q}`,
    'git diff --stat',
    'git diff',
  ];
  return [...base, ...base.map((c) => (c.startsWith('sed -i') ? `sed -i 's/# edited by the suite/# edited twice/' ${q}` : c))];
}

/** A Python file of the task's repository at its base commit (read from the host's clone). */
function sourceFile(task: Task, workload: Workload): string {
  const repo = task.repo_path ?? path.join(workload.reposDir, task.repo.split('/').pop()!);
  try {
    const files = execFileSync('git', ['-C', repo, 'ls-tree', '-r', '--name-only', task.base_commit], { encoding: 'utf8', maxBuffer: 64 << 20 }).split('\n');
    return files.find((f) => f.endsWith('.py') && !/(^|\/)(tests?|testing)\//.test(f) && !f.endsWith('__init__.py')) ?? files.find((f) => f.endsWith('.py')) ?? 'README.md';
  } catch {
    return 'setup.py';
  }
}

async function loadWorkload(o: SuiteOptions, signal: AbortSignal): Promise<Workload> {
  const opts: BuildWorkloadOptions = { size: o.workload === 'demo' ? 'quick' : o.workload, cacheDir: o.cacheDir, docker: o.docker && o.methods.some((m) => m === 'docker' || m === 'image'), onProgress: log, signal };
  if (o.workload === 'demo') return buildDemoWorkload(opts);
  // The builder lives beside this file (benchmarks/suite/workload.ts); a
  // specifier in a variable keeps this file compiling while it is absent.
  const builder = './workload.js';
  let mod: { buildWorkload(opts: BuildWorkloadOptions): Promise<Workload> };
  try {
    mod = (await import(builder)) as typeof mod;
  } catch (err) {
    throw new Error(`--workload ${o.workload}: the workload builder (benchmarks/suite/workload.ts) cannot be loaded (${(err as Error).message}); use --workload demo`, { cause: err });
  }
  return mod.buildWorkload(opts);
}

// --------------------------------------------------------------- the suite

interface Context {
  o: SuiteOptions;
  workload: Workload;
  tasks: Task[];
  methods: Map<MethodName, Method>;
  store: LayerStore;
  imageStore?: LayerStore;
  d?: DockerCli;
  tmp: string;
  signal: AbortSignal;
}

async function closeQuietly(inst: Instance | undefined): Promise<number> {
  if (!inst) return 0;
  const t = performance.now();
  await inst.close().catch((err: Error) => log(`close failed: ${err.message}`));
  return performance.now() - t;
}

async function measureWarm(c: Context, out: SetupSample[]): Promise<void> {
  const methods = [...c.methods.values()];
  for (let round = 0; round <= c.o.repeat; round++) {
    let settled = 0;
    let noisy = 0;
    for (const task of c.tasks) {
      for (const m of abba(methods, round)) {
        c.signal.throwIfAborted();
        // An unmeasured start of the same method first: the contender before
        // this one may have left the suite's own Node cold (the docker CLI and
        // extract's tar are forked from it, and after a fork every page Node
        // writes faults once, milliseconds of the next start here), which is the
        // harness's cost, not this method's. Not for extract: its start
        // unpacks a venv (most of a second), which a few milliseconds do not
        // change, and an unpack just before would leave the disk busy
        // writing and removing the first copy.
        if (round > 0 && m.name !== 'extract') await closeQuietly(await m.start(task.instance_id));
        // And on a quiet machine: what the instance closed before left running
        // (Docker's teardown goes on after `docker rm` returns) is not this
        // start's cost. See quiet.ts.
        if (round > 0) {
          const q = await settle();
          settled += q.waitedMs;
          if (!q.quiet) noisy++;
        }
        const t = performance.now();
        const inst = await m.start(task.instance_id);
        const ms = performance.now() - t;
        await closeQuietly(inst);
        // Round 0 warms the page cache and Docker's image metadata: not counted.
        if (round > 0) out.push({ method: m.name, kind: 'warm', task: task.instance_id, ms });
      }
    }
    log(`warm setup: round ${round}/${c.o.repeat} done${round > 0 ? ` (waited ${formatMs(settled)} in all for a quiet machine${noisy ? `, ${noisy} starts without one` : ''})` : ''}`);
  }
}

/**
 * Cold: an instance whose task-specific part does not exist yet, its
 * environment (Docker's env image, MiniSandbox's venv layer) already
 * built and shared, as when a new task of a known environment arrives.
 * - docker: the instance image built as SWE-bench builds it (FROM the env
 *   image, the repository cloned and checked out at base_commit in
 *   /testbed), under a name of the suite's own (the workload's images are
 *   left alone), then `docker run` and the first command;
 * - layers: the repository layer built into an empty store (buildRepo:
 *   clone, checkout, add), then a sandbox of it on the env and the first
 *   command;
 * - extract, image: no cold step of their own (every extract start unpacks;
 *   an image sandbox of an imported image builds nothing), said in `skipped`.
 */
async function measureCold(c: Context, out: SetupSample[], skipped: Record<string, string>, layers: Map<string, TaskLayers>): Promise<void> {
  const tasks = c.tasks.slice(0, c.o.coldTasks);
  if (c.methods.has('extract')) skipped['extract cold'] = 'every extract start unpacks its archives: its warm figure is its cold one';
  if (c.methods.has('image')) skipped['image cold'] = 'a sandbox of an imported image builds nothing per instance: its warm figure is its cold one';
  const { buildRepo } = await import('../../lib/env/index.js');
  const repeats = c.o.quick ? 1 : Math.min(3, c.o.repeat);
  for (let round = 0; round < repeats; round++) {
    for (const task of tasks) {
      const source = task.repo_path ?? task.repo_url ?? path.join(c.workload.reposDir, task.repo.split('/').pop()!);
      for (const name of abba(['docker', 'layers'] as MethodName[], round)) {
        c.signal.throwIfAborted();
        if (!c.methods.has(name)) continue;
        const scratch = mkdtempSync(path.join(c.tmp, `cold-${name}-`));
        try {
          if (name === 'layers') {
            const t = performance.now();
            const store = await openStore({ root: scratch });
            const repo = await buildRepo(source, task.base_commit, { store, keepArchive: false, signal: c.signal });
            const inst = await layersMethod(new Map([[task.instance_id, { env: layers.get(task.instance_id)!.env, repo: repo.layer }]]), path.join(c.tmp, 'state-cold')).start(task.instance_id);
            out.push({ method: 'layers', kind: 'cold', task: task.instance_id, ms: performance.now() - t });
            await closeQuietly(inst);
          } else {
            const env = c.workload.envs.find((e) => e.tasks.includes(task.instance_id));
            const envImage = env && c.workload.docker!.envs[env.key];
            if (!envImage) throw new Error(`cold docker: no env image for ${task.instance_id}`);
            const tag = `${SUITE_NAME}-cold/${imageTag(task.instance_id)}:${process.pid}`;
            const t = performance.now();
            const repoDir = path.join(scratch, 'testbed');
            execFileSync('git', ['clone', '-q', source, repoDir], { stdio: 'ignore' });
            execFileSync('git', ['-C', repoDir, 'checkout', '-q', task.base_commit], { stdio: 'ignore' });
            await docker(c.d!, ['build', '-q', '--no-cache', '-t', tag, '-f', '-', repoDir], { input: `FROM ${envImage}\nCOPY . ${TESTBED}\nWORKDIR ${TESTBED}\n`, timeoutMs: 600_000 });
            const inst = await dockerMethod(c.d!, { [task.instance_id]: tag }).start(task.instance_id);
            out.push({ method: 'docker', kind: 'cold', task: task.instance_id, ms: performance.now() - t });
            await closeQuietly(inst);
            await docker(c.d!, ['rmi', '-f', tag], { allowFail: true, timeoutMs: 120_000 });
          }
        } finally {
          // removeTree: store layers and checkouts have read-only dirs, which rm -rf cannot empty as a non-root user.
          await removeTree(scratch);
        }
        log(`cold setup: ${name} ${task.instance_id}: ${formatMs(out[out.length - 1]!.ms)}`);
      }
    }
  }
}

async function measureLatency(c: Context, out: LatencySamples[]): Promise<void> {
  const task = c.tasks[0]!;
  const insts = new Map<MethodName, Instance>();
  try {
    for (const m of c.methods.values()) insts.set(m.name, await m.start(task.instance_id));
    const n = c.o.repeat * 10;
    const samples = new Map<string, number[]>();
    const kinds: Array<[MethodName, 'exec' | 'step']> = [...insts.keys()].flatMap((m) => (m === 'docker' ? [[m, 'exec']] : [[m, 'exec'], [m, 'step']]) as Array<[MethodName, 'exec' | 'step']>);
    for (let round = -2; round < n; round++) {
      for (const [m, kind] of abba(kinds, round + 2)) {
        c.signal.throwIfAborted();
        const inst = insts.get(m)!;
        const t = performance.now();
        const r = kind === 'exec' ? await inst.exec('true') : await inst.step('true');
        const ms = performance.now() - t;
        if (r.exitCode !== 0) throw new Error(`latency: ${m} ${kind} 'true' exited ${r.exitCode}`);
        if (round >= 0) samples.set(`${m}\0${kind}`, [...(samples.get(`${m}\0${kind}`) ?? []), ms]);
      }
    }
    for (const [key, ms] of samples) {
      const [method, kind] = key.split('\0') as [MethodName, 'exec' | 'step'];
      out.push({ method, kind, ms });
    }
  } finally {
    for (const inst of insts.values()) await closeQuietly(inst);
  }
}

async function measureRollout(c: Context, out: RolloutSample[]): Promise<void> {
  const methods = [...c.methods.values()];
  // One rollout per task and method: a rollout is ~30 s of the machine
  // for four methods, and the tasks themselves are the repeats (--tasks).
  const repeats = 1;
  for (let round = 0; round < repeats; round++) {
    for (const task of c.tasks) {
      const steps = rolloutSteps(sourceFile(task, c.workload));
      for (const m of abba(methods, round)) {
        c.signal.throwIfAborted();
        const t0 = performance.now();
        const inst = await m.start(task.instance_id);
        const setupMs = performance.now() - t0;
        const s: RolloutSample = { method: m.name, task: task.instance_id, repeat: round, setupMs, steps: 0, failedSteps: 0, stepsWallMs: 0, stepsInnerMs: 0, testWallMs: 0, testInnerMs: 0, testExitCode: null, teardownMs: 0 };
        try {
          for (const step of steps) {
            const t = performance.now();
            const r = await inst.step(timed(step));
            const wall = performance.now() - t;
            const inner = parseTimed(r.stdout);
            s.steps++;
            s.stepsWallMs += wall;
            s.stepsInnerMs += inner?.innerMs ?? wall;
            if (!inner || inner.exitCode !== 0) {
              s.failedSteps++;
              if ((s.failed ??= []).length < 5) s.failed.push(`${step} (exit ${inner?.exitCode ?? r.exitCode})`);
            }
          }
          const t = performance.now();
          const r = await inst.step(timed(task.test_cmd));
          s.testWallMs = performance.now() - t;
          const inner = parseTimed(r.stdout);
          s.testInnerMs = inner?.innerMs ?? s.testWallMs;
          s.testExitCode = inner?.exitCode ?? r.exitCode;
        } finally {
          s.teardownMs = await closeQuietly(inst);
        }
        out.push(s);
        log(`rollout ${m.name} ${task.instance_id}: steps ${formatMs(s.stepsWallMs)} (own ${formatMs(s.stepsInnerMs)}), tests ${formatMs(s.testWallMs)}${s.failedSteps ? `, ${s.failedSteps} steps failed` : ''}`);
      }
    }
  }
}

/** Extract is capped at N = 32: 256 private copies of every venv would fill the disk and take the whole run. */
export const EXTRACT_SCALE_MAX = 32;

async function measureScaling(c: Context, out: ScalingSample[], skipped: Record<string, string>): Promise<void> {
  const methods = [...c.methods.values()];
  for (const [i, n] of c.o.scale.entries()) {
    // Repeats where a run is short (N <= 8, and not in --quick); one run above.
    const repeats = n <= 8 && !c.o.quick ? Math.min(3, c.o.repeat) : 1;
    for (let round = 0; round < repeats; round++) {
      for (const m of abba(methods, i + round)) {
        c.signal.throwIfAborted();
        if (m.name === 'extract' && n > EXTRACT_SCALE_MAX) {
          skipped[`extract scaling N>${EXTRACT_SCALE_MAX}`] = `each extract instance is a private copy of its venv: capped at N=${EXTRACT_SCALE_MAX}`;
          continue;
        }
        const before = memoryInUse();
        const started: Instance[] = [];
        const perEnvMs: number[] = [];
        let failures = 0;
        let error: string | undefined;
        const t0 = performance.now();
        await Promise.all(
          Array.from({ length: n }, async (_, k) => {
            const task = c.tasks[k % c.tasks.length]!;
            const t = performance.now();
            try {
              started.push(await m.start(task.instance_id));
              perEnvMs.push(performance.now() - t);
            } catch (err) {
              failures++;
              error ??= (err as Error).message.slice(0, 300);
            }
          }),
        );
        const totalMs = performance.now() - t0;
        const memoryBytes = Math.max(0, memoryInUse() - before);
        await Promise.all(started.map((inst) => closeQuietly(inst)));
        out.push({ method: m.name, n, repeat: round, totalMs, perEnvMs, failures, memoryBytes, ...(error ? { error } : {}) });
        log(`scaling ${m.name} N=${n}: all ready in ${formatMs(totalMs)}, per env ${formatMs(spread(perEnvMs).median)}, ${failures} failures`);
      }
    }
  }
}

async function measureDisk(c: Context, archivesDir: string, layers: Map<string, TaskLayers>): Promise<DiskFigures> {
  const disk: DiskFigures = { set: {}, perInstance: {} };
  if (c.methods.has('layers')) {
    // The set's own layers: the store may hold other sets' too.
    const paths = [...new Set([...layers.values()].flatMap((t) => [t.env.venv.path, t.repo.path]))];
    disk.set.layers = { bytes: duBytes(paths), what: `the set's ${paths.length} venv and repository layers in the store (du: real blocks, hard links once)` };
  }
  if (c.methods.has('extract')) disk.set.extract = { bytes: duBytes([archivesDir]), what: 'the venv and repository archives the instances unpack (du)' };
  if (c.imageStore) {
    // The set's images' layers: the store is shared by the quick and full sets.
    const { findImage, imageLayers } = await import('../../lib/images/index.js');
    const paths = new Set<string>();
    for (const ref of Object.values(c.workload.docker!.instances)) {
      const rec = await findImage(c.imageStore, ref);
      if (rec) for (const l of await imageLayers(c.imageStore, rec)) paths.add(l.path);
    }
    disk.set.image = { bytes: duBytes([...paths]), what: `the set's images' ${paths.size} layers in the store (du)` };
  }
  if (c.d && c.workload.docker) {
    const imgs = c.workload.docker;
    const size = new Map<string, number>();
    const sz = async (ref: string) => size.get(ref) ?? (size.set(ref, await imageSize(c.d!, ref)), size.get(ref)!);
    const base = await sz(imgs.base);
    let total = base;
    for (const env of Object.values(imgs.envs)) total += (await sz(env)) - base;
    let perTask = 0;
    for (const [id, inst] of Object.entries(imgs.instances)) {
      const env = c.workload.envs.find((e) => e.tasks.includes(id));
      const envImage = env ? imgs.envs[env.key] : undefined;
      const own = await sz(inst);
      total += own - (envImage ? await sz(envImage) : base);
      perTask += own;
    }
    disk.set.docker = { bytes: total, what: 'image sizes with shared layers counted once (base + env layers + instance layers)' };
    disk.dockerWithoutBase = total - base;
    disk.dockerPerTaskImages = perTask;
  }
  // Per extra running instance: K instances of one task, after their first command.
  const K = 3;
  const task = c.tasks[0]!;
  for (const m of c.methods.values()) {
    c.signal.throwIfAborted();
    const stateDir = path.join(c.tmp, `state-${m.name}`);
    const beforeState = duBytes([stateDir]);
    const insts: Instance[] = [];
    try {
      for (let k = 0; k < K; k++) insts.push(await m.start(task.instance_id));
      if (m.name === 'docker') {
        const r = await docker(c.d!, ['inspect', '--size', '--format', '{{.SizeRw}}', ...insts.map((i) => i.containerId!)]);
        disk.perInstance.docker = r.stdout.split('\n').filter(Boolean).reduce((a, x) => a + Number(x), 0) / K;
      } else disk.perInstance[m.name] = Math.max(0, duBytes([stateDir]) - beforeState) / K;
    } finally {
      for (const inst of insts) await closeQuietly(inst);
    }
  }
  return disk;
}

/**
 * The instance images in a MiniSandbox store, by task: the ones it lacks
 * exported from Docker in one `docker save` (their shared base and env
 * layers once, not once per image) and imported.
 */
async function importInstanceImages(store: LayerStore, d: DockerCli, workload: Workload, signal: AbortSignal): Promise<Map<string, string>> {
  const { findImage } = await import('../../lib/images/index.js');
  const refs = workload.docker!.instances;
  const missing: string[] = [];
  for (const ref of Object.values(refs)) if (!(await findImage(store, ref))) missing.push(ref);
  if (missing.length) {
    const dir = mkdtempSync(path.join(store.root, 'staging', 'suite-save-'));
    scratchDirs.add(dir);
    try {
      log(`docker save of ${missing.length} instance images, then import`);
      await docker(d, ['save', '-o', path.join(dir, 'images.tar'), ...missing], { timeoutMs: 3_600_000 });
      await importImage(store, path.join(dir, 'images.tar'), { signal });
    } finally {
      await removeTree(dir);
      scratchDirs.delete(dir);
    }
  }
  const ids = new Map<string, string>();
  for (const [id, ref] of Object.entries(refs)) {
    const rec = await findImage(store, ref);
    if (!rec) throw new Error(`image: ${ref} not in ${store.root} after its import`);
    ids.set(id, rec.id);
  }
  return ids;
}

// --------------------------------------------------------------- main

export async function runSuite(o: SuiteOptions, signal: AbortSignal): Promise<SuiteResults> {
  const started = Date.now();
  const startedAt = new Date().toISOString();
  const skipped: Record<string, string> = {};
  let d: DockerCli | undefined;
  const wantsDocker = o.methods.includes('docker') || o.methods.includes('image');
  if (!o.docker) {
    for (const m of ['docker', 'image'] as const) if (o.methods.includes(m)) skipped[m] = '--no-docker';
  } else if (wantsDocker) {
    const found = await findDocker();
    if ('missing' in found) {
      for (const m of ['docker', 'image'] as const) if (o.methods.includes(m)) skipped[m] = found.missing;
      log(`Docker skipped: ${found.missing}`);
    } else {
      d = found;
      const stale = await removeSuiteContainers(d);
      if (stale) log(`removed ${stale} msbx-suite containers left by an interrupted run`);
    }
  }
  const mach = machine(d?.serverVersion);
  log(`workload ${o.workload}: loading (cache ${o.cacheDir})`);
  const workload = await loadWorkload({ ...o, docker: d !== undefined }, signal);
  if (!workload.docker) for (const m of ['docker', 'image'] as const) if (o.methods.includes(m)) skipped[m] ??= workload.dockerSkipped ?? 'the workload has no Docker images';
  const methodsRun = o.methods.filter((m) => !skipped[m]);
  const tasks = workload.tasks.slice(0, o.tasks);
  log(`workload: ${workload.tasks.length} tasks (${tasks.length} used for setup, rollout and latency), ${workload.envs.length} environments; methods ${methodsRun.join(', ')}`);

  const tmp = mkdtempSync(path.join(os.tmpdir(), 'msbx-suite-'));
  scratchDirs.add(tmp);
  // The builder's store holds every venv and repository layer already (it
  // prepared the tasks to derive their test lists): the suite uses it warm.
  const storeRoot = workload.storeDir ?? path.join(o.cacheDir, `suite-store-${o.workload}`);
  const c: Context = { o, workload, tasks, methods: new Map(), store: await openStore({ root: storeRoot }), tmp, signal, ...(d ? { d } : {}) };
  const archivesDir = path.join(o.cacheDir, `suite-archives-${o.workload}`);
  const layerMap = new Map<string, TaskLayers>();
  let index: { close(): Promise<void> } | undefined;
  try {
    // What the MiniSandbox methods need, built once and cached.
    if (methodsRun.some((m) => m === 'layers' || m === 'extract')) {
      log('preparing the MiniSandbox side (venv and repository layers; cached after the first run)');
      // The same install network as the builder's, or the env keys differ
      // and every venv would be built again; its package indexes are served
      // (on a port of this process's own) for a venv the store lacks, until
      // the run ends.
      const served = await workload.packageIndex?.serve();
      index = served;
      const prep = await prepareTasks(workload.tasks, { store: c.store, concurrency: 2, signal, ...(workload.packageIndex && served ? { installNetwork: workload.packageIndex.installNetwork, installVariables: served.variables } : {}), onProgress: (e) => e.status !== 'start' && log(`prepare ${e.done}/${e.total}: ${e.label} ${e.status}${e.error ? `: ${e.error}` : ''}`) });
      if (prep.failures.length) throw new Error(`prepare failed: ${prep.failures.map((f) => f.message).join('; ')}`);
      const layers = layerMap;
      for (const [id, p] of prep.prepared) layers.set(id, await taskLayers(c.store, p));
      if (methodsRun.includes('layers')) c.methods.set('layers', layersMethod(layers, path.join(tmp, 'state-layers')));
      if (methodsRun.includes('extract')) {
        const withArchives = new Map<string, TaskLayers & { venvArchive: string; repoArchive: string }>();
        for (const [id, t] of layers) withArchives.set(id, { ...t, venvArchive: await layerArchive(t.env.venv, archivesDir), repoArchive: await layerArchive(t.repo, archivesDir) });
        c.methods.set('extract', extractMethod(withArchives, path.join(tmp, 'state-extract'), new IoBudget({ dir: path.join(c.store.root, 'budget') })));
      }
    }
    if (methodsRun.includes('image') && d && workload.docker) {
      log('importing the instance images into a MiniSandbox store (cached after the first run)');
      // One store for the quick and full sets: they share the base image (gigabytes), imported once.
      c.imageStore = await openStore({ root: path.join(o.cacheDir, o.workload === 'demo' ? 'suite-image-store-demo' : 'suite-image-store') });
      c.methods.set('image', imageMethod(c.imageStore, await importInstanceImages(c.imageStore, d, workload, signal), path.join(tmp, 'state-image')));
    }
    if (methodsRun.includes('docker') && d && workload.docker) c.methods.set('docker', dockerMethod(d, workload.docker.instances));
    // The order of METHODS, whatever --methods said.
    c.methods = new Map(METHODS.filter((m) => c.methods.has(m)).map((m) => [m, c.methods.get(m)!]));

    const setup: SetupSample[] = [];
    const latency: LatencySamples[] = [];
    const rollout: RolloutSample[] = [];
    const scaling: ScalingSample[] = [];
    log('warm setup'); await measureWarm(c, setup);
    log('per-command latency'); await measureLatency(c, latency);
    log('disk'); const disk = await measureDisk(c, archivesDir, layerMap);
    log('rollout'); await measureRollout(c, rollout);
    log('scaling'); await measureScaling(c, scaling, skipped);
    log('cold setup'); await measureCold(c, setup, skipped, layerMap);
    mach.loadEnd = os.loadavg();
    const results: Omit<SuiteResults, 'bars'> = {
      version: 1,
      startedAt,
      durationMs: Date.now() - started,
      options: { ...o },
      machine: mach,
      workload: { name: o.workload, tasks: workload.tasks.length, envs: workload.envs.length, repos: new Set(workload.tasks.map((t) => t.repo)).size, dir: workload.dir, ...(workload.dockerSkipped ? { dockerSkipped: workload.dockerSkipped } : {}) },
      methods: [...c.methods.keys()],
      skipped,
      setup,
      disk,
      scaling,
      rollout,
      latency,
    };
    return { ...results, bars: judgeBars(results) };
  } finally {
    await cleanup(d);
    await index?.close();
  }
}

/** Temp dirs of this run (sandbox state, cold stores), removed by cleanup(). */
const scratchDirs = new Set<string>();

/** Closes every instance still open and removes every suite container. */
export async function cleanup(d: DockerCli | undefined): Promise<void> {
  killDockerClis();
  await Promise.all([...liveInstances].map((inst) => inst.close().catch(() => undefined)));
  if (d) await removeSuiteContainers(d).catch(() => undefined);
  for (const dir of scratchDirs) await removeTree(dir).catch((err: Error) => log(`cannot remove ${dir}: ${err.message}`));
  scratchDirs.clear();
}

/** How long an interrupted run may take to unwind (close what it opened itself) before the suite exits anyway. */
const UNWIND_MS = 20_000;

async function main(): Promise<void> {
  const o = parseOptions(process.argv.slice(2));
  const abort = new AbortController();
  let interrupted = false;
  let run: Promise<SuiteResults> | undefined;
  const onSignal = (sig: NodeJS.Signals) => {
    if (interrupted) return;
    interrupted = true;
    log(`${sig}: stopping, removing every container and sandbox the suite made`);
    abort.abort(new Error(`interrupted by ${sig}`));
    void (async () => {
      const found = o.docker ? await findDocker() : undefined;
      const d = found && !('missing' in found) ? found : undefined;
      // What the suite opened, closed now: steps in flight fail at once
      // rather than run on to their timeouts.
      await cleanup(d);
      // Then the run unwinds: what the library opened for it (the env
      // builds' sandboxes while preparing, the docker CLIs being killed)
      // is closed and reaped by the code that opened it, on the abort.
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([run?.catch(() => undefined), new Promise((r) => (timer = setTimeout(r, UNWIND_MS)))]);
      clearTimeout(timer);
      await cleanup(d);
      log('cleaned up');
      process.exit(sig === 'SIGINT' ? 130 : 143);
    })();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  run = runSuite(o, abort.signal);
  let results: SuiteResults;
  try {
    results = await run;
  } catch (err) {
    // Interrupted: the signal handler exits when the cleanup is done.
    if (interrupted) return;
    throw err;
  }
  const files = await writeResults(o.out, results);
  log(`wrote ${files.map((f) => path.relative(process.cwd(), f)).join(', ')}`);
  if (o.json) process.stdout.write(`${JSON.stringify(results)}\n`);
  else process.stdout.write(`\n${barsText(results)}\n\nReport: ${path.join(o.out, 'report.md')} (${formatMs(results.durationMs)})\n`);
}

if (process.argv[1] && path.resolve(process.argv[1]) === path.resolve(new URL(import.meta.url).pathname)) {
  main().catch((err: unknown) => {
    process.stderr.write(`benchmark suite failed: ${(err as Error).message}\n`);
    process.exitCode = 1;
  });
}
