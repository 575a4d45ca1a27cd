import { promises as fsp } from 'node:fs';
import { walkTree } from '../files/fsTree.js';
import { hashFile } from '../files/hash.js';
import { mapLimit } from '../files/limit.js';

/**
 * What a layer's tree was when it was built, so it can be checked later.
 *
 * A layer's digest names its source (the archive's sha256, or a directory's
 * listing), not the tree in the store: the archive is not kept by the store,
 * and the tree differs from a directory source (write and set-id bits
 * cleared, dedup's hard links). So the store records a listing of the final
 * tree next to it (`listing.jsonl`, one JSON array per entry, in walk order)
 * and the listing's sha256 in the manifest (`treeDigest`). `verify` re-hashes
 * the tree and compares it entry by entry, which says *what* differs, not
 * only that something does.
 *
 * An entry is [path, 'f', mode, size, mtime ns, content sha256] for a file,
 * [path, 'd', mode] for a directory (its mtime is left out: it records when
 * dedup last renamed into it, nothing a sandbox sees), [path, 'l', target]
 * for a symlink, [path, 'o', mode] for anything else (never in a layer as
 * built: the archive checker refuses devices and FIFOs). The tree's root is
 * '.'.
 */
export type ListingEntry = [string, 'f', string, number, string, string] | [string, 'd', string] | [string, 'l', string] | [string, 'o', string];

export const LISTING_FILE = 'listing.jsonl';

/** Content sha256 of files already hashed, by `dev:ino`: hard-linked (dedup) files are read once. */
export type HashCache = Map<string, string>;

export interface ListingResult {
  entries: ListingEntry[];
  /** The listing as stored (one JSON array per line). */
  text: string;
  files: number;
  bytes: number;
}

/**
 * The listing of `tree`. `known` gives content hashes already computed by
 * relative path (dedup's, at build time); `cache` shares hashes by inode
 * across calls. Files are hashed 16 at a time, streamed when large.
 */
export async function treeListing(tree: string, opts: { known?: Map<string, string>; cache?: HashCache } = {}): Promise<ListingResult> {
  const root = await fsp.lstat(tree, { bigint: true });
  const walked = [{ rel: '.', abs: tree, st: root }];
  for await (const e of walkTree(tree)) walked.push(e);
  const cache = opts.cache ?? new Map<string, string>();
  let files = 0;
  let bytes = 0;
  const entries = await mapLimit(walked, 16, async (e): Promise<ListingEntry> => {
    const mode = (Number(e.st.mode) & 0o7777).toString(8);
    if (e.st.isDirectory()) return [e.rel, 'd', mode];
    if (e.st.isSymbolicLink()) return [e.rel, 'l', await fsp.readlink(e.abs)];
    if (!e.st.isFile()) return [e.rel, 'o', Number(e.st.mode).toString(8)];
    files++;
    bytes += Number(e.st.size);
    const inode = `${e.st.dev}:${e.st.ino}`;
    let sha = opts.known?.get(e.rel) ?? cache.get(inode);
    if (sha === undefined) {
      sha = await hashFile(e.abs, Number(e.st.size));
      cache.set(inode, sha);
    }
    return [e.rel, 'f', mode, Number(e.st.size), e.st.mtimeNs.toString(), sha];
  });
  return { entries, text: entries.map((e) => `${JSON.stringify(e)}\n`).join(''), files, bytes };
}

/** A listing made elsewhere (entries in walk order), with its text and counts as treeListing gives them. */
export function listingText(entries: ListingEntry[]): ListingResult {
  let files = 0;
  let bytes = 0;
  for (const e of entries) {
    if (e[1] === 'f') {
      files++;
      bytes += e[3];
    }
  }
  return { entries, text: entries.map((e) => `${JSON.stringify(e)}\n`).join(''), files, bytes };
}

/** One difference between a layer as built and as it is now. */
export interface LayerProblem {
  /** Path in the tree ('.' for its root), or the store file at fault (manifest.json, listing.jsonl). */
  path: string;
  /** What differs. */
  what: 'content' | 'size' | 'mode' | 'mtime' | 'type' | 'target' | 'missing' | 'added' | 'manifest' | 'listing' | 'unreadable';
  expected?: string;
  actual?: string;
}

const TYPE_NAME = { f: 'file', d: 'directory', l: 'symlink', o: 'special file' } as const;

/** Every difference between the recorded listing and the tree's, in path order. */
export function compareListings(expected: ListingEntry[], actual: ListingEntry[]): LayerProblem[] {
  const now = new Map(actual.map((e) => [e[0], e]));
  const problems: LayerProblem[] = [];
  const seen = new Set<string>();
  for (const want of expected) {
    const path = want[0];
    seen.add(path);
    const got = now.get(path);
    if (!got) {
      problems.push({ path, what: 'missing', expected: TYPE_NAME[want[1]] });
      continue;
    }
    if (got[1] !== want[1]) {
      problems.push({ path, what: 'type', expected: TYPE_NAME[want[1]], actual: TYPE_NAME[got[1]] });
      continue;
    }
    if (want[1] === 'l' || want[1] === 'o') {
      if (got[2] !== want[2]) problems.push({ path, what: 'target', expected: want[2], actual: got[2] });
      continue;
    }
    if (want[1] === 'f' && got[1] === 'f') {
      if (got[5] !== want[5]) problems.push({ path, what: 'content', expected: want[5], actual: got[5] });
      if (got[3] !== want[3]) problems.push({ path, what: 'size', expected: String(want[3]), actual: String(got[3]) });
    }
    if (got[2] !== want[2]) problems.push({ path, what: 'mode', expected: want[2], actual: got[2] });
    if (want[1] === 'f' && got[1] === 'f' && got[4] !== want[4])
      problems.push({ path, what: 'mtime', expected: nsToIso(want[4]), actual: nsToIso(got[4]) });
  }
  for (const got of actual) if (!seen.has(got[0])) problems.push({ path: got[0], what: 'added', actual: TYPE_NAME[got[1]] });
  return problems.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

function nsToIso(ns: string): string {
  const n = BigInt(ns);
  return `${new Date(Number(n / 1_000_000n)).toISOString().replace('Z', '')}${(n % 1_000_000n).toString().padStart(6, '0')}Z`;
}

/** "lib/a.py: content sha256 ab…, expected cd…" */
export function describeProblem(p: LayerProblem): string {
  switch (p.what) {
    case 'missing':
      return `${p.path}: missing (a ${p.expected} when built)`;
    case 'added':
      return `${p.path}: not in the layer when built (a ${p.actual} was added)`;
    case 'content':
      return `${p.path}: content sha256 ${p.actual}, expected ${p.expected}`;
    case 'manifest':
    case 'listing':
      return `${p.path}: ${p.actual}`;
    case 'unreadable':
      return `${p.path}: cannot be read: ${p.actual}`;
    default:
      return `${p.path}: ${p.what} ${p.actual}, expected ${p.expected}`;
  }
}
