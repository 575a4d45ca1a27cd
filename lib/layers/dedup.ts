import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { codeOf } from '../errors.js';
import { walkTree, type TreeEntry } from '../files/fsTree.js';
import { hashFile } from '../files/hash.js';
import { mapLimit } from '../files/limit.js';
import { LayerError } from './errors.js';

/**
 * File-level deduplication across layers: a content-addressed object store
 * (`objects/ab/cdef…`) hard-linked into the layer trees.
 *
 * Safe because layer trees are read-only and sandboxes write only through
 * their own overlay upper layer. A write to a file of the merged view copies
 * it up first, so the shared inode is never written.
 *
 * What is merged. A hard link shares the inode, and so its mode, owner and
 * mtime as well as its content. Two files are merged only if all of these are
 * equal. The object key is sha256(content) plus mode, uid, gid and mtime in ns.
 * mtime is part of the key on purpose: .pyc files record their source's mtime,
 * so giving a .py another layer's mtime would make Python treat every .pyc as
 * stale and recompile on each import (it cannot write the read-only layer).
 * The cost is that two builds of the same package at different times do not
 * share files. Callers should run this after the final modes are set (write
 * bits cleared) so the key describes the file as it will stay.
 *
 * Limits: ext4 caps an inode at 65000 links. On EMLINK, or once an object
 * nears `maxLinks`, the file is simply left as its own copy. Objects must be on
 * the same filesystem as the layers: store layout guarantees it, and EXDEV is
 * reported as an error.
 */
export interface DedupOptions {
  /** Files smaller than this are left alone (default 1: skip empty files). */
  minSize?: number;
  /** Stop linking to an object with this many links (default 60000, under ext4's 65000). */
  maxLinks?: number;
}

export interface DedupResult {
  files: number;
  /** Files now sharing an inode with an object that existed before. */
  linked: number;
  /** Bytes (apparent) no longer stored twice. */
  savedBytes: number;
}

function objectPathFor(objectsDir: string, key: string): string {
  return path.join(objectsDir, key.slice(0, 2), key.slice(2));
}

/** `hashes`, if given, receives each hashed file's content sha256 by relative path (the store's listing reuses them). */
export async function dedupTree(tree: string, objectsDir: string, opts: DedupOptions = {}, hashes?: Map<string, string>): Promise<DedupResult> {
  const minSize = BigInt(opts.minSize ?? 1);
  const maxLinks = BigInt(opts.maxLinks ?? 60000);
  const result: DedupResult = { files: 0, linked: 0, savedBytes: 0 };
  const seenInodes = new Set<bigint>();
  const madeDirs = new Set<string>();
  const files: TreeEntry[] = [];
  for await (const e of walkTree(tree)) if (e.st.isFile() && e.st.size >= minSize) files.push(e);
  // Hash concurrently (I/O and hashing overlap in the thread pool); link in
  // order afterwards so results do not depend on timing.
  const keys = await mapLimit(files, 16, async (e) => {
    const mode = Number(e.st.mode) & 0o7777;
    const sha = await hashFile(e.abs, Number(e.st.size));
    hashes?.set(e.rel, sha);
    return `${sha}-m${mode.toString(8)}-u${e.st.uid}-g${e.st.gid}-t${e.st.mtimeNs}`;
  });
  for (const [i, e] of files.entries()) {
    result.files++;
    // Names hard-linked to each other inside the tree are each swapped for
    // the object; seenInodes makes their bytes count as saved only once.
    const obj = objectPathFor(objectsDir, keys[i]!);
    if (!madeDirs.has(path.dirname(obj))) {
      await fsp.mkdir(path.dirname(obj), { recursive: true });
      madeDirs.add(path.dirname(obj));
    }
    for (let attempt = 0; ; attempt++) {
      // First try to make this file the object (cheap: one link, no rename).
      try {
        await fsp.link(e.abs, obj);
        seenInodes.add(e.st.ino);
        break;
      } catch (err) {
        const code = codeOf(err);
        if (code === 'EXDEV') throw new LayerError(`dedup ${e.abs}: object store ${objectsDir} is on another filesystem`);
        if (code === 'EMLINK') break;
        if (code !== 'EEXIST') throw new LayerError(`dedup ${e.abs}: cannot link into ${obj}: ${(err as Error).message}`, { cause: err });
      }
      let ost;
      try {
        ost = await fsp.lstat(obj, { bigint: true });
      } catch (err) {
        if (codeOf(err) === 'ENOENT' && attempt < 3) continue; // gc removed it meanwhile: retry
        throw err;
      }
      if (ost.ino === e.st.ino && ost.dev === e.st.dev) break; // already the object
      if (ost.size !== e.st.size) throw new LayerError(`dedup ${e.abs}: object ${obj} has a different size (corrupt object store?)`);
      if (ost.nlink >= maxLinks) break;
      // Replace the file by a link to the object, atomically: link to a
      // temporary name in the same directory, then rename over the file.
      const tmp = path.join(path.dirname(e.abs), `.dedup-${process.pid}-${path.basename(e.abs)}`);
      try {
        await fsp.link(obj, tmp);
      } catch (err) {
        const code = codeOf(err);
        if (code === 'ENOENT' && attempt < 3) continue;
        if (code === 'EMLINK') break;
        throw new LayerError(`dedup ${e.abs}: cannot link object ${obj}: ${(err as Error).message}`, { cause: err });
      }
      await fsp.rename(tmp, e.abs);
      result.linked++;
      if (!seenInodes.has(e.st.ino)) result.savedBytes += Number(e.st.size);
      seenInodes.add(e.st.ino);
      break;
    }
  }
  return result;
}

/** Delete objects no layer links to any more (link count 1). Returns bytes freed. */
export async function gcObjects(objectsDir: string): Promise<{ removed: number; freedBytes: number }> {
  let removed = 0;
  let freedBytes = 0;
  let subdirs: string[];
  try {
    subdirs = await fsp.readdir(objectsDir);
  } catch (err) {
    if (codeOf(err) === 'ENOENT') return { removed, freedBytes };
    throw err;
  }
  for (const sub of subdirs) {
    if (!/^[0-9a-f]{2}$/.test(sub)) continue;
    const dir = path.join(objectsDir, sub);
    for (const name of await fsp.readdir(dir)) {
      const p = path.join(dir, name);
      const st = await fsp.lstat(p);
      if (st.isFile() && st.nlink === 1) {
        await fsp.unlink(p);
        removed++;
        freedBytes += st.blocks * 512;
      }
    }
  }
  return { removed, freedBytes };
}
