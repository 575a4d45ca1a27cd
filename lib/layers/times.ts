/**
 * Fixed timestamps in a layer, as reproducible builds set them
 * (SOURCE_DATE_EPOCH): every file, directory and symlink of the tree gets
 * the same mtime and atime, LAYER_EPOCH.
 *
 * Why: the store's dedup merges two files only when their mtimes are equal
 * too (a hard link shares the inode, mtime included, and .pyc files check
 * their source's mtime: see dedup.ts). Every pip install and every checkout
 * writes the time it ran, so two venvs holding the same packages, or one
 * repository at two commits, shared almost nothing. With one time for all,
 * identical bytes are stored once, and a directory layer's digest (which
 * covers mtimes) is the same for the same content built twice.
 *
 * Byte-compiled files: a timestamp-based .pyc holds its source's mtime and
 * is ignored (and recompiled on every import, since the layer is read-only)
 * once that mtime changes. So the mtime field of every timestamp-based .pyc
 * of the tree is set to LAYER_EPOCH as well, which is what the source's
 * mtime becomes: the source size field, also checked, is untouched because
 * the source is. Hash-based .pyc files (PEP 552) do not depend on times and
 * are left as they are.
 */
import { promises as fsp } from 'node:fs';
import { codeOf } from '../errors.js';
import { walkTree } from '../files/fsTree.js';
import { mapLimit } from '../files/limit.js';
import { LayerError } from './errors.js';
import { isPyc } from './relocate.js';

/** 2000-01-01T00:00:00Z: after 1980 (zip's earliest date, which wheels and zipimport use), before any real build. */
export const LAYER_EPOCH = 946_684_800;

export interface NormalizeResult {
  entries: number;
  /** Timestamp-based .pyc files whose recorded source mtime was set. */
  pycRewritten: number;
}

/**
 * Where a .pyc records its source's mtime, from its magic number: Python
 * 3.7+ (magic >= 3390) has a flags word first and records a time only when
 * the flags are 0; 3.0-3.6 and 2.7 record it right after the magic.
 * undefined: not a .pyc we know, or a hash-based one.
 */
function pycMtimeOffset(head: Buffer): number | undefined {
  if (head.length < 8 || head[2] !== 0x0d || head[3] !== 0x0a) return undefined;
  const magic = head.readUInt16LE(0);
  if (magic >= 3390 && magic < 20000) return head.length >= 16 && head.readUInt32LE(4) === 0 ? 8 : undefined;
  if ((magic >= 3000 && magic < 3390) || magic === 62211) return 4;
  return undefined;
}

async function rewritePyc(file: string, time: number): Promise<boolean> {
  let fh;
  try {
    fh = await fsp.open(file, 'r+');
  } catch (err) {
    if (codeOf(err) !== 'EACCES') throw err;
    // A read-only .pyc of the caller's own (an install that set 0444): writable for the rewrite only.
    const { mode } = await fsp.stat(file);
    await fsp.chmod(file, mode | 0o200);
    try {
      return await rewritePyc(file, time);
    } finally {
      await fsp.chmod(file, mode & 0o7777);
    }
  }
  try {
    const head = Buffer.alloc(16);
    const { bytesRead } = await fh.read(head, 0, 16, 0);
    const at = pycMtimeOffset(head.subarray(0, bytesRead));
    if (at === undefined) return false;
    const field = Buffer.alloc(4);
    field.writeUInt32LE(time >>> 0); // the low 32 bits, as Python compares them
    await fh.write(field, 0, 4, at);
    return true;
  } finally {
    await fh.close();
  }
}

/**
 * Set every entry of `tree` (not following symlinks) to `time` (seconds),
 * after pointing timestamp-based .pyc files at it. The tree must still be
 * writable: run before the store makes it read-only.
 */
export async function normalizeTimes(tree: string, time: number = LAYER_EPOCH): Promise<NormalizeResult> {
  const entries: string[] = [];
  const pycs: string[] = [];
  try {
    for await (const e of walkTree(tree)) {
      entries.push(e.abs);
      if (e.st.isFile() && isPyc(e.rel) && e.st.size >= 8n) pycs.push(e.abs);
    }
    const rewritten = await mapLimit(pycs, 16, (p) => rewritePyc(p, time));
    // Rewriting a file's content changes its mtime: times go last. Setting a
    // child's times does not touch its directory's, so the order among
    // entries does not matter.
    await mapLimit(entries, 32, (p) => fsp.lutimes(p, time, time));
    await fsp.lutimes(tree, time, time);
    return { entries: entries.length, pycRewritten: rewritten.filter(Boolean).length };
  } catch (err) {
    throw new LayerError(`normalising times in ${tree}: ${(err as Error).message}`, { cause: err });
  }
}
