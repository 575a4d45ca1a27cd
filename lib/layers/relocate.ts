import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { codeOf } from '../errors.js';
import { walkTree } from '../files/fsTree.js';
import { LayerError } from './errors.js';

/**
 * Venv relocation: the build-time scan and the per-instance rewrite.
 *
 * The preferred way is not to relocate at all: build the venv at the path it
 * will have in the sandbox and overlay-mount it there. This module covers the
 * case where a layer must live somewhere else. As conda-pack does, it records
 * at build time which files embed the build prefix, and later rewrites only
 * those files.
 */
export type PrefixFileKind = 'text' | 'binary' | 'symlink';

export interface PrefixFile {
  /** Path relative to the layer root. */
  path: string;
  kind: PrefixFileKind;
}

/** Bytes that may continue a path component: a prefix match must not be followed by one. */
export const PATH_CHAR = /[A-Za-z0-9._+-]/;

export function isPyc(p: string): boolean {
  return p.endsWith('.pyc') || p.endsWith('.pyo');
}

/**
 * Find every file under `root` that embeds `prefix`: text files, binaries
 * (anything with a NUL byte, e.g. ELF RPATH/RUNPATH strings) and symlinks
 * whose target contains it. `.pyc` files are skipped on purpose. Their
 * `co_filename` holds the old path, but importlib fixes that at load time
 * (`_imp._fix_co_filename`), and rewriting marshal data with a different length
 * would corrupt it.
 */
export async function scanForPrefix(root: string, prefix: string): Promise<PrefixFile[]> {
  if (!path.isAbsolute(prefix)) throw new LayerError(`prefix scan ${root}: prefix ${prefix} is not absolute`);
  const needle = Buffer.from(prefix);
  const out: PrefixFile[] = [];
  for await (const e of walkTree(root)) {
    if (e.st.isSymbolicLink()) {
      const target = await fsp.readlink(e.abs, { encoding: 'buffer' });
      if (findPrefix(target, needle, 0) !== -1) out.push({ path: e.rel, kind: 'symlink' });
      continue;
    }
    if (!e.st.isFile() || isPyc(e.rel)) continue;
    const buf = await fsp.readFile(e.abs);
    if (findPrefix(buf, needle, 0) === -1) continue;
    out.push({ path: e.rel, kind: buf.includes(0) ? 'binary' : 'text' });
  }
  return out;
}

/**
 * Index of `needle` in `buf` at or after `from`, not followed by a path
 * character. Self-contained but for PATH_CHAR: the store's finishing workers
 * run its source text (finish.ts).
 */
export function findPrefix(buf: Buffer, needle: Buffer, from: number): number {
  let i = buf.indexOf(needle, from);
  while (i !== -1) {
    const next = buf[i + needle.length];
    if (next === undefined || !PATH_CHAR.test(String.fromCharCode(next))) return i;
    i = buf.indexOf(needle, i + 1);
  }
  return -1;
}

function replaceAll(buf: Buffer, from: Buffer, to: Buffer): { out: Buffer; count: number } {
  const parts: Buffer[] = [];
  let pos = 0;
  let count = 0;
  for (let i = findPrefix(buf, from, 0); i !== -1; i = findPrefix(buf, from, pos)) {
    parts.push(buf.subarray(pos, i), to);
    pos = i + from.length;
    count++;
  }
  parts.push(buf.subarray(pos));
  return { out: Buffer.concat(parts), count };
}

/**
 * Same-length rewrite of NUL-terminated strings for binaries (what
 * conda-pack's binary_replace does). Every C string containing the prefix
 * gets it replaced and is padded with NULs to its old length, so offsets in
 * the ELF file do not move. Impossible when the new prefix is longer.
 */
function replaceInBinary(buf: Buffer, from: Buffer, to: Buffer, file: string): number {
  let count = 0;
  let i = findPrefix(buf, from, 0);
  while (i !== -1) {
    // The C string that holds the match: back to the previous NUL, on to the next.
    let start = i;
    while (start > 0 && buf[start - 1] !== 0) start--;
    let end = buf.indexOf(0, i);
    if (end === -1) end = buf.length;
    const str = buf.subarray(start, end);
    const { out, count: n } = replaceAll(str, from, to);
    if (out.length > str.length)
      throw new LayerError(
        `relocate ${file}: new prefix ${to.toString()} is ${to.length - from.length} bytes longer than ${from.toString()}; ` +
          'binary strings (ELF RPATH/RUNPATH) can only be rewritten in place to a prefix of the same or shorter length ' +
          '(build the layer at a longer, padded prefix, or use patchelf)',
      );
    out.copy(buf, start);
    buf.fill(0, start + out.length, end);
    count += n;
    i = findPrefix(buf, from, end);
  }
  return count;
}

/** Linux reads at most this many bytes of a `#!` line in pip/distlib's model; longer lines need the sh wrapper. */
export const SHEBANG_LIMIT = 127;

/**
 * After a rewrite, a plain `#!/new/prefix/bin/python` line may be longer than
 * 127 bytes or contain a space. In either case switch to distlib's /bin/sh
 * wrapper, which works whatever the interpreter path:
 *   #!/bin/sh
 *   '''exec' "/path/python" "$0" "$@"
 *   ' '''
 */
export function fixShebang(content: Buffer): Buffer {
  if (content[0] !== 0x23 || content[1] !== 0x21) return content;
  const nl = content.indexOf(0x0a);
  const first = content.subarray(0, nl === -1 ? content.length : nl).toString('utf8');
  const rest = nl === -1 ? Buffer.alloc(0) : content.subarray(nl + 1);
  if (first.startsWith('#!/bin/sh')) return content; // already the wrapper (or a real sh script)
  const interp = first.slice(2).trim();
  const needsWrapper = Buffer.byteLength(first) > SHEBANG_LIMIT || /\s/.test(interp);
  if (!needsWrapper) return content;
  // pip/distlib never put arguments on a console-script shebang, so the
  // whole rest of the line is the interpreter path; quote it if it has spaces.
  const quoted = /\s/.test(interp) ? `"${interp}"` : interp;
  const head = `#!/bin/sh\n'''exec' ${quoted} "$0" "$@"\n' '''\n`;
  return Buffer.concat([Buffer.from(head), rest]);
}

export interface RelocateOptions {
  /** Prefix the files were built at (manifest.prefix). */
  from: string;
  /** Prefix they must now work at. */
  to: string;
  /** Files to rewrite (manifest.prefixFiles), relative to `root`. */
  files: readonly PrefixFile[];
}

export interface RelocateResult {
  rewritten: string[];
  /** Cached bytecode deleted because its .py was rewritten. */
  pycRemoved: string[];
}

/**
 * Rewrite a relocated tree in place. The tree must be writable. Layer trees
 * in the store are read-only, so run this on a sandbox's merged overlay view
 * or on a copy.
 *
 * Each file is written to a temporary name and renamed over the original.
 * This never writes into the old inode, which may be hard-linked to other
 * layers by dedup. The file mode is kept; the mtime becomes "now". For every
 * rewritten .py, its `__pycache__/<name>.*.pyc` is deleted. Otherwise a
 * same-length rewrite with kept mtime would leave a .pyc that still looks
 * valid and holds the old constants (reproduced with the editable finder's
 * MAPPING).
 */
export async function relocateTree(root: string, opts: RelocateOptions): Promise<RelocateResult> {
  const from = Buffer.from(opts.from.replace(/\/+$/, ''));
  const to = Buffer.from(opts.to.replace(/\/+$/, ''));
  if (!path.isAbsolute(opts.from) || !path.isAbsolute(opts.to))
    throw new LayerError(`relocate ${root}: prefixes must be absolute (from ${opts.from}, to ${opts.to})`);
  // Check every binary first so a too-long prefix fails before anything is changed.
  if (to.length > from.length) {
    const bin = opts.files.find((f) => f.kind === 'binary' && !isPyc(f.path));
    if (bin)
      throw new LayerError(
        `relocate ${path.join(root, bin.path)}: new prefix ${opts.to} (${to.length} bytes) is longer than ${opts.from} ` +
          `(${from.length} bytes); binary strings (ELF RPATH/RUNPATH) can only be rewritten in place to an equal or shorter prefix`,
      );
  }
  const result: RelocateResult = { rewritten: [], pycRemoved: [] };
  for (const f of opts.files) {
    if (isPyc(f.path)) continue; // never rewrite bytecode
    const abs = safeJoin(root, f.path);
    if (f.kind === 'symlink') {
      const target = await fsp.readlink(abs, { encoding: 'buffer' });
      const { out, count } = replaceAll(target, from, to);
      if (count === 0) continue;
      const tmp = `${abs}.reloc-${process.pid}`;
      await fsp.symlink(out, tmp);
      await fsp.rename(tmp, abs);
      result.rewritten.push(f.path);
      continue;
    }
    let st;
    try {
      st = await fsp.lstat(abs);
    } catch (err) {
      if (codeOf(err) === 'ENOENT') continue; // deleted in this instance: nothing to do
      throw err;
    }
    if (!st.isFile()) continue;
    const buf = await fsp.readFile(abs);
    let out: Buffer;
    if (f.kind === 'binary') {
      if (replaceInBinary(buf, from, to, abs) === 0) continue;
      out = buf;
    } else {
      const r = replaceAll(buf, from, to);
      if (r.count === 0) continue;
      out = r.out;
      if (isScriptDir(f.path)) out = fixShebang(out);
    }
    const tmp = `${abs}.reloc-${process.pid}`;
    await fsp.writeFile(tmp, out, { mode: st.mode & 0o7777 });
    await fsp.chmod(tmp, st.mode & 0o7777); // writeFile's mode is masked by umask
    await fsp.rename(tmp, abs);
    result.rewritten.push(f.path);
    if (f.path.endsWith('.py')) result.pycRemoved.push(...(await removeCachedBytecode(root, f.path)));
  }
  return result;
}

function isScriptDir(rel: string): boolean {
  return /(^|\/)(bin|Scripts)\/[^/]+$/.test(rel);
}

/** Join a manifest path to root, refusing anything that would leave root. */
function safeJoin(root: string, rel: string): string {
  const abs = path.resolve(root, rel);
  if (path.isAbsolute(rel) || rel.split('/').includes('..') || !abs.startsWith(path.resolve(root) + path.sep))
    throw new LayerError(`relocate ${root}: manifest path ${rel} leaves the tree`);
  return abs;
}

async function removeCachedBytecode(root: string, relPy: string): Promise<string[]> {
  const dir = path.dirname(relPy);
  const stem = path.basename(relPy, '.py');
  const cache = path.join(root, dir, '__pycache__');
  const removed: string[] = [];
  let names: string[];
  try {
    names = await fsp.readdir(cache);
  } catch {
    return removed;
  }
  for (const n of names) {
    // <stem>.<tag>[.opt-N].pyc, e.g. foo.cpython-311.pyc, foo.cpython-311.opt-1.pyc
    if (n.startsWith(`${stem}.`) && n.endsWith('.pyc') && !n.slice(stem.length + 1).slice(0, -4).includes('/')) {
      const rest = n.slice(stem.length + 1, -4);
      if (rest.split('.').length <= 2) {
        await fsp.rm(path.join(cache, n), { force: true });
        removed.push(path.join(dir, '__pycache__', n));
      }
    }
  }
  return removed;
}
