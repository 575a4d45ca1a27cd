/**
 * Environment layers: what a sandbox on a pre-built env costs.
 *
 *   node dist/benchmarks/env.js [--iterations N] [--sandboxes N] [--envs N]
 *                               [--big-mb N] [--disk-env-mb N] [--python 3.11]
 *                               [--dir DIR] [--json]
 *
 * warm  createEnvSandbox(env) to the first command done, store already
 *       holding the layers, for a tiny env and a big (100+ MB) one: the
 *       cost must not depend on the env's size (target: median <= 20 ms).
 * cold  unpacking the big venv's archive once: the layer extractor vs
 *       plain GNU `tar --zstd -xf`, and the extraction baseline's
 *       per-sandbox setup (lib/env/extractBaseline.ts).
 * disk  bytes used by N sandboxes on M envs (overlay) against the M env
 *       archives, and against the same N sandboxes with per-instance
 *       extraction (the baseline).
 * dedup two envs built a second apart with the same packages, each with
 *       the repository at another commit: bytes of identical content in the
 *       two, and the store's disk use for both, with the builds' own times
 *       and with fixed times (lib/layers/times.ts).
 *
 * The big venv is made by copying top-level packages of the base Python's
 * site-packages (numpy, botocore, ...) into the venv: no network needed.
 * Progress goes to stderr, results to stdout.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { Sandbox } from '../lib/sandbox/index.js';
import { shQuote } from '../lib/shell/index.js';
import { createExtractedEnvSandbox } from '../lib/env/extractBaseline.js';
import { buildEnv, createEnvSandbox, resolvePython, type BasePython, type Env, type EnvSandbox } from '../lib/env/index.js';
import { extractArchive, removeTree } from '../lib/files/index.js';
import { openStore, type LayerStore } from '../lib/layers/index.js';
import { formatBytes, formatMs, formatRatio, formatTable } from '../lib/format.js';
import { count, flag, readArgs, text } from './lib/args.js';
import { summarize, type Summary } from './lib/stats.js';

interface Options {
  iterations: number;
  sandboxes: number;
  envs: number;
  bigMb: number;
  diskEnvMb: number;
  python: string;
  dir?: string;
  json: boolean;
}

const USAGE =
  'usage: node dist/benchmarks/env.js [--iterations N] [--sandboxes N] [--envs N] [--big-mb N] [--disk-env-mb N] [--python VERSION|PATH] [--dir DIR] [--json]';
const TARGET_WARM_MS = 20;

function parseOptions(): Options {
  const v = readArgs(USAGE, {
    iterations: count(30),
    sandboxes: count(50),
    envs: count(5),
    'big-mb': count(120),
    'disk-env-mb': count(30),
    python: text('3.11'),
    dir: text(),
    json: flag(),
  });
  return {
    iterations: v.iterations,
    sandboxes: v.sandboxes,
    envs: v.envs,
    bigMb: v['big-mb'],
    diskEnvMb: v['disk-env-mb'],
    python: v.python,
    dir: v.dir,
    json: v.json,
  };
}

const log = (msg: string) => process.stderr.write(`[env bench] ${msg}\n`);
const MB = 1024 * 1024;

/** du -sb; overlay's mode-000 work/work dirs make du complain but its total stands. */
function duBytes(paths: string[]): number {
  if (paths.length === 0) return 0;
  const r = spawnSync('du', ['-scb', ...paths], { encoding: 'utf8', maxBuffer: 64 * MB });
  const total = r.stdout.trim().split('\n').pop() ?? '0';
  return Number(total.split('\t')[0]);
}

/** Top-level entries of the base Python's site-packages, biggest first, with their sizes. */
function sitePackageDirs(python: BasePython): { dir: string; bytes: number }[] {
  const purelib = execFileSync(python.path, ['-c', 'import sysconfig; print(sysconfig.get_paths()["purelib"])'], { encoding: 'utf8' }).trim();
  const roots = [purelib, '/usr/lib/python3/dist-packages'];
  const out: { dir: string; bytes: number }[] = [];
  for (const root of roots) {
    let names: string[] = [];
    try {
      names = readdirSync(root);
    } catch {
      continue;
    }
    for (const n of names) {
      if (n === '__pycache__' || n.endsWith('.pth') || n === 'pip' || n === 'setuptools' || n.startsWith('_distutils')) continue;
      const dir = path.join(root, n);
      out.push({ dir, bytes: duBytes([dir]) });
    }
  }
  return out.sort((a, b) => b.bytes - a.bytes);
}

/** Bytes of the regular files that are at the same path with the same content in both trees. */
function identicalBytes(a: string, b: string): number {
  let total = 0;
  const visit = (rel: string) => {
    for (const name of readdirSync(path.join(a, rel))) {
      const r = path.join(rel, name);
      const st = lstatSync(path.join(a, r));
      if (st.isDirectory()) visit(r);
      else if (st.isFile() && st.size > 0) {
        let other;
        try {
          other = lstatSync(path.join(b, r));
        } catch {
          continue;
        }
        if (other.isFile() && other.size === st.size && readFileSync(path.join(a, r)).equals(readFileSync(path.join(b, r)))) total += st.size;
      }
    }
  };
  visit('');
  return total;
}

/** A step copying these site-packages entries into the venv. */
function copyStep(dirs: string[]): { run: string } {
  return { run: `sp="$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" && cp -a ${dirs.map(shQuote).join(' ')} "$sp"/` };
}

function makeRepo(dir: string, files: number, tag: string): string {
  mkdirSync(path.join(dir, 'src', 'proj'), { recursive: true });
  for (let i = 0; i < files; i++) writeFileSync(path.join(dir, 'src', 'proj', `mod_${i}.py`), `# ${tag}\n${'def f():\n    return 1\n'.repeat(40)}`);
  writeFileSync(path.join(dir, 'README.md'), `${tag}\n`);
  const git = (...args: string[]) => execFileSync('git', ['-c', 'user.name=b', '-c', 'user.email=b@b', ...args], { cwd: dir, encoding: 'utf8' }).trim();
  git('init', '-q');
  git('add', '-A');
  git('commit', '-q', '-m', tag);
  return git('rev-parse', 'HEAD');
}

async function makeEnv(store: LayerStore, work: string, python: BasePython, name: string, copy: string[], repoFiles: number): Promise<Env> {
  const repo = path.join(work, `repo-${name}`);
  const commit = makeRepo(repo, repoFiles, name);
  const started = performance.now();
  const env = await buildEnv({ name, python: python.path, repo: { source: repo, commit }, steps: copy.length ? [copyStep(copy)] : [] }, { store });
  log(`built ${name}: venv ${formatBytes(env.venv.manifest.size)} (${env.venv.manifest.fileCount} files), archive ${formatBytes(env.manifest.venv.archiveBytes ?? 0)}, in ${formatMs(performance.now() - started)}`);
  return env;
}

/** Pick entries whose sizes add up to about `bytes`, starting at `offset` in the list (so envs differ). */
function pick(dirs: { dir: string; bytes: number }[], bytes: number, offset = 0): string[] {
  const out: string[] = [];
  let sum = 0;
  for (let i = 0; i < dirs.length && sum < bytes; i++) {
    const d = dirs[(i + offset) % dirs.length]!;
    if (d.bytes > bytes * 1.5 && out.length > 0) continue;
    out.push(d.dir);
    sum += d.bytes;
  }
  return out;
}

async function warm(env: Env, iterations: number): Promise<Summary> {
  const samples: number[] = [];
  for (let i = 0; i < iterations + 3; i++) {
    const t0 = performance.now();
    const sb = await createEnvSandbox(env);
    const r = await sb.exec(['/bin/true']);
    const t = performance.now() - t0;
    if (r.exitCode !== 0) throw new Error(`first command failed: ${r.stderr}`);
    await sb.close();
    if (i >= 3) samples.push(t);
  }
  return summarize(samples);
}

async function main(): Promise<void> {
  const o = parseOptions();
  const python = resolvePython(o.python);
  const root = o.dir ?? mkdtempSync(path.join(tmpdir(), 'msbx-env-bench-'));
  const store = await openStore({ root: path.join(root, 'store') });
  const work = path.join(root, 'work');
  mkdirSync(work, { recursive: true });
  log(`python ${python.path} ${python.version}; store ${store.root}`);
  const results: Record<string, unknown> = { python: python.version, store: store.root };
  try {
    const dirs = sitePackageDirs(python);
    // ---- warm
    const tiny = await makeEnv(store, work, python, 'tiny', [], 10);
    const big = await makeEnv(store, work, python, 'big', pick(dirs, o.bigMb * MB), 2000);
    log(`warm: ${o.iterations} sandboxes per env`);
    // The floor: a plain sandbox with no env at all.
    const bareSamples: number[] = [];
    for (let i = 0; i < o.iterations + 3; i++) {
      const t0 = performance.now();
      const sb = await Sandbox.create();
      await sb.exec(['/bin/true']);
      const t = performance.now() - t0;
      await sb.close();
      if (i >= 3) bareSamples.push(t);
    }
    const bare = summarize(bareSamples);
    const warmTiny = await warm(tiny, o.iterations);
    const warmBig = await warm(big, o.iterations);
    // A real first command too: the venv's python importing from the repo.
    const py: number[] = [];
    for (let i = 0; i < 10; i++) {
      const t0 = performance.now();
      const sb = await createEnvSandbox(big);
      await sb.exec(['python', '-c', 'import sys; sys.path.insert(0, "src"); import proj.mod_1']);
      py.push(performance.now() - t0);
      await sb.close();
    }
    const warmPy = summarize(py);
    results.warm = { bare, tiny: warmTiny, big: warmBig, bigPython: warmPy, tinyBytes: tiny.venv.manifest.size + (tiny.repo?.manifest.size ?? 0), bigBytes: big.venv.manifest.size + (big.repo?.manifest.size ?? 0) };

    // ---- cold
    const archive = big.archives.venv!;
    const ours: number[] = [];
    const gnu: number[] = [];
    for (let i = 0; i < 3; i++) {
      for (const [samples, fn] of [
        [ours, (d: string) => extractArchive(archive, d)],
        [gnu, async (d: string) => void execFileSync('tar', ['--zstd', '-xf', archive, '-C', d])],
      ] as const) {
        const d = mkdtempSync(path.join(work, 'cold-'));
        const t0 = performance.now();
        await fn(d);
        samples.push(performance.now() - t0);
        await removeTree(d);
      }
    }
    const extractMode: number[] = [];
    for (let i = 0; i < 3; i++) {
      const t0 = performance.now();
      const sb = await createExtractedEnvSandbox(big, { store });
      await sb.exec(['/bin/true']);
      extractMode.push(performance.now() - t0);
      await sb.close();
    }
    results.cold = { archiveBytes: big.manifest.venv.archiveBytes, ours: summarize(ours), gnuTar: summarize(gnu), extractModeSandbox: summarize(extractMode) };

    // ---- disk
    const diskEnvs: Env[] = [];
    for (let i = 0; i < o.envs; i++) diskEnvs.push(await makeEnv(store, work, python, `disk${i}`, pick(dirs, o.diskEnvMb * MB, 3 * i + 1), 300));
    const archives = diskEnvs.flatMap((e) => [e.archives.venv!, e.archives.repo!]);
    const archiveBytes = duBytes(archives);
    const layerDirs = diskEnvs.flatMap((e) => [e.venv.dir, e.repo!.dir]);
    const per = Math.ceil(o.sandboxes / o.envs);
    const measure = async (mode: 'overlay' | 'extract'): Promise<{ sandboxBytes: number; totalBytes: number; setup: Summary }> => {
      const sbs: EnvSandbox[] = [];
      const setup: number[] = [];
      try {
        for (let i = 0; i < o.sandboxes; i++) {
          const t0 = performance.now();
          const env = diskEnvs[Math.floor(i / per)]!;
          const sb = await (mode === 'extract' ? createExtractedEnvSandbox(env, { store }) : createEnvSandbox(env));
          setup.push(performance.now() - t0);
          sbs.push(sb);
          // What an agent does: edit a file, write a new one.
          await sb.exec('echo edit >> README.md && echo new > notes.txt');
        }
        const privates = sbs.map((s) => s.sandbox.privateDir);
        const scratch = readdirSync(path.dirname(privates[0]!)).filter((n) => n.startsWith('sbx-env')).map((n) => path.join(path.dirname(privates[0]!), n));
        const sandboxBytes = duBytes([...privates, ...(mode === 'extract' ? scratch : [])]);
        // Overlay sandboxes need the store's layers; extracted ones need only the archives.
        const totalBytes = sandboxBytes + (mode === 'overlay' ? duBytes(layerDirs) : 0) + archiveBytes;
        return { sandboxBytes, totalBytes, setup: summarize(setup) };
      } finally {
        for (const s of sbs) await s.close();
      }
    };
    log(`disk: ${o.sandboxes} overlay sandboxes on ${o.envs} envs`);
    const overlay = await measure('overlay');
    log(`disk: ${o.sandboxes} extracted sandboxes`);
    const extracted = await measure('extract');
    const storeDu = await store.du();
    results.disk = { envs: o.envs, sandboxes: o.sandboxes, archiveBytes, layerBytes: duBytes(layerDirs), overlay, extracted, storeDiskBytes: storeDu.diskBytes, storeSavedByDedup: storeDu.savedBytes };

    // ---- dedup across builds
    const sameDirs = pick(dirs, o.diskEnvMb * MB, 5);
    const dedupRuns: Record<string, { contentBytes: number; identicalBytes: number; storeDiskBytes: number; venvIdentical: number; repoIdentical: number; sameVenvLayer: boolean }> = {};
    for (const normalizeTimes of [false, true]) {
      const mode = normalizeTimes ? 'fixed times' : 'build times';
      const dstore = await openStore({ root: path.join(work, `dedup-${normalizeTimes}`) });
      const repo = path.join(work, `dedup-repo-${normalizeTimes}`);
      const first = makeRepo(repo, 300, 'one');
      writeFileSync(path.join(repo, 'src', 'proj', 'mod_0.py'), '# changed at the second commit\n');
      execFileSync('git', ['-c', 'user.name=b', '-c', 'user.email=b@b', 'commit', '-qam', 'two'], { cwd: repo });
      const second = execFileSync('git', ['rev-parse', 'HEAD'], { cwd: repo, encoding: 'utf8' }).trim();
      const build = (commit: string, tag: string) =>
        buildEnv({ name: `dedup ${tag}`, python: python.path, repo: { source: repo, commit }, steps: [copyStep(sameDirs), { run: `echo ${tag}` }] }, { store: dstore, keepArchives: false, normalizeTimes });
      const a = await build(first, 'a');
      await new Promise((r) => setTimeout(r, 1100)); // another second: another mtime for what the build writes
      const b = await build(second, 'b');
      const venvIdentical = identicalBytes(a.venv.path, b.venv.path);
      const repoIdentical = identicalBytes(a.repo!.path, b.repo!.path);
      const du = await dstore.du();
      const contentBytes = [a.venv, a.repo!, b.venv, b.repo!].reduce((n, l) => n + l.manifest.size, 0);
      // Identical trees (times included) are one layer: the second env then stores no venv at all.
      const sameVenvLayer = a.venv.digest === b.venv.digest;
      dedupRuns[mode] = { contentBytes, identicalBytes: venvIdentical + repoIdentical, storeDiskBytes: du.diskBytes, venvIdentical, repoIdentical, sameVenvLayer };
      log(`dedup (${mode}): ${formatBytes(venvIdentical + repoIdentical)} identical of ${formatBytes(contentBytes)}, store on disk ${formatBytes(du.diskBytes)}`);
    }
    results.dedup = dedupRuns;

    if (o.json) {
      process.stdout.write(`${JSON.stringify(results, null, 2)}\n`);
      return;
    }
    const w = results.warm as { tinyBytes: number; bigBytes: number };
    const rows: string[][] = [['measure', 'median', 'p95', 'n']];
    const row = (name: string, s: Summary) => rows.push([name, formatMs(s.median), formatMs(s.p95), String(s.n)]);
    row('floor: Sandbox.create() (no env) -> /bin/true done', bare);
    row(`warm: tiny env (${formatBytes(w.tinyBytes)}) create -> /bin/true done`, warmTiny);
    row(`warm: big env (${formatBytes(w.bigBytes)}) create -> /bin/true done`, warmBig);
    row('warm: big env create -> python import from repo done', warmPy);
    row(`cold: layer extractor, ${formatBytes(big.manifest.venv.archiveBytes ?? 0)} .tar.zst`, summarize(ours));
    row('cold: GNU tar --zstd -xf, same archive', summarize(gnu));
    row('cold: createExtractedEnvSandbox(big) -> /bin/true', summarize(extractMode));
    row(`disk: overlay sandbox setup (${o.envs} envs)`, overlay.setup);
    row(`disk: extract sandbox setup (${o.envs} envs)`, extracted.setup);
    process.stdout.write(`${formatTable(rows)}\n\n`);
    const ratio = (a: number, b: number) => formatRatio(a / b);
    const lines = [
      `warm big/tiny median: ${ratio(warmBig.median, warmTiny.median)}, big/no-env: ${ratio(warmBig.median, bare.median)} (env size ratio ${ratio(w.bigBytes, w.tinyBytes)}); target <= ${TARGET_WARM_MS} ms: ${warmBig.median <= TARGET_WARM_MS && warmTiny.median <= TARGET_WARM_MS ? 'met' : 'NOT met'}`,
      `cold: layer extractor / GNU tar: ${ratio(summarize(ours).median, summarize(gnu).median)}; extracted sandbox / warm overlay sandbox: ${ratio(summarize(extractMode).median, warmBig.median)}`,
      `disk: ${o.envs} env archives: ${formatBytes(archiveBytes)}; store layers: ${formatBytes(duBytes(layerDirs))} (store total ${formatBytes(storeDu.diskBytes)}, dedup saved ${formatBytes(storeDu.savedBytes)})`,
      `disk: ${o.sandboxes} overlay sandboxes: private ${formatBytes(overlay.sandboxBytes)}, with layers + archives ${formatBytes(overlay.totalBytes)} = ${ratio(overlay.totalBytes, archiveBytes)} the archives`,
      `disk: ${o.sandboxes} extract sandboxes: private ${formatBytes(extracted.sandboxBytes)}, with archives ${formatBytes(extracted.totalBytes)} = ${ratio(extracted.totalBytes, archiveBytes)} the archives`,
      `disk: extract / overlay: ${ratio(extracted.totalBytes, overlay.totalBytes)} (sandbox-private bytes: ${ratio(extracted.sandboxBytes, Math.max(1, overlay.sandboxBytes))})`,
      ...Object.entries(dedupRuns).map(
        ([mode, d]) =>
          `dedup, two builds (${mode}): ${formatBytes(d.contentBytes)} of files, ${formatBytes(d.identicalBytes)} identical (venvs ${formatBytes(d.venvIdentical)}, repos at two commits ${formatBytes(d.repoIdentical)}); store on disk ${formatBytes(d.storeDiskBytes)} = ${ratio(d.storeDiskBytes, d.contentBytes)} the files${d.sameVenvLayer ? '; the two venvs are one layer' : ''}`,
      ),
    ];
    process.stdout.write(`${lines.join('\n')}\n`);
  } finally {
    if (!o.dir) await removeTree(root).catch((e: unknown) => log(`cleanup of ${root} failed: ${(e as Error).message}`));
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error).message}\n`);
  process.exitCode = 1;
});

