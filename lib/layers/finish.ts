import { promises as fsp } from 'node:fs';
import os from 'node:os';
import { Worker } from 'node:worker_threads';
import { makeReadOnly, type TreeCounts } from '../files/fsTree.js';
import type { FileDigest } from '../files/unpack.js';
import { dedupTree, type DedupOptions, type DedupResult } from './dedup.js';
import { LayerError } from './errors.js';
import { PATH_CHAR, findPrefix, isPyc, scanForPrefix, type PrefixFile, type PrefixFileKind } from './relocate.js';
import { listingText, treeListing, type HashCache, type ListingEntry, type ListingResult } from './verify.js';

/**
 * Finishing a layer's tree before it is published: scan for the build prefix,
 * clear write and set-id bits, dedup against the object store, count, list.
 *
 * What it produces is fixed by the store's format (the same prefixFiles,
 * dedup decisions and keys, modes, counts and listing.jsonl bytes as
 * `finishTreeByWalks`, the reference kept below); how is about speed. On a
 * 32k-entry, 280 MB venv on tmpfs the reference took 12-14 s, five times the
 * unpack: it walks the tree five times (scan, files' modes, dedup, dirs'
 * modes, listing), each entry an awaited lstat, and reads every file through
 * promise calls, so the main thread spends its time creating promises and
 * waiting on libuv's four-thread pool. Here:
 *
 * - one walk, whose lstat results every later step reuses. Nothing else
 *   touches the staging tree meanwhile, and the steps change nothing a later
 *   step reads from the stats but the modes they set themselves (computed
 *   here) and dedup's links, which swap a file for an inode with the same
 *   content, mode, owner, mtime and size (the object key and the size check
 *   say so), so the stats describe the tree as published;
 * - one read per inode, which feeds both the content hash (dedup key and
 *   listing) and the prefix scan;
 * - the file system calls made synchronously in worker threads: a sync call
 *   in a worker costs the syscall, not a promise, a libuv work item and two
 *   thread hops, and the workers hash in parallel (one per core, at most 4).
 *   The event loop of the caller stays free.
 *
 * The order of the steps is the reference's: files lose their write bits
 * before dedup (the key holds the final mode, and a chmod after linking would
 * change the shared object), directories only after dedup (it renames into
 * them). Dedup links files in tree order within each key, sharded by key
 * across the workers: every name of an inode has the same key, and files of
 * different keys never touch the same object or temporary name, so each
 * decision (the first file becomes the object, the others link to it, EMLINK,
 * maxLinks, a vanished object retried) is the one a single ordered pass makes.
 */
export interface FinishOptions {
  objectsDir: string;
  /** Dedup against objectsDir with these options; undefined: no dedup. */
  dedup?: DedupOptions;
  /** Absolute build prefix to scan for. */
  prefix?: string;
  /**
   * Content of files already hashed as they were written (extractArchive's
   * hashFiles), by path relative to the tree: such a file is not read
   * again, unless the prefix scan must read it anyway, or its size is not
   * the one recorded (then it is read, and that hash counts). Only for a
   * tree nothing else has written since (the store's private staging tree).
   */
  known?: Map<string, FileDigest>;
}

export interface FinishResult {
  /** Files embedding the prefix, when one was given. */
  prefixFiles?: PrefixFile[];
  dedup?: DedupResult;
  /** Entries, regular files and their bytes, the tree's root left out. */
  counts: TreeCounts;
  /** listing.jsonl's text (see verify.ts). */
  listing: string;
}

/** The reference: each step its own walk with promise calls (the store's path until the worker pool; kept for benchmarks and tests). */
export async function finishTreeByWalks(tree: string, opts: FinishOptions): Promise<FinishResult> {
  // Scan before anything else touches the tree.
  const prefixFiles = opts.prefix ? await scanForPrefix(tree, opts.prefix) : undefined;
  // Files first: dedup keys on the final mode. Directories stay writable
  // until dedup has swapped its hard links in.
  await makeReadOnly(tree, 'files');
  const hashes = new Map<string, string>();
  const dedup = opts.dedup ? await dedupTree(tree, opts.objectsDir, opts.dedup, hashes) : undefined;
  const counts = await makeReadOnly(tree, 'dirs');
  // Last, so it records the tree exactly as published; dedup's content
  // hashes are reused (an object has the content of the file it replaced).
  const listing = await treeListing(tree, { known: hashes });
  return { ...(prefixFiles ? { prefixFiles } : {}), ...(dedup ? { dedup } : {}), counts, listing: listing.text };
}

// ---------------------------------------------------------------------------
// The worker's side. workerMain runs in the worker from its source text (see
// WORKER_SOURCE), so it uses nothing of this module but its parameters: the
// same source runs whether this module was compiled by tsc, is run by vitest
// from lib/ or was bundled, with no worker file to find next to it.

/**
 * One entry of a directory: name, mode, size, mtime ns, uid, gid, ino, dev
 * (64-bit values as decimal strings), then what reading it gave: a file's
 * content sha256 or a symlink's target ('' for anything else), and the kind
 * of prefix match found ('' for none or no scan).
 */
type Row = [string, number, number, string, number, number, string, string, string, PrefixFileKind | '', WireError?];
/** Files of one directory already hashed: name -> [sha256, size]. */
type KnownDigests = Record<string, [string, number]>;
/** A directory's rows, or why it could not be listed. */
type DirResult = Row[] | { error: WireError };
/** Link one file to its dedup object: rel, key, ino, dev, size, its index in walk order. */
type LinkJob = [string, string, string, string, number, number];
/** A link shard's counts, and its failure with the walk index of the file it failed on. */
type LinkResult = DedupResult & { failed?: { at: number; error: WireError } };

type Request =
  | { op: 'dirs'; root: string; prefix: string | undefined; dirs: string[]; known?: Array<KnownDigests | undefined>; list?: boolean }
  | { op: 'hash'; files: string[] }
  | { op: 'link'; root: string; objectsDir: string; maxLinks: number; jobs: LinkJob[] }
  | { op: 'chmodDirs'; root: string; dirs: Array<[string, number]> };

interface WireError {
  message: string;
  layer: boolean;
  code?: string;
  errno?: number;
  syscall?: string;
  path?: string;
  dest?: string;
  cause?: WireError;
}

type Reply = { id: number; ok: unknown } | { id: number; error: WireError };

const S_IFMT = 0o170000;
const S_IFREG = 0o100000;
const S_IFDIR = 0o040000;
const S_IFLNK = 0o120000;

/** What makeReadOnly makes of a mode: write bits off, and set-id bits off files. Self-contained (runs in the workers too). */
function finalMode(mode: number): number {
  const type = mode & 0o170000;
  const perm = mode & 0o7777;
  return type === 0o100000 ? perm & ~0o6222 : type === 0o040000 ? perm & ~0o222 : perm;
}

/** fsTree.walkTree's order (bytes of the UTF-8 names). UTF-16 order is the same unless a name has a surrogate pair. Self-contained. */
function sortNames(names: string[]): string[] {
  if (!names.some((n) => /[\uD800-\uDFFF]/.test(n))) return names.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
  return names
    .map((n) => [Buffer.from(n), n] as const)
    .sort((a, b) => Buffer.compare(a[0], b[0]))
    .map(([, n]) => n);
}

/** What WORKER_SOURCE hands to workerMain (parameters, not module bindings: a bundler's transform may rename imports inside the function). */
interface WorkerHelpers {
  fs: typeof import('node:fs');
  path: typeof import('node:path');
  crypto: typeof import('node:crypto');
  parentPort: import('node:worker_threads').MessagePort;
  findPrefix: typeof findPrefix;
  isPyc: typeof isPyc;
  finalMode: typeof finalMode;
  sortNames: typeof sortNames;
}

function workerMain({ fs, path, crypto, parentPort, findPrefix, isPyc, finalMode, sortNames }: WorkerHelpers): void {
  let buf = Buffer.allocUnsafe(1 << 20);

  class WorkerLayerError extends Error {}
  const codeOf = (err: unknown): string | undefined => (err as { code?: string } | null)?.code;
  const wire = (err: unknown): WireError => {
    const e = err as NodeJS.ErrnoException & { dest?: string };
    const out: WireError = { message: String(e?.message ?? err), layer: err instanceof WorkerLayerError };
    for (const k of ['code', 'errno', 'syscall', 'path', 'dest'] as const) if (e?.[k] !== undefined) (out as unknown as Record<string, unknown>)[k] = e[k];
    if (e?.cause !== undefined) out.cause = wire(e.cause);
    return out;
  };

  /** The whole file in `buf` (grown as needed): what readFile gives, without a new buffer per file. */
  const readWhole = (fd: number): Buffer => {
    let n = 0;
    for (;;) {
      if (n === buf.length) {
        const bigger = Buffer.allocUnsafe(buf.length * 2);
        buf.copy(bigger, 0, 0, n);
        buf = bigger;
      }
      const got = fs.readSync(fd, buf, n, buf.length - n, null);
      if (got === 0) return buf.subarray(0, n);
      n += got;
    }
  };

  /** A file's content sha256 and, when `needle` is given, the kind of prefix match in it. Its mode is set first. */
  const readFile = (abs: string, mode: number, needle: Buffer | undefined): [string, PrefixFileKind | ''] => {
    const want = finalMode(mode);
    if (want !== (mode & 0o7777)) fs.chmodSync(abs, want);
    const fd = fs.openSync(abs, 'r');
    try {
      const h = crypto.createHash('sha256');
      if (needle) {
        const content = readWhole(fd);
        h.update(content);
        const found = findPrefix(content, needle, 0) !== -1 ? (content.includes(0) ? 'binary' : 'text') : '';
        // Do not keep a big file's worth of memory until the next one.
        if (buf.length > 16 << 20) buf = Buffer.allocUnsafe(1 << 20);
        return [h.digest('hex'), found];
      }
      for (;;) {
        const got = fs.readSync(fd, buf, 0, buf.length, null);
        if (got === 0) break;
        h.update(buf.subarray(0, got));
      }
      return [h.digest('hex'), ''];
    } finally {
      fs.closeSync(fd);
    }
  };

  // A directory's entries in walk order, each lstat'ed, each file given its
  // final mode and read once (content hash, prefix scan), each symlink read.
  // scanForPrefix's rules: symlinks are always scanned, .pyc files never.
  // A directory's entries in walk order, each lstat'ed, each file given its
  // final mode and read once (content hash, prefix scan), each symlink read.
  // scanForPrefix's rules: symlinks are always scanned, .pyc files never.
  // Failures are returned, not thrown, so that the caller reports the first
  // in walk order, whichever worker met it first (see finishTree).
  // With `list` (verify): nothing is changed and files are not read (their
  // content is hashed afterwards, once per inode: see treeListingInWorkers).
  const dirs = (root: string, prefix: string | undefined, rels: string[], known?: Array<KnownDigests | undefined>, list?: boolean): DirResult[] => {
    const needle = prefix === undefined ? undefined : Buffer.from(prefix);
    return rels.map((rel, k): DirResult => {
      const hashed = known?.[k];
      const dir = rel === '' ? root : path.join(root, rel);
      let listed: Array<[string, import('node:fs').BigIntStats]>;
      try {
        listed = sortNames(fs.readdirSync(dir)).map((name) => [name, fs.lstatSync(path.join(dir, name), { bigint: true })]);
      } catch (err) {
        return { error: wire(err) };
      }
      return listed.map(([name, st]): Row => {
        const abs = path.join(dir, name);
        const mode = Number(st.mode);
        let content = '';
        let found: PrefixFileKind | '' = '';
        let error: WireError | undefined;
        try {
          const pyc = isPyc(name);
          const was = hashed && Object.hasOwn(hashed, name) ? hashed[name] : undefined;
          if ((mode & 0o170000) === 0o100000 && list) {
            // listed only
          } else if ((mode & 0o170000) === 0o100000 && was && was[1] === Number(st.size) && (!needle || pyc)) {
            // Hashed as tar wrote it: only the mode to set.
            const want = finalMode(mode);
            if (want !== (mode & 0o7777)) fs.chmodSync(abs, want);
            content = was[0];
          } else if ((mode & 0o170000) === 0o100000) {
            [content, found] = readFile(abs, mode, pyc ? undefined : needle);
          } else if ((mode & 0o170000) === 0o120000) {
            content = fs.readlinkSync(abs);
            if (needle && findPrefix(fs.readlinkSync(abs, { encoding: 'buffer' }), needle, 0) !== -1) found = 'symlink';
          }
        } catch (err) {
          error = wire(err);
        }
        const row: Row = [name, mode, Number(st.size), st.mtimeNs.toString(), Number(st.uid), Number(st.gid), st.ino.toString(), st.dev.toString(), content, found];
        if (error) row.push(error);
        return row;
      });
    });
  };

  // dedup.ts's dedupTree, one file at a time in the given order, with sync
  // calls: the same link/rename protocol, errors and counts.
  const link = (root: string, objectsDir: string, maxLinks: number, jobs: LinkJob[]): LinkResult => {
    const result: LinkResult = { files: 0, linked: 0, savedBytes: 0 };
    let at = -1;
    try {
      linkAll(root, objectsDir, BigInt(maxLinks), jobs, result, (i) => (at = i));
    } catch (err) {
      result.failed = { at, error: wire(err) };
    }
    return result;
  };
  const linkAll = (root: string, objectsDir: string, maxLinks: bigint, jobs: LinkJob[], result: DedupResult, onFile: (index: number) => void): void => {
    const seenInodes = new Set<string>();
    const madeDirs = new Set<string>();
    for (const [rel, key, inoS, devS, size, index] of jobs) {
      onFile(index);
      const abs = path.join(root, rel);
      const ino = BigInt(inoS);
      const dev = BigInt(devS);
      result.files++;
      const obj = path.join(objectsDir, key.slice(0, 2), key.slice(2));
      if (!madeDirs.has(path.dirname(obj))) {
        fs.mkdirSync(path.dirname(obj), { recursive: true });
        madeDirs.add(path.dirname(obj));
      }
      for (let attempt = 0; ; attempt++) {
        try {
          fs.linkSync(abs, obj);
          seenInodes.add(inoS);
          break;
        } catch (err) {
          const code = codeOf(err);
          if (code === 'EXDEV') throw new WorkerLayerError(`dedup ${abs}: object store ${objectsDir} is on another filesystem`);
          if (code === 'EMLINK') break;
          if (code !== 'EEXIST') throw new WorkerLayerError(`dedup ${abs}: cannot link into ${obj}: ${(err as Error).message}`, { cause: err });
        }
        let ost;
        try {
          ost = fs.lstatSync(obj, { bigint: true });
        } catch (err) {
          if (codeOf(err) === 'ENOENT' && attempt < 3) continue; // gc removed it meanwhile: retry
          throw err;
        }
        if (ost.ino === ino && ost.dev === dev) break; // already the object
        if (ost.size !== BigInt(size)) throw new WorkerLayerError(`dedup ${abs}: object ${obj} has a different size (corrupt object store?)`);
        if (ost.nlink >= maxLinks) break;
        const tmp = path.join(path.dirname(abs), `.dedup-${process.pid}-${path.basename(abs)}`);
        try {
          fs.linkSync(obj, tmp);
        } catch (err) {
          const code = codeOf(err);
          if (code === 'ENOENT' && attempt < 3) continue;
          if (code === 'EMLINK') break;
          throw new WorkerLayerError(`dedup ${abs}: cannot link object ${obj}: ${(err as Error).message}`, { cause: err });
        }
        fs.renameSync(tmp, abs);
        result.linked++;
        if (!seenInodes.has(inoS)) result.savedBytes += size;
        seenInodes.add(inoS);
        break;
      }
    }
  };

  /** Content sha256 of each file, or why it could not be read. */
  const hashFiles = (files: string[]): Array<string | { error: WireError }> =>
    files.map((abs) => {
      try {
        const fd = fs.openSync(abs, 'r');
        try {
          const h = crypto.createHash('sha256');
          for (;;) {
            const got = fs.readSync(fd, buf, 0, buf.length, null);
            if (got === 0) break;
            h.update(buf.subarray(0, got));
          }
          return h.digest('hex');
        } finally {
          fs.closeSync(fd);
        }
      } catch (err) {
        return { error: wire(err) };
      }
    });

  const chmodDirs = (root: string, dirs: Array<[string, number]>): void => {
    for (const [rel, mode] of dirs) fs.chmodSync(path.join(root, rel), mode);
    const st = fs.lstatSync(root);
    fs.chmodSync(root, st.mode & 0o7777 & ~0o222);
  };

  parentPort.on('message', (msg: Request & { id: number }) => {
    let reply: Reply;
    try {
      const ok =
        msg.op === 'dirs' ? dirs(msg.root, msg.prefix, msg.dirs, msg.known, msg.list)
        : msg.op === 'hash' ? hashFiles(msg.files)
        : msg.op === 'link' ? link(msg.root, msg.objectsDir, msg.maxLinks, msg.jobs)
        : chmodDirs(msg.root, msg.dirs);
      reply = { id: msg.id, ok };
    } catch (err) {
      reply = { id: msg.id, error: wire(err) };
    }
    parentPort.postMessage(reply);
  });
}

// relocate.ts's own matcher and .pyc rule, so the scan finds exactly what
// scanForPrefix finds, and the functions the main thread uses for modes and order.
const WORKER_SOURCE = `import fs from 'node:fs';
import path from 'node:path';
import crypto from 'node:crypto';
import { parentPort } from 'node:worker_threads';
const PATH_CHAR = ${PATH_CHAR.toString()};
${findPrefix.toString()}
${isPyc.toString()}
${finalMode.toString()}
${sortNames.toString()}
(${workerMain.toString()})({ fs, path, crypto, parentPort, findPrefix, isPyc, finalMode, sortNames });
`;

// ---------------------------------------------------------------------------
// The pool: started on first use and kept while busy; idle workers do not
// keep the process alive and are stopped after IDLE_MS.

const IDLE_MS = 10_000;

/** Workers: one per core, 2 at least, at most 4. */
function finishWorkers(): number {
  return Math.max(2, Math.min(4, os.availableParallelism()));
}

class PoolWorker {
  private readonly worker: Worker;
  private readonly pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
  private nextId = 0;
  dead = false;

  constructor(private readonly onIdle: () => void) {
    // A data: URL is always an ES module, whatever --input-type the process was started with (eval: true would follow it).
    this.worker = new Worker(new URL(`data:text/javascript,${encodeURIComponent(WORKER_SOURCE)}`), { name: 'minisandbox-finish' });
    this.worker.on('message', (r: Reply) => {
      const p = this.pending.get(r.id);
      if (!p) return;
      this.pending.delete(r.id);
      if (this.pending.size === 0) {
        this.worker.unref();
        this.onIdle();
      }
      if ('error' in r) p.reject(unwire(r.error));
      else p.resolve(r.ok);
    });
    const fail = (err: unknown): void => {
      this.dead = true;
      for (const p of this.pending.values()) p.reject(new LayerError(`layer finishing worker failed: ${(err as Error)?.message ?? err}`, { cause: err }));
      this.pending.clear();
    };
    this.worker.on('error', fail);
    this.worker.on('exit', (code) => fail(new Error(`exited with code ${code}`)));
    // Unreferenced once its listeners are on: adding a 'message' listener
    // references the worker's port again, and a worker never called would
    // then keep the process alive until the idle timeout.
    this.worker.unref();
  }

  call<T>(req: Request): Promise<T> {
    if (this.dead) return Promise.reject(new LayerError('layer finishing worker failed: it has exited'));
    const id = this.nextId++;
    // Referenced while it has work: a caller awaiting it keeps the process alive.
    if (this.pending.size === 0) this.worker.ref();
    return new Promise<T>((resolve, reject) => {
      this.pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      this.worker.postMessage({ ...req, id });
    });
  }

  get busy(): boolean {
    return this.pending.size > 0;
  }

  terminate(): void {
    this.dead = true;
    void this.worker.terminate();
  }
}

let pool: PoolWorker[] = [];
let idleTimer: NodeJS.Timeout | undefined;

function workers(): PoolWorker[] {
  if (idleTimer) clearTimeout(idleTimer);
  idleTimer = undefined;
  pool = pool.filter((w) => !w.dead);
  while (pool.length < finishWorkers()) pool.push(new PoolWorker(onIdle));
  return pool;
}

function onIdle(): void {
  if (pool.some((w) => w.busy)) return;
  if (idleTimer) clearTimeout(idleTimer);
  idleTimer = setTimeout(() => {
    if (pool.some((w) => w.busy)) return;
    for (const w of pool) w.terminate();
    pool = [];
  }, IDLE_MS);
  idleTimer.unref();
}

/** For tests and benchmarks: stop the pool now (it stops by itself after IDLE_MS idle). */
export function stopFinishWorkers(): void {
  if (idleTimer) clearTimeout(idleTimer);
  idleTimer = undefined;
  for (const w of pool) w.terminate();
  pool = [];
}

/** A worker's error as the caller's thread would have seen it: a LayerError, or a Node system error with its code, errno, syscall, path. */
function unwire(w: WireError): Error {
  const cause = w.cause ? unwire(w.cause) : undefined;
  if (w.layer) return new LayerError(w.message, cause ? { cause } : {});
  const err = new Error(w.message, cause ? { cause } : undefined) as NodeJS.ErrnoException & { dest?: string };
  for (const k of ['code', 'errno', 'syscall', 'path', 'dest'] as const) if (w[k] !== undefined) (err as unknown as Record<string, unknown>)[k] = w[k];
  return err;
}

// ---------------------------------------------------------------------------

/** At most this many directories per message; fewer while the queue is short, so every worker has some. */
const DIRS_PER_JOB = 16;


/**
 * The tree's entries in walk order (fsTree.walkTree's: a directory's entries
 * in name order, each directory followed by its contents), each directory
 * read by whichever worker is free. Throws the first failure in walk order.
 */
async function walkInWorkers(
  ws: PoolWorker[],
  tree: string,
  how: { prefix?: string | undefined; knownByDir?: Map<string, KnownDigests>; list?: boolean },
): Promise<Array<{ rel: string; row: Row }>> {
  // Directories are read by whichever worker is free (two messages in
  // flight each, so none waits on the main thread); each result queues the
  // subdirectories it found. The order of the walk is rebuilt afterwards.
  const rows = new Map<string, DirResult>();
  const queue: string[] = [''];
  let inFlight = 0;
  let failed = false;
  const waiters: Array<() => void> = [];
  const wake = (): void => {
    for (const w of waiters.splice(0)) w();
  };
  const loop = async (w: PoolWorker): Promise<void> => {
    for (;;) {
      if (failed) return;
      if (queue.length === 0) {
        if (inFlight === 0) return;
        await new Promise<void>((r) => waiters.push(r));
        continue;
      }
      const take = Math.max(1, Math.min(DIRS_PER_JOB, Math.floor(queue.length / (2 * ws.length))));
      const dirs = queue.splice(queue.length - take, take);
      inFlight++;
      try {
        const known = how.knownByDir && how.knownByDir.size > 0 ? dirs.map((d) => how.knownByDir!.get(d)) : undefined;
        const got = await w.call<DirResult[]>({ op: 'dirs', root: tree, prefix: how.prefix, dirs, ...(known ? { known } : {}), ...(how.list ? { list: true } : {}) });
        dirs.forEach((rel, k) => {
          const list = got[k]!;
          rows.set(rel, list);
          if (Array.isArray(list)) for (const r of list) if ((r[1] & S_IFMT) === S_IFDIR) queue.push(rel === '' ? r[0] : `${rel}/${r[0]}`);
        });
      } catch (err) {
        failed = true; // the worker itself failed: stop
        throw err;
      } finally {
        inFlight--;
        wake();
      }
    }
  };
  await Promise.all(ws.flatMap((w) => [loop(w), loop(w)]));

  // The walk's order: a directory's entries in name order, each directory
  // followed by its contents. A failure is reported as the reference path
  // would meet it: the first directory that could not be listed in walk
  // order, else the first entry that could not be read.
  const entries: Array<{ rel: string; row: Row }> = [];
  const visit = (rel: string): void => {
    const list = rows.get(rel)!;
    if (!Array.isArray(list)) throw unwire(list.error);
    for (const row of list) {
      const child = rel === '' ? row[0] : `${rel}/${row[0]}`;
      entries.push({ rel: child, row });
      if ((row[1] & S_IFMT) === S_IFDIR) visit(child);
    }
  };
  visit('');
  return entries;
}

export async function finishTree(tree: string, opts: FinishOptions): Promise<FinishResult> {
  const ws = workers();
  const rootSt = await fsp.lstat(tree, { bigint: true });
  // Known digests by directory, sent with the directories they are in.
  const knownByDir = new Map<string, KnownDigests>();
  for (const [rel, d] of opts.known ?? []) {
    const slash = rel.lastIndexOf('/');
    const dir = slash === -1 ? '' : rel.slice(0, slash);
    let m = knownByDir.get(dir);
    if (!m) knownByDir.set(dir, (m = Object.create(null) as KnownDigests));
    m[rel.slice(slash + 1)] = [d.sha256, d.size];
  }

  const entries = await walkInWorkers(ws, tree, { prefix: opts.prefix, knownByDir });
  const unread = entries.find((e) => e.row[10] !== undefined);
  if (unread) throw unwire(unread.row[10]!);

  let dedup: DedupResult | undefined;
  if (opts.dedup) {
    const minSize = opts.dedup.minSize ?? 1;
    const shards: LinkJob[][] = ws.map(() => []);
    for (const [index, { rel, row }] of entries.entries()) {
      const [, mode, size, mtimeNs, uid, gid, ino, dev, sha] = row;
      if ((mode & S_IFMT) !== S_IFREG || size < minSize) continue;
      const key = `${sha}-m${finalMode(mode).toString(8)}-u${uid}-g${gid}-t${mtimeNs}`;
      shards[parseInt(sha.slice(0, 4), 16) % ws.length]!.push([rel, key, ino, dev, size, index]);
    }
    const parts = await Promise.all(
      ws.map((w, s) => w.call<LinkResult>({ op: 'link', root: tree, objectsDir: opts.objectsDir, maxLinks: opts.dedup?.maxLinks ?? 60000, jobs: shards[s]! })),
    );
    // The file an ordered pass would have failed on: each shard stopped at
    // its first failure, and the files before it fared as in that pass.
    const first = parts.flatMap((p) => (p.failed ? [p.failed] : [])).sort((a, b) => a.at - b.at)[0];
    if (first) throw unwire(first.error);
    dedup = { files: 0, linked: 0, savedBytes: 0 };
    for (const p of parts) {
      dedup.files += p.files;
      dedup.linked += p.linked;
      dedup.savedBytes += p.savedBytes;
    }
  }
  await ws[0]!.call({ op: 'chmodDirs', root: tree, dirs: entries.flatMap(({ rel, row }): Array<[string, number]> => ((row[1] & S_IFMT) === S_IFDIR ? [[rel, finalMode(row[1])]] : [])) });

  const counts: TreeCounts = { entries: entries.length, files: 0, bytes: 0 };
  const prefixFiles: PrefixFile[] = [];
  const lines: string[] = [`${JSON.stringify(['.', 'd', finalMode(Number(rootSt.mode)).toString(8)] satisfies ListingEntry)}\n`];
  for (const { rel, row } of entries) {
    const [, mode, size, mtimeNs, , , , , content, found] = row;
    const type = mode & S_IFMT;
    let entry: ListingEntry;
    if (type === S_IFDIR) entry = [rel, 'd', finalMode(mode).toString(8)];
    else if (type === S_IFLNK) entry = [rel, 'l', content];
    else if (type !== S_IFREG) entry = [rel, 'o', mode.toString(8)];
    else {
      counts.files++;
      counts.bytes += size;
      entry = [rel, 'f', finalMode(mode).toString(8), size, mtimeNs, content];
    }
    lines.push(`${JSON.stringify(entry)}\n`);
    if (found) prefixFiles.push({ path: rel, kind: found });
  }
  return { ...(opts.prefix !== undefined ? { prefixFiles } : {}), ...(dedup ? { dedup } : {}), counts, listing: lines.join('') };
}

/** Files per hash message: enough to keep a worker busy, few enough that every worker gets some. */
const FILES_PER_HASH_JOB = 32;

/**
 * verify.ts's treeListing (the same entries and text), made in the finishing
 * workers: the tree is walked by all of them, then each inode not in `cache`
 * is hashed once, by whichever worker is free, with blocking reads in a
 * 1 MiB buffer. Nothing in the tree is changed. `cache` (by `dev:ino`)
 * carries hashes across layers, so a file dedup shares is read once per
 * verify. The first entry that cannot be read, in walk order, is thrown.
 */
export async function treeListingInWorkers(tree: string, opts: { cache?: HashCache } = {}): Promise<ListingResult> {
  const ws = workers();
  const rootSt = await fsp.lstat(tree, { bigint: true });
  const entries = await walkInWorkers(ws, tree, { list: true });
  const unread = entries.find((e) => e.row[10] !== undefined);
  if (unread) throw unwire(unread.row[10]!);

  const cache = opts.cache ?? new Map<string, string>();
  // Each inode once: the first name of it in walk order is read.
  const todo = new Map<string, { abs: string; size: number; index: number }>();
  entries.forEach(({ rel, row }, index) => {
    if ((row[1] & S_IFMT) !== S_IFREG) return;
    const inode = `${row[7]}:${row[6]}`;
    if (!cache.has(inode) && !todo.has(inode)) todo.set(inode, { abs: `${tree}/${rel}`, size: row[2], index });
  });
  // Largest first, so one big file does not finish last on one worker.
  const jobs = [...todo].sort((a, b) => b[1].size - a[1].size);
  let next = 0;
  let failed: { index: number; error: WireError } | undefined;
  const loop = async (w: PoolWorker): Promise<void> => {
    while (next < jobs.length) {
      const batch = jobs.slice(next, next + FILES_PER_HASH_JOB);
      next += batch.length;
      const got = await w.call<Array<string | { error: WireError }>>({ op: 'hash', files: batch.map(([, f]) => f.abs) });
      batch.forEach(([inode, f], k) => {
        const r = got[k]!;
        if (typeof r === 'string') cache.set(inode, r);
        else if (!failed || f.index < failed.index) failed = { index: f.index, error: r.error };
      });
    }
  };
  await Promise.all(ws.flatMap((w) => [loop(w), loop(w)]));
  if (failed) throw unwire(failed.error);

  const out: ListingEntry[] = [['.', 'd', (Number(rootSt.mode) & 0o7777).toString(8)]];
  for (const { rel, row } of entries) {
    const [, mode, size, mtimeNs, , , ino, dev, content] = row;
    const type = mode & S_IFMT;
    if (type === S_IFDIR) out.push([rel, 'd', (mode & 0o7777).toString(8)]);
    else if (type === S_IFLNK) out.push([rel, 'l', content]);
    else if (type !== S_IFREG) out.push([rel, 'o', mode.toString(8)]);
    else out.push([rel, 'f', (mode & 0o7777).toString(8), size, mtimeNs, cache.get(`${dev}:${ino}`)!]);
  }
  return listingText(out);
}
