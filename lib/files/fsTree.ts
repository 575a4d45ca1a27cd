import { promises as fsp, type BigIntStats } from 'node:fs';
import path from 'node:path';
import { codeOf } from '../errors.js';
import { FileError } from './errors.js';
import { mapLimit } from './limit.js';

export interface TreeEntry {
  /** Path relative to the walked root, '/'-separated. */
  rel: string;
  abs: string;
  st: BigIntStats;
}

export interface WalkOptions {
  /**
   * A directory below the root this user may not list (an image layer's
   * directory only its owner may read) is reported here and skipped,
   * instead of failing the walk.
   */
  onUnreadable?: (rel: string) => void;
}

/**
 * Depth-first walk that never follows symlinks (lstat only), entries in
 * byte-sorted order so listings are reproducible. Directories are yielded
 * before their contents.
 */
export async function* walkTree(root: string, rel = '', opts: WalkOptions = {}): AsyncGenerator<TreeEntry> {
  const dir = rel === '' ? root : path.join(root, rel);
  let names: string[];
  try {
    names = await fsp.readdir(dir);
  } catch (err) {
    if (!opts.onUnreadable || rel === '' || codeOf(err) !== 'EACCES') throw err;
    opts.onUnreadable(rel);
    return;
  }
  names.sort((a, b) => (Buffer.compare(Buffer.from(a), Buffer.from(b))));
  // lstat a directory's entries concurrently (the thread pool overlaps the
  // syscalls), then yield them in order.
  const entries = await mapLimit(names, 32, async (name) => {
    const childRel = rel === '' ? name : `${rel}/${name}`;
    const abs = path.join(root, childRel);
    return { rel: childRel, abs, st: await fsp.lstat(abs, { bigint: true }) };
  });
  for (const e of entries) {
    yield e;
    if (e.st.isDirectory()) yield* walkTree(root, e.rel, opts);
  }
}

/**
 * Remove write bits (and setuid/setgid on files, which have no business in a
 * shared layer) from every file, or from every directory, under root.
 * chmod follows symlinks, so symlinks are skipped: a layer's symlink may
 * point anywhere (e.g. /usr/bin/python3) and must never cause a chmod there.
 */
export async function makeReadOnly(root: string, which: 'files' | 'dirs' | 'all'): Promise<TreeCounts> {
  const counts: TreeCounts = { entries: 0, files: 0, bytes: 0 };
  const chmods: Array<[string, number]> = [];
  for await (const e of walkTree(root)) {
    counts.entries++;
    const mode = Number(e.st.mode) & 0o7777;
    if (e.st.isFile()) {
      counts.files++;
      counts.bytes += Number(e.st.size);
      const want = mode & ~0o6222;
      if (which !== 'dirs' && want !== mode) chmods.push([e.abs, want]);
    } else if (e.st.isDirectory() && which !== 'files') {
      // Only after the walk: a read-only dir would still be listable, but
      // keep the walk independent of our own changes.
      chmods.push([e.abs, mode & ~0o222]);
    }
  }
  await mapLimit(chmods, 32, ([p, m]) => fsp.chmod(p, m));
  if (which !== 'files') {
    const st = await fsp.lstat(root);
    await fsp.chmod(root, st.mode & 0o7777 & ~0o222);
  }
  return counts;
}

export interface TreeCounts {
  entries: number;
  /** Regular files. */
  files: number;
  /** Apparent bytes of regular files. */
  bytes: number;
}

/**
 * Delete a tree we own (a layer, a staging dir, a sandbox's private
 * directory). Read-only or mode-000 directories (layers, overlay's work
 * dir) are made writable first; lstat-based, it never follows a symlink out
 * of the tree (fs.rm unlinks symlinks without following them), and it
 * refuses to enter another filesystem, so a mount point inside is never
 * emptied.
 */
export async function removeTree(target: string): Promise<void> {
  let st;
  try {
    st = await fsp.lstat(target);
  } catch (err) {
    if (codeOf(err) === 'ENOENT') return;
    throw err;
  }
  if (st.isDirectory()) await makeDirsWritable(target, st.dev);
  await fsp.rm(target, { recursive: true, force: true });
}

async function makeDirsWritable(dir: string, dev: number): Promise<void> {
  const st = await fsp.lstat(dir);
  if (!st.isDirectory()) return;
  if (st.dev !== dev) throw new FileError(`refusing to delete ${dir}: it is on another filesystem`);
  if ((st.mode & 0o700) !== 0o700) await fsp.chmod(dir, (st.mode & 0o7777) | 0o700);
  for (const name of await fsp.readdir(dir)) await makeDirsWritable(path.join(dir, name), dev);
}
