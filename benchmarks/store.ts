/**
 * The layer store's extractor and addArchive against GNU tools doing the
 * same work, on a real venv archive (issue 12: "unpacking at GNU tar's
 * speed", "hashing at disk speed").
 *
 *   node dist/benchmarks/store.js [--archive FILE | --site-packages MB] [--rounds N]
 *                                 [--prefix PATH] [--walks] [--dir DIR] [--cache DIR] [--json]
 *
 * Each round times, in a rotating order so a shared machine's drift falls on
 * all alike:
 *   tar            GNU `tar --zstd -xf` of the archive (the unpack peer)
 *   extract        the store's checked extractor (lib/files/extract.ts, unpack.ts)
 *   extract+hash   the same, hashing every file as it passes (hashFiles: what addArchive runs)
 *   tar+sha256     tar, then `sha256sum` of every file (unpack + one read of the data)
 *   add            store.addArchive into an empty store: extract+hash, then
 *                  finishing in the worker pool, which takes those hashes
 *   add (reread)   the same, finishing reading every file again (addArchive before the overlap)
 *   add (walks)    with --walks: the reference finishing of five promise walks
 *   verify         store.verify() of a layer built from the archive (the worker pool)
 *   verify (walk)  treeListing of the same layer, the promise walk verify used before
 * Each sample also records the CPU time of this process and of the children
 * it waited for (/proc/self/stat: tar, zstd), so that a loaded machine's
 * wall times can be read against the work done.
 *
 * Verdicts: tar / extract >= 0.9 (the extractor at GNU tar's speed; also
 * shown with hashing), add (reread) / add > 1 (hashing overlapped), and the
 * finishing's own cost (add - extract+hash) against sha256sum's pass.
 *
 * The default archive is a real venv (python 3.11 with numpy, pandas, django,
 * sympy, networkx, pygments: about 320 MB and 19.6k entries), made once with
 * pip (from the machine's local indexes under /opt/pypi when present) and
 * packed by the store's own packDirectory into --cache (default
 * /var/cache/minisandbox/bench), then copied to --dir (tmpfs, /dev/shm) for
 * the run. --site-packages MB packs the base Python's largest packages
 * instead (no pip). Progress goes to stderr, results to stdout.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { copyFileSync, readFileSync } from 'node:fs';
import { extractArchive, packDirectory, removeTree } from '../lib/files/index.js';
import { stopUnpackWorkers } from '../lib/files/unpack.js';
import { formatMs, formatRatio, formatTable } from '../lib/format.js';
import { openStore, type Layer, type LayerStore } from '../lib/layers/index.js';
import { stopFinishWorkers } from '../lib/layers/finish.js';
import { treeListing } from '../lib/layers/verify.js';
import { count, file, flag, readArgs, text, toggle } from './lib/args.js';
import { median } from './lib/stats.js';

interface Options {
  archive?: string;
  /** Pack the base Python's site-packages (this many MB) instead of the venv. */
  sitePackages?: number;
  rounds: number;
  prefix?: string;
  walks: boolean;
  dir: string;
  cache: string;
  json: boolean;
}

const USAGE =
  'usage: node dist/benchmarks/store.js [--archive FILE | --site-packages MB] [--rounds N] [--prefix PATH] [--walks] [--dir DIR] [--cache DIR] [--json]';
const TARGET_TAR_RATIO = 0.9;
const TARGET_SPEEDUP = 3;
const TARGET_FINISH_VS_SHA = 2;

function parseOptions(): Options {
  const v = readArgs(USAGE, {
    archive: file(),
    'site-packages': count(undefined, ['mb']),
    rounds: count(5),
    prefix: text(),
    walks: toggle(false),
    dir: file(existsSync('/dev/shm') ? '/dev/shm' : tmpdir()),
    cache: file('/var/cache/minisandbox/bench'),
    json: flag(),
  });
  return {
    archive: v.archive,
    sitePackages: v['site-packages'],
    prefix: v.prefix,
    rounds: v.rounds,
    walks: v.walks,
    dir: v.dir,
    cache: v.cache,
    json: v.json,
  };
}

const log = (msg: string) => process.stderr.write(`[store bench] ${msg}\n`);
const MB = 1024 * 1024;

function sh(cmd: string): string {
  return execFileSync('sh', ['-c', cmd], { encoding: 'utf8', maxBuffer: 64 * MB });
}

/** The largest top-level packages of the base Python's site-packages, up to `mb` MB, as a .tar.zst. */
function makeSitePackagesArchive(dir: string, mb: number): string {
  const out = path.join(dir, `msbx-store-bench-${mb}mb.tar.zst`);
  if (existsSync(out)) return out;
  const python = ['/root/.pyenv/versions/3.11.7/bin/python3', 'python3'].find((p) => !p.startsWith('/') || existsSync(p))!;
  const site = sh(`${python} -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'`).trim();
  const sizes = sh(`cd '${site}' && du -sb -- */ 2>/dev/null | sort -rn`)
    .split('\n')
    .filter(Boolean)
    .map((l) => {
      const [bytes, name] = l.split('\t');
      return { bytes: Number(bytes), name: name!.replace(/\/$/, '') };
    })
    .filter((p) => !p.name.endsWith('.dist-info') && p.name !== '__pycache__');
  const picked: string[] = [];
  let total = 0;
  for (const p of sizes) {
    if (total + p.bytes > mb * MB) continue;
    picked.push(p.name);
    total += p.bytes;
  }
  if (picked.length === 0) throw new Error(`no package of ${site} fits in ${mb} MB`);
  log(`making ${out}: ${picked.length} packages of ${site}, ${(total / MB).toFixed(0)} MB`);
  sh(`cd '${site}' && tar -cf - ${picked.map((p) => `'${p}'`).join(' ')} | zstd -3 -T0 -q -o '${out}.tmp' && mv '${out}.tmp' '${out}'`);
  return out;
}

const VENV_PACKAGES = ['numpy', 'pandas', 'django', 'sympy', 'networkx', 'pygments'];

/** A venv of python 3.11 with VENV_PACKAGES, packed by packDirectory, cached in `cache`; copied to `dir`. */
async function makeVenvArchive(cache: string, dir: string): Promise<string> {
  const name = `venv-py311-${VENV_PACKAGES.join('-')}.tar.zst`;
  const cached = path.join(cache, name);
  if (!existsSync(cached)) {
    mkdirSync(cache, { recursive: true });
    const python = ['/root/.pyenv/versions/3.11.7/bin/python3', '/usr/bin/python3.11'].find((p) => existsSync(p)) ?? 'python3.11';
    const venv = path.join(cache, 'venv');
    if (!existsSync(path.join(venv, 'bin', 'python'))) {
      log(`making a venv in ${venv} with ${python}: ${VENV_PACKAGES.join(' ')}`);
      sh(`rm -rf '${venv}' && '${python}' -m venv '${venv}'`);
      // The machine's local indexes when it has them (no network needed).
      const index = existsSync('/opt/pypi/simple') ? `--index-url file:///opt/pypi/simple ${existsSync('/opt/pypi-more/simple') ? '--extra-index-url file:///opt/pypi-more/simple' : ''}` : '';
      sh(`'${venv}/bin/pip' install -q ${index} ${VENV_PACKAGES.join(' ')} 2>&1 | grep -v 'is ignored' || true`);
      if (!existsSync(path.join(venv, 'lib', 'python3.11', 'site-packages', 'numpy'))) throw new Error(`pip could not install ${VENV_PACKAGES.join(' ')} into ${venv}`);
    }
    log(`packing ${venv} into ${cached}`);
    await packDirectory(venv, cached);
  }
  const out = path.join(dir, `msbx-store-bench-${name}`);
  if (!existsSync(out) || statSync(out).size !== statSync(cached).size) copyFileSync(cached, out);
  return out;
}

interface Sample {
  wall: number;
  /** This process's CPU time (all threads). */
  cpu: number;
  /** The same plus the children it waited for (tar, zstd, sha256sum). */
  cpuAll: number;
}

const TICK_MS = 1000 / Number(sh('getconf CLK_TCK').trim() || 100);

/** utime + stime + cutime + cstime of this process, ms. */
function cpuWithChildren(): number {
  const stat = readFileSync('/proc/self/stat', 'latin1');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // Fields 14-17 (utime stime cutime cstime) are 11-14 after the command name and state.
  return (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) * TICK_MS;
}

async function timed(fn: () => Promise<unknown>): Promise<Sample> {
  const c0 = process.cpuUsage();
  const a0 = cpuWithChildren();
  const t0 = performance.now();
  await fn();
  const wall = performance.now() - t0;
  const c = process.cpuUsage(c0);
  return { wall, cpu: (c.user + c.system) / 1000, cpuAll: cpuWithChildren() - a0 };
}

async function main(): Promise<void> {
  const o = parseOptions();
  mkdirSync(o.dir, { recursive: true });
  const archive = o.archive ?? (o.sitePackages ? makeSitePackagesArchive(o.dir, o.sitePackages) : await makeVenvArchive(o.cache, o.dir));
  const work = mkdtempSync(path.join(o.dir, 'msbx-store-bench-'));
  const listing = sh(`tar --zstd -tvf '${archive}'`).split('\n').filter(Boolean);
  const files = listing.filter((l) => l.startsWith('-')).length;
  const unpacked = listing.filter((l) => l.startsWith('-')).reduce((sum, l) => sum + Number(l.split(/\s+/)[2]), 0);
  log(`archive ${archive}: ${(statSync(archive).size / MB).toFixed(0)} MB, ${listing.length} entries, ${files} files, ${(unpacked / MB).toFixed(0)} MB unpacked; rounds ${o.rounds}`);
  let n = 0;
  const fresh = (): string => {
    const d = path.join(work, String(n++));
    mkdirSync(d);
    return d;
  };
  const addOpts = o.prefix ? { prefix: o.prefix } : {};
  // One layer, kept across rounds, for the verify contenders.
  const verifyStore: LayerStore = await openStore({ root: path.join(o.dir, `msbx-store-bench-verify-${process.pid}`), budget: false });
  const verifyLayer: Layer = await verifyStore.addArchive(archive, addOpts);
  const contenders: Record<string, () => Promise<Sample>> = {
    tar: () => {
      const d = fresh();
      return timed(async () => execFileSync('tar', ['--zstd', '-xf', archive, '-C', d]));
    },
    extract: () => {
      const d = fresh();
      return timed(() => extractArchive(archive, d));
    },
    'extract+hash': () => {
      const d = fresh();
      return timed(() => extractArchive(archive, d, { hashFiles: true }));
    },
    'tar+sha256': () => {
      const d = fresh();
      return timed(async () => {
        execFileSync('tar', ['--zstd', '-xf', archive, '-C', d]);
        sh(`cd '${d}' && find . -type f -print0 | xargs -0 -n 2000 sha256sum > /dev/null`);
      });
    },
    add: async () => {
      const store = await openStore({ root: fresh(), budget: false });
      return timed(() => store.addArchive(archive, addOpts));
    },
    'add (reread)': async () => {
      const store = await openStore({ root: fresh(), budget: false, finish: 'reread' });
      return timed(() => store.addArchive(archive, addOpts));
    },
    ...(o.walks
      ? {
          'add (walks)': async () => {
            const store = await openStore({ root: fresh(), budget: false, finish: 'walks' });
            return timed(() => store.addArchive(archive, addOpts));
          },
        }
      : {}),
    verify: () =>
      timed(async () => {
        const [check] = await verifyStore.verify([verifyLayer.digest]);
        if (check?.status !== 'ok') throw new Error(`verify of the benchmark layer: ${check?.status}`);
      }),
    'verify (walk)': () => timed(() => treeListing(verifyLayer.path, { cache: new Map() })),
  };
  const names = Object.keys(contenders);
  const samples: Record<string, Sample[]> = Object.fromEntries(names.map((k) => [k, []]));
  try {
    for (let r = 0; r < o.rounds; r++) {
      // Rotate the order: each contender runs first in some round.
      const order = names.map((_, i) => names[(i + r) % names.length]!);
      for (const k of order) {
        const s = await contenders[k]!();
        samples[k]!.push(s);
        log(`round ${r + 1}: ${k} ${formatMs(s.wall)} (cpu ${formatMs(s.cpuAll)})`);
        for (const d of readdirSync(work)) await removeTree(path.join(work, d));
      }
    }
  } finally {
    await removeTree(work);
    await removeTree(verifyStore.root);
    stopFinishWorkers();
    stopUnpackWorkers();
  }
  const med = (k: string, f: (s: Sample) => number = (s) => s.wall): number => median(samples[k]!.map(f));
  const tarRatio = med('tar') / med('extract');
  const tarRatioHash = med('tar') / med('extract+hash');
  const add = med('add');
  const reread = med('add (reread)');
  const walks = o.walks ? med('add (walks)') : NaN;
  const finishing = add - med('extract+hash');
  const shaPass = med('tar+sha256') - med('tar');
  const result = {
    archive,
    entries: listing.length,
    files,
    unpackedBytes: unpacked,
    rounds: o.rounds,
    loadavg: sh('cat /proc/loadavg').trim(),
    medianMs: Object.fromEntries(names.map((k) => [k, med(k)])),
    cpuMs: Object.fromEntries(names.map((k) => [k, med(k, (s) => s.cpu)])),
    cpuWithChildrenMs: Object.fromEntries(names.map((k) => [k, med(k, (s) => s.cpuAll)])),
    tarOverExtract: tarRatio,
    tarOverExtractHash: tarRatioHash,
    rereadOverAdd: reread / add,
    ...(o.walks ? { walksOverAdd: walks / add } : {}),
    verifyWalkOverVerify: med('verify (walk)') / med('verify'),
    finishingMs: finishing,
    sha256PassMs: shaPass,
    finishingVsSha256: finishing / shaPass,
  };
  if (o.json) {
    process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    return;
  }
  const rows = [['', 'median', 'cpu (process)', 'cpu (+children)']];
  for (const k of names) rows.push([k, formatMs(med(k)), formatMs(med(k, (s) => s.cpu)), formatMs(med(k, (s) => s.cpuAll))]);
  process.stdout.write(
    `archive ${archive}: ${listing.length} entries, ${files} files, ${(unpacked / MB).toFixed(0)} MB unpacked; ${o.rounds} rounds; load ${result.loadavg}\n\n`,
  );
  process.stdout.write(`${formatTable(rows)}\n\n`);
  const verdict = (ok: boolean) => (ok ? 'ok' : 'FAIL');
  process.stdout.write(`tar / extract: ${formatRatio(tarRatio)} (target >= ${TARGET_TAR_RATIO}): ${verdict(tarRatio >= TARGET_TAR_RATIO)}\n`);
  process.stdout.write(`tar / extract+hash: ${formatRatio(tarRatioHash)} (target >= ${TARGET_TAR_RATIO}): ${verdict(tarRatioHash >= TARGET_TAR_RATIO)}\n`);
  process.stdout.write(`add (reread) / add: ${formatRatio(reread / add)} (hashing overlapped with the unpack; target > 1): ${verdict(reread / add > 1)}\n`);
  if (o.walks) process.stdout.write(`add (walks) / add: ${formatRatio(walks / add)} (target >= ${TARGET_SPEEDUP}): ${verdict(walks / add >= TARGET_SPEEDUP)}\n`);
  process.stdout.write(`verify (walk) / verify: ${formatRatio(result.verifyWalkOverVerify)}\n`);
  process.stdout.write(
    `finishing (add - extract+hash) ${formatMs(finishing)} against sha256sum's pass ${formatMs(shaPass)}: ${formatRatio(finishing / shaPass)} (target <= ${TARGET_FINISH_VS_SHA}): ${verdict(finishing / shaPass <= TARGET_FINISH_VS_SHA)}\n`,
  );
  process.stdout.write(`add / tar+sha256: ${formatRatio(add / med('tar+sha256'))}\n`);
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
