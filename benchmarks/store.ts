/**
 * The layer store's addArchive: unpack + finishing (prefix scan, read-only
 * modes, dedup, listing), against the same work done by GNU tools.
 *
 *   node dist/benchmarks/store.js [--archive FILE] [--mb N] [--rounds N]
 *                                 [--prefix PATH] [--no-walks] [--dir DIR] [--json]
 *
 * Each round times, in a rotating order so a shared machine's drift falls on
 * all alike:
 *   tar          GNU `tar --zstd -xf` of the archive (the unpack peer)
 *   tar+sha256   the same, then `sha256sum` of every file (the peer of
 *                unpack + one read of the data, what finishing must at least do)
 *   extract      the store's checked extractor alone (lib/files/extract.ts)
 *   add          store.addArchive into an empty store: extract + finishing in
 *                the worker pool (lib/layers/finish.ts)
 *   add (walks)  the same with the reference finishing it replaced (five
 *                walks of promise calls; the store's internal finish: 'walks')
 * and the CPU time of both adds (all threads of this process; tar and zstd
 * are children and not counted).
 *
 * Verdicts: add (walks) / add >= 3 (issue 12's "dedup speed"), and the
 * finishing's own cost (add - extract) within 2x of sha256sum's pass over
 * the same files.
 *
 * The default archive is made once in --dir from the base Python's
 * site-packages (the largest packages up to --mb MB of files, default 280):
 * no network needed. Progress goes to stderr, results to stdout.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { extractArchive, removeTree } from '../lib/files/index.js';
import { formatMs, formatRatio, formatTable } from '../lib/format.js';
import { openStore } from '../lib/layers/index.js';
import { stopFinishWorkers } from '../lib/layers/finish.js';
import { median } from './lib/stats.js';

interface Options {
  archive?: string;
  mb: number;
  rounds: number;
  prefix?: string;
  walks: boolean;
  dir: string;
  json: boolean;
}

const USAGE = 'usage: node dist/benchmarks/store.js [--archive FILE] [--mb N] [--rounds N] [--prefix PATH] [--no-walks] [--dir DIR] [--json]';
const TARGET_SPEEDUP = 3;
const TARGET_FINISH_VS_SHA = 2;

function parseArgs(argv: string[]): Options {
  const o: Options = { mb: 280, rounds: 3, walks: true, dir: existsSync('/dev/shm') ? '/dev/shm' : tmpdir(), json: false };
  const num = (flag: string, v: string | undefined): number => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < 1) throw new Error(`${flag} needs a positive integer, got ${v}\n${USAGE}`);
    return n;
  };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--json') o.json = true;
    else if (a === '--no-walks') o.walks = false;
    else if (a === '--archive') o.archive = path.resolve(argv[++i] ?? '');
    else if (a === '--mb') o.mb = num(a, argv[++i]);
    else if (a === '--rounds') o.rounds = num(a, argv[++i]);
    else if (a === '--prefix') o.prefix = argv[++i];
    else if (a === '--dir') o.dir = path.resolve(argv[++i] ?? '');
    else throw new Error(`unknown argument ${a}\n${USAGE}`);
  }
  return o;
}

const log = (msg: string) => process.stderr.write(`[store bench] ${msg}\n`);
const MB = 1024 * 1024;

function sh(cmd: string): string {
  return execFileSync('sh', ['-c', cmd], { encoding: 'utf8', maxBuffer: 64 * MB });
}

/** The largest top-level packages of the base Python's site-packages, up to `mb` MB, as a .tar.zst. */
function makeArchive(dir: string, mb: number): string {
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

interface Sample {
  wall: number;
  cpu?: number;
}

async function timed(fn: () => Promise<unknown>): Promise<Sample> {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  await fn();
  const wall = performance.now() - t0;
  const c = process.cpuUsage(c0);
  return { wall, cpu: (c.user + c.system) / 1000 };
}

async function main(): Promise<void> {
  const o = parseArgs(process.argv.slice(2));
  mkdirSync(o.dir, { recursive: true });
  const archive = o.archive ?? makeArchive(o.dir, o.mb);
  const work = mkdtempSync(path.join(o.dir, 'msbx-store-bench-'));
  const files = Number(sh(`tar --zstd -tvf '${archive}' | grep -c '^-'`).trim());
  const unpacked = Number(sh(`tar --zstd -tvf '${archive}' | awk '$1 ~ /^-/ {s += $3} END {print s}'`).trim());
  log(`archive ${archive}: ${(statSync(archive).size / MB).toFixed(0)} MB, ${files} files, ${(unpacked / MB).toFixed(0)} MB unpacked; rounds ${o.rounds}`);
  let n = 0;
  const fresh = (): string => {
    const d = path.join(work, String(n++));
    mkdirSync(d);
    return d;
  };
  const contenders: Record<string, () => Promise<Sample>> = {
    tar: () => {
      const d = fresh();
      return timed(async () => execFileSync('tar', ['--zstd', '-xf', archive, '-C', d]));
    },
    'tar+sha256': () => {
      const d = fresh();
      return timed(async () => {
        execFileSync('tar', ['--zstd', '-xf', archive, '-C', d]);
        sh(`cd '${d}' && find . -type f -print0 | xargs -0 -n 2000 sha256sum > /dev/null`);
      });
    },
    extract: () => {
      const d = fresh();
      return timed(() => extractArchive(archive, d));
    },
    add: async () => {
      const store = await openStore({ root: fresh(), budget: false });
      return timed(() => store.addArchive(archive, o.prefix ? { prefix: o.prefix } : {}));
    },
    ...(o.walks
      ? {
          'add (walks)': async () => {
            const store = await openStore({ root: fresh(), budget: false, finish: 'walks' });
            return timed(() => store.addArchive(archive, o.prefix ? { prefix: o.prefix } : {}));
          },
        }
      : {}),
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
        log(`round ${r + 1}: ${k} ${formatMs(s.wall)}`);
        for (const d of readdirSync(work)) await removeTree(path.join(work, d));
      }
    }
  } finally {
    await removeTree(work);
    stopFinishWorkers();
  }
  const med = (k: string, f: (s: Sample) => number | undefined = (s) => s.wall): number => median(samples[k]!.map((s) => f(s) ?? NaN));
  const add = med('add');
  const walks = o.walks ? med('add (walks)') : NaN;
  const finishing = add - med('extract');
  const shaPass = med('tar+sha256') - med('tar');
  const speedup = walks / add;
  const result = {
    archive,
    files,
    unpackedBytes: unpacked,
    rounds: o.rounds,
    loadavg: sh('cat /proc/loadavg').trim(),
    medianMs: Object.fromEntries(names.map((k) => [k, med(k)])),
    cpuMs: { add: med('add', (s) => s.cpu), ...(o.walks ? { 'add (walks)': med('add (walks)', (s) => s.cpu) } : {}) },
    finishingMs: finishing,
    sha256PassMs: shaPass,
    speedup,
    finishingVsSha256: finishing / shaPass,
  };
  if (o.json) {
    process.stdout.write(`${JSON.stringify(result, null, 2)}\n`);
    return;
  }
  const rows = [['', 'median', 'cpu (this process)']];
  for (const k of names) rows.push([k, formatMs(med(k)), k.startsWith('add') ? formatMs(med(k, (s) => s.cpu)) : '']);
  process.stdout.write(`archive ${archive}: ${files} files, ${(unpacked / MB).toFixed(0)} MB unpacked; ${o.rounds} rounds; load ${result.loadavg}\n\n`);
  process.stdout.write(`${formatTable(rows)}\n\n`);
  const verdict = (ok: boolean) => (ok ? 'ok' : 'FAIL');
  if (o.walks)
    process.stdout.write(`add (walks) / add: ${formatRatio(speedup)} (target >= ${TARGET_SPEEDUP}): ${verdict(speedup >= TARGET_SPEEDUP)}\n`);
  process.stdout.write(
    `finishing (add - extract) ${formatMs(finishing)} against sha256sum's pass ${formatMs(shaPass)}: ${formatRatio(finishing / shaPass)} (target <= ${TARGET_FINISH_VS_SHA}): ${verdict(finishing / shaPass <= TARGET_FINISH_VS_SHA)}\n`,
  );
  process.stdout.write(`add / tar+sha256: ${formatRatio(add / med('tar+sha256'))}\n`);
}

main().catch((err: unknown) => {
  process.stderr.write(`${(err as Error).stack ?? String(err)}\n`);
  process.exit(1);
});
