/**
 * Container images: the same image in Docker and in MiniSandbox (issue 11).
 * The image is msbx-test/app:1, made on this machine by scripts/test-images.sh
 * (its `docker save` archive and the base's in /var/cache/minisandbox/images).
 *
 *   node dist/benchmarks/images.js [--iterations N] [--cold N] [--images N]
 *                                  [--dir DIR] [--no-docker] [--json]
 *
 * warm  `docker run --rm --network none IMAGE true` against MiniSandbox's
 *       `runImage(store, IMAGE, ['true'])` (API) and
 *       `minisandbox image run IMAGE -- true` (CLI, a process like docker's,
 *       with `node -e ''` beside it: the part of the CLI that is Node's
 *       start), image already imported, in rotating ABBA order; medians and
 *       the ratios docker / MiniSandbox (target >= 20 for the API).
 * cold  importing app.tar into nothing: `docker load` into an empty
 *       private engine against importImage() into an empty store, then the
 *       first run of `true` on each.
 * disk  N images FROM the base, each adding a small layer (a COPY of a
 *       1 KiB file): bytes of Docker's data root against bytes of the store
 *       (du, hard links once), for the base alone and with the N images.
 *
 * The Docker cold and disk parts use a dockerd of their own on an empty data
 * root (root only), so the engine the tests use keeps its images. The
 * MiniSandbox side loads lib/images at run time: until that module exists
 * (or lacks importImage / runImage / createImageSandbox) it is reported as
 * skipped with the reason and the Docker side still runs.
 * Progress goes to stderr, results to stdout.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, release } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { openStore, type LayerStore } from '../lib/layers/index.js';
import { run as runSandbox } from '../lib/sandbox/index.js';
import { formatBytes, formatMs, formatRatio, formatTable } from '../lib/format.js';
import { dockerCommand, ensureDocker, startPrivateDocker, stopDocker, type DockerHandle } from './lib/docker.js';
import { count, flag, readArgs, text } from './lib/args.js';
import { exec, lastLines } from './lib/proc.js';
import { summarize, timeRounds, type Summary } from './lib/stats.js';

const IMAGE = 'msbx-test/app:1';
const BASE = 'msbx-test/base:1';
const FIXTURES = path.join(process.env.MSBX_CACHE ?? '/var/cache/minisandbox', 'images');
const APP_TAR = path.join(FIXTURES, 'app.tar');
const BASE_TAR = path.join(FIXTURES, 'base.tar');
const TARGET_DOCKER_VS = 20; // docker run median / image run median must be >= this
const USAGE = 'usage: node dist/benchmarks/images.js [--iterations N] [--cold N] [--images N] [--dir DIR] [--no-docker] [--json]';

interface Options {
  iterations: number;
  cold: number;
  images: number;
  dir?: string;
  docker: boolean;
  json: boolean;
}

function parseOptions(): Options {
  const v = readArgs(USAGE, { iterations: count(20), cold: count(3), images: count(10), dir: text(), 'no-docker': flag(), json: flag() });
  return { iterations: v.iterations, cold: v.cold, images: v.images, dir: v.dir, docker: !v['no-docker'], json: v.json };
}

const log = (msg: string) => process.stderr.write(`[images bench] ${msg}\n`);
const describe = (err: unknown) => (err instanceof Error ? err.message : String(err));

// --- the MiniSandbox side, loaded at run time --------------------------------

interface ImagesApi {
  importImage(store: LayerStore, file: string, opts?: object): Promise<unknown>;
  runImage?(store: LayerStore, ref: string, argv: string[]): Promise<unknown>;
  createImageSandbox?(store: LayerStore, ref: string, opts?: object): Promise<{ exec(argv: string[]): Promise<unknown>; close(): Promise<void> }>;
  openImageStore?(opts: { root: string }): Promise<LayerStore>;
}

/** lib/images as compiled next to this file, or why it cannot be used. */
async function loadImagesApi(): Promise<ImagesApi | string> {
  // A variable specifier: tsc must not require the module to exist yet.
  const spec = '../lib/images/index.js';
  let mod: Partial<ImagesApi>;
  try {
    mod = (await import(spec)) as Partial<ImagesApi>;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ERR_MODULE_NOT_FOUND' && String((err as Error).message).includes('lib/images/index.js')) {
      return 'lib/images/index.ts is not in this checkout yet (the MiniSandbox side needs importImage and runImage or createImageSandbox from it)';
    }
    return `lib/images cannot be loaded (${describe(err).split('\n')[0]})`;
  }
  if (typeof mod.importImage !== 'function') return 'lib/images/index.ts exports no importImage(store, file)';
  if (typeof mod.runImage !== 'function' && typeof mod.createImageSandbox !== 'function') {
    return 'lib/images/index.ts exports neither runImage(store, ref, argv) nor createImageSandbox(store, ref, opts)';
  }
  return mod as ImagesApi;
}

/** The exit code in a RunResult-like answer (or the answer itself if it is a number). */
function exitCodeOf(r: unknown): number | undefined {
  if (typeof r === 'number') return r;
  return r && typeof r === 'object' && 'exitCode' in r ? Number((r as { exitCode: unknown }).exitCode) : undefined;
}

/** One `true` in a sandbox of the image: runImage if there is one, else create + exec + close. */
function miniRun(api: ImagesApi, store: LayerStore, ref: string): () => Promise<void> {
  const check = (r: unknown) => {
    const code = exitCodeOf(r);
    if (code !== undefined && code !== 0) throw new Error(`true in ${ref} exited ${code}: ${JSON.stringify(r).slice(0, 300)}`);
  };
  if (api.runImage) return async () => check(await api.runImage!(store, ref, ['true']));
  return async () => {
    const sb = await api.createImageSandbox!(store, ref, {});
    try {
      check(await sb.exec(['true']));
    } finally {
      await sb.close();
    }
  };
}

function openImageStore(api: ImagesApi, root: string): Promise<LayerStore> {
  return api.openImageStore ? api.openImageStore({ root }) : openStore({ root });
}

/** The repository's CLI, compiled next to this file. */
const CLI = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'lib', 'cli', 'main.js');

// --- measuring helpers ----------------------------------------------------------

/** du -sb of a tree (hard links counted once); unreadable corners make du complain but its total stands. */
function duBytes(dir: string): number {
  const r = spawnSync('du', ['-sb', dir], { encoding: 'utf8' });
  return Number(r.stdout.trim().split(/\s+/)[0] ?? NaN);
}

async function run(file: string, args: readonly string[], what: string, timeoutMs = 600_000): Promise<string> {
  const r = await exec(file, args, { timeoutMs });
  if (r.code !== 0) throw new Error(`${what} failed (${r.code ?? r.signal}): ${lastLines(r.stderr || r.stdout)}`);
  return r.stdout;
}

function docker(h: DockerHandle, args: string[], what = `docker ${args[0]}`): Promise<string> {
  const [cli, a] = dockerCommand(h, args);
  return run(cli, a, what);
}

async function timed(fn: () => Promise<unknown>): Promise<number> {
  const t = performance.now();
  await fn();
  return performance.now() - t;
}

/**
 * Remove a tree the benchmark made. An unprivileged caller's image layers
 * hold files owned by its subordinate ids, which only an `ids: 'range'`
 * sandbox (root inside, as the importer unpacked them) can delete.
 */
async function removeDir(dir: string): Promise<void> {
  try {
    rmSync(dir, { recursive: true, force: true });
    return;
  } catch (err) {
    if (process.getuid?.() === 0) {
      log(`could not remove ${dir}: ${describe(err)}`);
      return;
    }
  }
  const parent = path.dirname(dir);
  // Typed loosely: `ids` belongs to the image work (issue 11) in lib/sandbox.
  const opts = {
    root: 'host',
    ids: 'range',
    mounts: [{ type: 'bind', source: parent, target: parent }],
    argv: ['rm', '-rf', '--one-file-system', '--', dir],
    cwd: '/',
    capabilities: ['CAP_DAC_OVERRIDE', 'CAP_FOWNER'],
  };
  try {
    const r = await runSandbox(opts as unknown as Parameters<typeof runSandbox>[0]);
    if (r.exitCode !== 0) log(`could not remove ${dir}: rm in an ids: 'range' sandbox exited ${r.exitCode}: ${lastLines(String(r.stderr))}`);
  } catch (err) {
    log(`could not remove ${dir}: ${describe(err)}`);
  }
}

type Part<T> = { status: 'ok'; value: T } | { status: 'skipped'; reason: string };
const skipped = (what: string, reason: string): { status: 'skipped'; reason: string } => {
  log(`skipping ${what}: ${reason}`);
  return { status: 'skipped', reason };
};

// --- warm: docker run --rm against image run --------------------------------------

interface Warm {
  docker: Part<Summary>;
  api: Part<Summary>;
  cli: Part<Summary>;
  /** `node -e ''`: what any Node CLI pays before its own work, the CLI's floor. */
  node: Part<Summary>;
  commands: Record<string, string>;
}

type WarmKey = 'docker' | 'api' | 'cli' | 'node';

async function benchWarm(o: Options, api: ImagesApi | string, work: string): Promise<Warm> {
  const commands: Record<string, string> = {};
  const contenders: { key: WarmKey; fn: () => Promise<void> }[] = [];
  const reasons: Partial<Record<WarmKey, string>> = {};
  let shared: DockerHandle | undefined;
  let store: LayerStore | undefined;
  try {
    if (!o.docker) reasons.docker = '--no-docker';
    else {
      try {
        shared = await ensureDocker(log);
        const [cli, inspect] = dockerCommand(shared, ['image', 'inspect', IMAGE]);
        if ((await exec(cli, inspect, { timeoutMs: 30_000 })).code !== 0) {
          if (!existsSync(APP_TAR)) throw new Error(`${IMAGE} is not in Docker and ${APP_TAR} is missing: run scripts/test-images.sh as root`);
          log(`docker load -i ${APP_TAR}`);
          await docker(shared, ['load', '-q', '-i', APP_TAR]);
        }
        const args = ['run', '--rm', '--network', 'none', IMAGE, 'true'];
        const [file, a] = dockerCommand(shared, args);
        commands.docker = `${file} ${a.join(' ')}`;
        contenders.push({ key: 'docker', fn: () => run(file, a, commands.docker!, 60_000).then(() => undefined) });
      } catch (err) {
        reasons.docker = describe(err);
      }
    }

    if (typeof api === 'string') reasons.api = reasons.cli = api;
    else if (!existsSync(APP_TAR)) reasons.api = reasons.cli = `${APP_TAR} is missing: run scripts/test-images.sh as root`;
    else {
      const root = path.join(work, 'warm-store');
      log(`importing ${APP_TAR} into ${root}`);
      store = await openImageStore(api, root);
      await api.importImage(store, APP_TAR);
      contenders.push({ key: 'api', fn: miniRun(api, store, IMAGE) });
      commands.api = `runImage(store, '${IMAGE}', ['true'])`;
      const cliArgs = [CLI, 'image', 'run', '--store', root, IMAGE, '--', 'true'];
      commands.cli = `node ${cliArgs.join(' ')}`;
      const probe = await exec(process.execPath, cliArgs, { timeoutMs: 60_000 });
      if (probe.code === 0) {
        contenders.push({ key: 'cli', fn: () => run(process.execPath, cliArgs, commands.cli!, 60_000).then(() => undefined) });
        commands.node = `node -e ''`;
        contenders.push({ key: 'node', fn: () => run(process.execPath, ['-e', ''], commands.node!, 60_000).then(() => undefined) });
      } else reasons.cli = reasons.node = `minisandbox image run failed (${probe.code}): ${lastLines(probe.stderr || probe.stdout, 2)}`;
    }

    let samples: number[][] = [];
    if (contenders.length > 0) {
      log(`warm start of true: ${o.iterations} rounds of ${contenders.map((c) => c.key).join(', ')} in rotating order`);
      samples = await timeRounds(o.iterations, 2, contenders.map((c) => c.fn));
    }
    const part = (key: WarmKey): Part<Summary> => {
      const i = contenders.findIndex((c) => c.key === key);
      return i >= 0 ? { status: 'ok', value: summarize(samples[i]!) } : skipped(`warm ${key}`, reasons[key] ?? 'not run');
    };
    return { docker: part('docker'), api: part('api'), cli: part('cli'), node: part('node'), commands };
  } finally {
    if (shared) await stopDocker(shared, log);
  }
}

// --- cold import and disk, on a private engine and fresh stores ---------------------

interface Cold {
  /** `docker load -i app.tar` into an empty engine, then the first `docker run --rm true`. */
  docker: Part<{ load: Summary; firstRun: Summary }>;
  /** importImage(store, app.tar) into an empty store, then the first run of true. */
  mini: Part<{ load: Summary; firstRun: Summary }>;
}

interface Disk {
  images: number;
  docker: Part<{ base: number; all: number }>;
  mini: Part<{ base: number; all: number }>;
}

async function benchColdAndDisk(o: Options, api: ImagesApi | string, work: string): Promise<{ cold: Cold; disk: Disk }> {
  const missing = [APP_TAR, BASE_TAR].filter((f) => !existsSync(f));
  if (missing.length > 0) {
    const reason = `${missing.join(' and ')} missing: run scripts/test-images.sh as root`;
    return {
      cold: { docker: skipped('cold docker', reason), mini: skipped('cold MiniSandbox', reason) },
      disk: { images: o.images, docker: skipped('disk docker', reason), mini: skipped('disk MiniSandbox', reason) },
    };
  }

  let priv: (DockerHandle & { dataRoot: string }) | undefined;
  let dockerReason: string | undefined = o.docker ? undefined : '--no-docker';
  if (!dockerReason) {
    try {
      priv = await startPrivateDocker(log);
    } catch (err) {
      dockerReason = describe(err);
    }
  }
  const miniReason = typeof api === 'string' ? api : undefined;
  try {
    // Cold: docker and MiniSandbox rounds alternate (D M, M D, ...).
    const dLoad: number[] = [];
    const dFirst: number[] = [];
    const mLoad: number[] = [];
    const mFirst: number[] = [];
    const dockerRound = async () => {
      const h = priv!;
      const ids = (await docker(h, ['images', '-aq'])).split('\n').filter(Boolean);
      if (ids.length) await docker(h, ['rmi', '-f', ...new Set(ids)]);
      dLoad.push(await timed(() => docker(h, ['load', '-q', '-i', APP_TAR])));
      dFirst.push(await timed(() => docker(h, ['run', '--rm', '--network', 'none', IMAGE, 'true'])));
    };
    let round = 0;
    const miniRound = async () => {
      const a = api as ImagesApi;
      const root = path.join(work, `cold-store-${round++}`);
      const store = await openImageStore(a, root);
      mLoad.push(await timed(() => a.importImage(store, APP_TAR)));
      mFirst.push(await timed(miniRun(a, store, IMAGE)));
      await removeDir(root);
    };
    const rounds = [...(priv ? [dockerRound] : []), ...(miniReason ? [] : [miniRound])];
    if (rounds.length) {
      log(`cold import of ${APP_TAR}: ${o.cold} rounds`);
      for (let i = 0; i < o.cold; i++) for (const r of i % 2 === 0 ? rounds : [...rounds].reverse()) await r();
    }
    const cold: Cold = {
      docker: priv ? { status: 'ok', value: { load: summarize(dLoad), firstRun: summarize(dFirst) } } : skipped('cold docker', dockerReason!),
      mini: miniReason ? skipped('cold MiniSandbox', miniReason) : { status: 'ok', value: { load: summarize(mLoad), firstRun: summarize(mFirst) } },
    };

    // Disk: the base, then N images on it, each with a small layer of its own.
    const names = Array.from({ length: o.images }, (_, i) => `msbx-bench/img${i + 1}:1`);
    let diskDocker: Disk['docker'] | undefined;
    const tenTar = path.join(work, `images-${o.images}.tar`);
    if (priv) {
      const h = priv;
      const ids = (await docker(h, ['images', '-aq'])).split('\n').filter(Boolean);
      if (ids.length) await docker(h, ['rmi', '-f', ...new Set(ids)]);
      const empty = duBytes(h.dataRoot);
      await docker(h, ['load', '-q', '-i', BASE_TAR]);
      const base = duBytes(h.dataRoot) - empty;
      log(`building ${o.images} images FROM ${BASE} in the private engine`);
      for (const [i, name] of names.entries()) {
        const ctx = path.join(work, `ctx${i + 1}`);
        mkdirSync(ctx, { recursive: true });
        writeFileSync(path.join(ctx, 'file'), `${name}\n`.padEnd(1024, '.'));
        writeFileSync(path.join(ctx, 'Dockerfile'), `FROM ${BASE}\nCOPY file /opt/bench/${i + 1}\n`);
        const [cli, a] = dockerCommand(h, ['build', '-q', '-t', name, ctx]);
        const r = await exec(cli, a, { timeoutMs: 300_000, env: { ...process.env, DOCKER_BUILDKIT: '0' } });
        if (r.code !== 0) throw new Error(`docker build of ${name} failed: ${lastLines(r.stderr)}`);
      }
      const all = duBytes(h.dataRoot) - empty;
      diskDocker = { status: 'ok', value: { base, all } };
      if (!miniReason) await docker(h, ['save', '-o', tenTar, ...names]);
    } else diskDocker = skipped('disk docker', dockerReason!);
    let diskMini: Disk['mini'];
    if (miniReason) diskMini = skipped('disk MiniSandbox', miniReason);
    else {
      if (!existsSync(tenTar)) diskMini = skipped('disk MiniSandbox', `the ${o.images} images are built by Docker, which did not run: ${dockerReason}`);
      else {
        const a = api as ImagesApi;
        const root = path.join(work, 'disk-store');
        const store = await openImageStore(a, root);
        const empty = duBytes(root);
        await a.importImage(store, BASE_TAR);
        const base = duBytes(root) - empty;
        await a.importImage(store, tenTar);
        diskMini = { status: 'ok', value: { base, all: duBytes(root) - empty } };
        await removeDir(root);
      }
    }
    return { cold, disk: { images: o.images, docker: diskDocker, mini: diskMini } };
  } finally {
    if (priv) await stopDocker(priv, log);
  }
}

// --- report -----------------------------------------------------------------------

function ratioLine(label: string, num: number | undefined, den: number | undefined, target?: number): { ratio: number | null; pass: boolean | null; text: string } {
  if (num === undefined || den === undefined) return { ratio: null, pass: null, text: `${label}: n/a (a side was skipped)` };
  const ratio = num / den;
  if (target === undefined) return { ratio, pass: null, text: `${label} = ${formatRatio(ratio)}` };
  const pass = ratio >= target;
  return { ratio, pass, text: `${label} = ${formatRatio(ratio)} (target >= ${target}): ${pass ? 'PASS' : 'FAIL'}` };
}

const val = <T>(p: Part<T>): T | undefined => (p.status === 'ok' ? p.value : undefined);

async function main(): Promise<void> {
  const o = parseOptions();
  const api = await loadImagesApi();
  if (typeof api === 'string') log(`MiniSandbox side skipped: ${api}`);
  const base = o.dir ?? '/var/tmp';
  mkdirSync(base, { recursive: true });
  const work = mkdtempSync(path.join(base, 'msbx-bench-images-'));
  let warm: Warm;
  let cold: Cold;
  let disk: Disk;
  try {
    warm = await benchWarm(o, api, work);
    ({ cold, disk } = await benchColdAndDisk(o, api, work));
  } finally {
    await removeDir(work);
  }

  const verdicts = {
    warmApi: ratioLine('docker run median / runImage median', val(warm.docker)?.median, val(warm.api)?.median, TARGET_DOCKER_VS),
    // No target: the CLI starts a Node process (see the node -e '' row), docker's is a Go binary.
    warmCli: ratioLine('docker run median / minisandbox image run median', val(warm.docker)?.median, val(warm.cli)?.median),
    coldLoad: ratioLine('docker load median / importImage median', val(cold.docker)?.load.median, val(cold.mini)?.load.median),
    disk: ratioLine(`Docker bytes / store bytes for the base + ${disk.images} images`, val(disk.docker)?.all, val(disk.mini)?.all),
  };
  const environment = { node: process.version, kernel: release(), cpus: cpus().length, loadavg: loadavg().map((x) => Math.round(x * 100) / 100) };

  if (o.json) {
    console.log(JSON.stringify({ environment, options: o, warm, cold, disk, ratios: verdicts }, null, 2));
    return;
  }
  const lines: string[] = [];
  lines.push(`container image ${IMAGE}: Docker against MiniSandbox`);
  lines.push(`node ${environment.node}, kernel ${environment.kernel}, ${environment.cpus} CPUs, load ${environment.loadavg.join(' ')}`, '');
  const row = (name: string, p: Part<Summary>) =>
    p.status === 'ok' ? [name, String(p.value.n), formatMs(p.value.median), formatMs(p.value.p95), formatMs(p.value.min)] : [name, 'skipped', '', '', ''];
  lines.push('warm start of true (image already there)');
  lines.push(formatTable([['', 'n', 'median', 'p95', 'min'], row('docker run --rm', warm.docker), row('runImage (API)', warm.api), row('minisandbox image run (CLI)', warm.cli), row("node -e '' (the CLI's floor)", warm.node)]), '');
  const coldRow = (name: string, p: Cold['docker']) =>
    p.status === 'ok' ? [name, String(p.value.load.n), formatMs(p.value.load.median), formatMs(p.value.firstRun.median)] : [name, 'skipped', '', ''];
  lines.push(`cold: ${path.basename(APP_TAR)} into an empty engine / store, then the first true`);
  lines.push(formatTable([['', 'n', 'import median', 'first run median'], coldRow('docker load', cold.docker), coldRow('importImage', cold.mini)]), '');
  const diskRow = (name: string, p: Disk['docker']) =>
    p.status === 'ok'
      ? [name, formatBytes(p.value.base), formatBytes(p.value.all), formatBytes((p.value.all - p.value.base) / disk.images)]
      : [name, 'skipped', '', ''];
  lines.push(`disk: the base, then ${disk.images} images FROM it each adding a 1 KiB file`);
  lines.push(formatTable([['', 'base', `base + ${disk.images} images`, 'per extra image'], diskRow("Docker's data root", disk.docker), diskRow('the store', disk.mini)]), '');
  for (const [what, p] of Object.entries({ 'warm docker': warm.docker, 'warm runImage': warm.api, 'warm CLI': warm.cli, 'warm node': warm.node, 'cold docker': cold.docker, 'cold MiniSandbox': cold.mini, 'disk docker': disk.docker, 'disk MiniSandbox': disk.mini })) {
    if (p.status === 'skipped') lines.push(`${what} skipped: ${p.reason}`);
  }
  lines.push('');
  for (const v of Object.values(verdicts)) lines.push(v.text);
  lines.push('', 'commands:');
  for (const [k, c] of Object.entries(warm.commands)) lines.push(`  ${k}: ${c}`);
  console.log(lines.join('\n'));
}

main().catch((err: unknown) => {
  console.error(err instanceof Error ? err.stack : err);
  process.exit(1);
});
