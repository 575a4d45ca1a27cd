/**
 * Whose ids an image's files get in the store, and how they get there.
 *
 *  - root: the image's own (`tar --same-owner`); a root caller's sandboxes
 *    idmap the layers, so image uid N shows as N inside.
 *  - an unprivileged caller with a subordinate id range: `tar` runs as root
 *    in an `ids: 'range'` sandbox (CAP_CHOWN, CAP_FOWNER, CAP_DAC_OVERRIDE
 *    kept) with the staging directory bound read-write, so image uid 0 is
 *    the caller and uid N is the range's N: exactly what that caller's
 *    `ids: 'range'` sandboxes show as N. Those files are the caller's
 *    subordinate ids' on the host, so the caller cannot always delete them
 *    (a 0700 directory of uid 100000): removal runs `rm -rf` in the same
 *    kind of sandbox (removeForeign).
 *  - no range: every file is the caller's ('squashed'); a sandbox of such an
 *    image runs as root inside whatever the image's USER says.
 */
import { EventEmitter } from 'node:events';
import type { ChildProcess } from 'node:child_process';
import path from 'node:path';
import type { TarSpawner } from '../files/extract.js';
import type { ListingEntry } from '../layers/index.js';
import { idRangeSupport, run, spawn } from '../sandbox/index.js';
import { ImageError } from './errors.js';

export type Owners = 'kept' | 'range' | 'squashed';

export interface OwnersMode {
  owners: Owners;
  /** Why not 'kept' or 'range', for inspect and doctor. */
  reason?: string;
  spawnTar?: TarSpawner;
}

const RANGE_CAPS = ['CAP_CHOWN', 'CAP_FOWNER', 'CAP_DAC_OVERRIDE'];

/** What this caller can keep of an image's owners. */
export function ownersMode(): OwnersMode {
  if ((process.getuid?.() ?? 0) === 0) return { owners: 'kept' };
  const range = idRangeSupport();
  if (!range.ok) return { owners: 'squashed', reason: range.reason };
  return { owners: 'range', spawnTar: rangeTar };
}

/** A command run as root in an `ids: 'range'` sandbox with `dir` bound read-write at the same path, as a ChildProcess look-alike. */
function inRange(argv: string[], dir: string): ChildProcess {
  const child = new EventEmitter() as EventEmitter & { stdin: unknown; stdout: unknown; stderr: unknown; exitCode: number | null; kill: (s?: string) => boolean };
  const proc = spawn({
    root: 'host',
    ids: 'range',
    mounts: [{ type: 'bind', source: dir, target: dir }],
    argv,
    cwd: '/',
    capabilities: RANGE_CAPS,
    stdin: 'pipe',
    stdout: 'ignore',
    stderr: 'pipe',
  });
  child.stdin = proc.stdin;
  child.stdout = null;
  child.stderr = proc.stderr;
  child.exitCode = null;
  child.kill = () => {
    proc.killTree();
    return true;
  };
  proc.exited.then(
    (info) => {
      child.exitCode = info.exitCode ?? 128;
      // Let stderr drain before 'close', as a child process's would.
      setImmediate(() => child.emit('close', info.exitCode, info.signal));
    },
    (err: unknown) => {
      child.exitCode = 127;
      child.emit('error', err);
    },
  );
  return child as unknown as ChildProcess;
}

const rangeTar: TarSpawner = (args) => {
  const i = args.indexOf('-C');
  const dest = i >= 0 ? args[i + 1] : undefined;
  if (!dest) throw new ImageError('internal: tar in a sandbox needs -C DEST');
  return inRange(['tar', ...args], dest);
};

/** Deletes `dir` (a path under the store) from inside an `ids: 'range'` sandbox, where the range's files are root's. */
export async function removeInRange(dir: string): Promise<void> {
  const parent = path.dirname(dir);
  const child = inRange(['rm', '-rf', '--one-file-system', '--', dir], parent);
  let stderr = '';
  (child.stderr as NodeJS.ReadableStream | null)?.on('data', (b: Buffer) => (stderr += b.toString()));
  (child.stdin as NodeJS.WritableStream | null)?.end();
  await new Promise<void>((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code: number | null) => (code === 0 ? resolve() : reject(new ImageError(`remove ${dir} in an ids: 'range' sandbox: rm failed (exit ${code}): ${stderr.trim()}`))));
  });
}

/**
 * The store's listing of a tree of the caller's id range (see
 * lib/layers/verify.ts), read from an `ids: 'range'` sandbox with
 * CAP_DAC_READ_SEARCH, where directories and files only their (subordinate)
 * owners may read are readable: GNU find for types, modes, sizes, mtimes
 * (ns) and link targets, sha256sum for contents, both NUL-separated, then
 * put in the order of walkTree (names compared as bytes, a directory
 * before its contents).
 */
export async function listInRange(tree: string): Promise<ListingEntry[]> {
  const inSandbox = async (argv: string[]): Promise<Buffer> => {
    const r = await run({
      root: 'host',
      ids: 'range',
      mounts: [{ type: 'bind', source: tree, target: tree, readOnly: true }],
      argv,
      cwd: tree,
      capabilities: ['CAP_DAC_READ_SEARCH'],
      encoding: 'buffer',
      maxBuffer: 1 << 30,
    });
    if (r.exitCode !== 0) throw new ImageError(`list ${tree} in an ids: 'range' sandbox: ${argv[0]} failed (exit ${r.exitCode}): ${r.stderr.toString().trim()}`);
    return r.stdout;
  };
  const [found, sums] = await Promise.all([
    inSandbox(['find', '.', '-printf', '%y\\0%m\\0%s\\0%T@\\0%l\\0%P\\0']),
    inSandbox(['sh', '-c', 'find . -type f -print0 | xargs -0 -r sha256sum -z --']),
  ]);
  const hashes = new Map<string, string>();
  for (const rec of sums.toString('utf8').split('\0')) {
    if (rec === '') continue;
    // "<hex>  ./<path>"
    hashes.set(rec.slice(66).replace(/^\.\//, ''), rec.slice(0, 64));
  }
  const f = found.toString('utf8').split('\0');
  const TYPE_BITS: Record<string, number> = { c: 0o020000, b: 0o060000, p: 0o010000, s: 0o140000 };
  const out: Array<{ parts: Buffer[]; entry: ListingEntry }> = [];
  for (let i = 0; i + 5 < f.length; i += 6) {
    const [y, m, size, t, link, rel] = f.slice(i, i + 6) as [string, string, string, string, string, string];
    const name = rel === '' ? '.' : rel;
    const mode = parseInt(m, 8);
    let entry: ListingEntry;
    if (y === 'd') entry = [name, 'd', mode.toString(8)];
    else if (y === 'l') entry = [name, 'l', link];
    else if (y === 'f') {
      const [sec, frac = ''] = t.split('.');
      const ns = BigInt(sec!) * 1_000_000_000n + BigInt(frac.slice(0, 9).padEnd(9, '0'));
      const sha = hashes.get(rel);
      if (sha === undefined) throw new ImageError(`list ${tree}: no content hash for ${rel}`);
      entry = [name, 'f', mode.toString(8), Number(size), ns.toString(), sha];
    } else entry = [name, 'o', ((TYPE_BITS[y] ?? 0) | mode).toString(8)];
    out.push({ parts: rel === '' ? [] : rel.split('/').map((c) => Buffer.from(c)), entry });
  }
  out.sort((a, b) => {
    for (let k = 0; k < Math.min(a.parts.length, b.parts.length); k++) {
      const c = Buffer.compare(a.parts[k]!, b.parts[k]!);
      if (c !== 0) return c;
    }
    return a.parts.length - b.parts.length;
  });
  return out.map((o) => o.entry);
}
