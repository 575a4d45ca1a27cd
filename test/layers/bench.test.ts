import { execFileSync } from 'node:child_process';
import { accessSync, constants, mkdirSync, mkdtempSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { extractArchive } from '../../lib/files/index.js';
import { openStore } from '../../lib/layers/index.js';
import { tmpDir } from './helpers.js';

/**
 * Throughput of extractArchive (zstd -dc -> TarChecker in Node -> tar -x)
 * against plain `tar --zstd -xf` on the same archive: Debian's Python 3.11
 * stdlib + dist-packages, readable by any user. Figures are logged; the
 * assertion is only a loose bound so a noisy VM does not fail the suite.
 */
// LAYERS_BENCH=1: the full run (stdlib + dist-packages, ext4 and tmpfs, 3
// rounds each, ~50 s here). Default: a quick run (stdlib only) that keeps the
// suite fast but still compares the two.
const FULL = process.env.LAYERS_BENCH === '1';
const SOURCES = FULL ? ['python3.11', 'python3/dist-packages'] : ['python3.11'];
const readable = SOURCES.every((s) => {
  try {
    accessSync(path.join('/usr/lib', s), constants.R_OK);
    return true;
  } catch {
    return false;
  }
});

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)]!;
}

describe.skipIf(!readable)('unpack throughput', () => {
  const t = tmpDir('bench');
  const shm = (() => {
    try {
      return mkdtempSync('/dev/shm/msb-layers-bench-');
    } catch {
      return undefined;
    }
  })();
  afterAll(() => {
    t.cleanup();
    if (shm) rmSync(shm, { recursive: true, force: true });
  });

  it('extractArchive vs plain tar --zstd -xf, and a full store.addArchive', { timeout: 240_000 }, async () => {
    const archive = path.join(t.dir, 'py.tar.zst');
    execFileSync('tar', ['-c', '--zstd', '-f', archive, '-C', '/usr/lib', ...SOURCES], {
      stdio: ['ignore', 'ignore', 'ignore'],
    });
    const files = Number(execFileSync('sh', ['-c', `tar --zstd -tf ${archive} | wc -l`], { encoding: 'utf8' }).trim());
    const tarBytes = Number(execFileSync('sh', ['-c', `zstd -dc ${archive} | wc -c`], { encoding: 'utf8' }).trim());
    const size = statSync(archive).size;
    const report: string[] = [`archive ${(size / 1e6).toFixed(1)} MB zstd, ${(tarBytes / 1e6).toFixed(1)} MB tar, ${files} entries`];
    const targets = FULL ? ([['ext4 /tmp', t.dir], ['tmpfs /dev/shm', shm]] as const) : ([['tmpfs /dev/shm', shm ?? t.dir]] as const);
    for (const [fsName, base] of targets) {
      if (!base) continue;
      const plain: number[] = [];
      const ours: number[] = [];
      for (let i = 0; i < 3; i++) {
        const d1 = path.join(base, `plain-${i}`);
        mkdirSync(d1);
        let s = performance.now();
        execFileSync('tar', ['--zstd', '-xf', archive, '-C', d1]);
        plain.push(performance.now() - s);
        const d2 = path.join(base, `ours-${i}`);
        mkdirSync(d2);
        s = performance.now();
        await extractArchive(archive, d2);
        ours.push(performance.now() - s);
        rmSync(d1, { recursive: true, force: true });
        rmSync(d2, { recursive: true, force: true });
      }
      const p = median(plain);
      const o = median(ours);
      report.push(
        `${fsName}: tar --zstd -xf ${p.toFixed(0)} ms (${(tarBytes / 1e3 / p).toFixed(0)} MB/s), ` +
          `extractArchive ${o.toFixed(0)} ms (${(tarBytes / 1e3 / o).toFixed(0)} MB/s, ${(files / (o / 1000)).toFixed(0)} entries/s), ratio ${(o / p).toFixed(2)}`,
      );
      // Speed is judged by benchmarks, not here: this only catches a pathological regression.
      expect(o).toBeLessThan(p * 10 + 5000);
      for (const dedup of [false, true]) {
        const root = path.join(base, `store-${dedup}`);
        const store = await openStore({ root, dedup });
        const s = performance.now();
        await store.addArchive(archive);
        const ms = performance.now() - s;
        report.push(`${fsName}: store.addArchive (hash + checked unpack + read-only${dedup ? ' + dedup' : ''}) ${ms.toFixed(0)} ms`);
        if (dedup) {
          const du = await store.du();
          report.push(`${fsName}: du apparent ${(du.apparentBytes / 1e6).toFixed(1)} MB, disk ${(du.diskBytes / 1e6).toFixed(1)} MB, saved ${(du.savedBytes / 1e6).toFixed(2)} MB`);
        }
        await store.gc({ inUse: [] });
      }
    }
    console.log(`[bench]\n  ${report.join('\n  ')}`);
  });
});
