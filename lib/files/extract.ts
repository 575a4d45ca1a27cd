import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { Transform, type Readable, type TransformCallback } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { codeOf } from '../errors.js';
import { FileError } from './errors.js';
import { removeTree } from './fsTree.js';
import { TarChecker } from './tarCheck.js';
import { checkedUnpack, type FileDigest } from './unpack.js';

export type Compression = 'zstd' | 'gzip' | 'none';

/** Compression from the file name, or from the magic bytes if the name says nothing. */
export async function compressionOf(archive: string): Promise<Compression> {
  const base = path.basename(archive).toLowerCase();
  if (base.endsWith('.tar.zst') || base.endsWith('.tzst') || base.endsWith('.zst')) return 'zstd';
  if (base.endsWith('.tar.gz') || base.endsWith('.tgz') || base.endsWith('.gz')) return 'gzip';
  if (base.endsWith('.tar')) return 'none';
  const fh = await fsp.open(archive, 'r');
  try {
    const head = Buffer.alloc(4);
    await fh.read(head, 0, 4, 0);
    if (head.readUInt32LE(0) === 0xfd2fb528) return 'zstd';
    if (head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
    return 'none';
  } finally {
    await fh.close();
  }
}

export interface ExtractOptions {
  /** Default: from the file name (.tar.zst is the default format). */
  compression?: Compression;
  /** Called with archive bytes read so far and the archive size. */
  onProgress?: (done: number, total: number) => void;
  signal?: AbortSignal;
  /**
   * sha256 the archive must have (hex, or "sha256:<hex>"). It is computed on
   * the same open file that is then unpacked, before anything is unpacked: a
   * mismatch unpacks nothing. (A file swapped by rename after the check is
   * not read; one rewritten in place by someone who may write the store is
   * not defended against: they could rewrite the layers too.)
   */
  expectDigest?: string;
  /**
   * Hash each regular file's content as it passes to tar, and return the
   * digests (ArchiveExtractResult.digests). Costs no extra read of the tree.
   */
  hashFiles?: boolean;
}

export interface ExtractResult {
  members: number;
  archiveBytes: number;
}

export interface ArchiveExtractResult extends ExtractResult {
  /**
   * With hashFiles: sha256 and size of every path the archive leaves as a
   * regular file (relative to `dest`, 'a/b/c'); see unpack.ts. Paths whose
   * names are not UTF-8 are left out.
   */
  digests?: Map<string, FileDigest>;
}

/**
 * Unpack `archive` into the existing, empty directory `dest` with GNU tar.
 *
 * Data path (unpack.ts): the decompressor (`zstd -dc` / `gzip -dc`) reads
 * the archive's open file itself, and its output passes through TarCheck in
 * a worker thread, which refuses hostile members *before* tar sees their
 * header (and hashes files with `hashFiles`). Then `tar -x` writes the files. GNU tar does the writing because it is
 * 20-35x faster than node-tar on many small files. It also keeps mtimes, so
 * timestamp-based .pyc files stay valid.
 *
 * GNU tar's own defaults add a second line of defence: it strips a leading
 * '/' and skips members containing '..'. It also creates symlinks whose target
 * is absolute or contains '..' as placeholder files until the end of
 * extraction, so a later member cannot be written through them, and it
 * replaces a symlink with a real directory when a directory member of the same
 * name follows. `--no-same-owner` keeps root from chowning files to archive
 * uids, which would be unmapped (uid 65534) inside a user-namespace sandbox.
 * The checker clears setuid/setgid bits.
 *
 * This is the layer extractor: symlink targets may point anywhere, because
 * they are only ever resolved inside a sandbox's mount namespace. A tree for
 * the host goes through extractUntrusted instead.
 *
 * On error `dest` may hold a partial tree; the caller unpacks into a staging
 * directory and deletes it.
 */
export async function extractArchive(archive: string, dest: string, opts: ExtractOptions = {}): Promise<ArchiveExtractResult> {
  const label = `layer archive ${archive}`;
  const want = opts.expectDigest === undefined ? undefined : opts.expectDigest.replace(/^sha256:/, '');
  if (want !== undefined && !/^[0-9a-f]{64}$/.test(want))
    throw new FileError(`${label}: expected digest ${JSON.stringify(opts.expectDigest)} is not a sha256 hex digest`);
  const fh = await fsp.open(archive, 'r').catch((err: unknown) => {
    throw new FileError(`${label}: cannot read: ${(err as Error).message}`, { cause: err });
  });
  try {
    const st = await fh.stat();
    if (!st.isFile()) throw new FileError(`${label}: not a regular file`);
    const compression = opts.compression ?? (await compressionOf(archive));
    if (want !== undefined) {
      const h = createHash('sha256');
      for await (const chunk of fh.createReadStream({ start: 0, highWaterMark: 1 << 20, autoClose: false })) h.update(chunk as Buffer);
      const got = h.digest('hex');
      if (got !== want)
        throw new FileError(`${label}: sha256 is ${got}, not the expected ${want}: the archive changed after it was stored; nothing was unpacked`);
    }
    const total = st.size;
    let lastReport = 0;
    const { members, digests } = await checkedUnpack({
      fd: fh.fd,
      compression,
      tarArgs: ['-C', dest, '--no-same-owner'],
      archiveName: archive,
      label,
      ...(opts.hashFiles ? { hashFiles: true } : {}),
      ...(opts.onProgress ? { onProgress: (done: number) => opts.onProgress?.((lastReport = done), total) } : {}),
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    if (opts.onProgress && lastReport !== total) opts.onProgress(total, total);
    return { members, archiveBytes: total, ...(digests ? { digests } : {}) };
  } finally {
    await fh.close();
  }
}

/** The `tar -x` process of an unpack: GNU tar's stdin, stderr and exit, wherever it runs. */
export type TarSpawner = (args: string[]) => ChildProcess;

export interface ImageLayerExtractOptions {
  /** Start of every message (e.g. `image app.tar: layer sha256:ab12…`). */
  label: string;
  /** How `input` is compressed (the caller knows it from the media type or the magic bytes). */
  compression: Compression;
  /** sha256 of `input` as given (an OCI blob digest): checked when the stream ends. */
  expectDigest?: string;
  /** sha256 of the uncompressed tar (the config's `rootfs.diff_ids` entry): always checked. */
  expectDiffId: string;
  /**
   * 'keep': owners as the archive says (`--same-owner`; root, or tar run as
   * root in a user namespace with an id range through `spawnTar`).
   * 'squash': every file belongs to whoever runs tar (`--no-same-owner`).
   */
  owners: 'keep' | 'squash';
  /** Runs `tar` with these arguments somewhere else (a sandbox); default: a child process here. `dest` must be the same path there. */
  spawnTar?: TarSpawner;
  /** Input bytes read so far. */
  onProgress?: (done: number) => void;
  signal?: AbortSignal;
}

export interface ImageLayerExtractResult extends ExtractResult {
  /** sha256 of the input and of the uncompressed tar, hex. */
  digest: string;
  diffId: string;
  whiteouts: number;
  opaqueDirs: number;
}

/**
 * Unpack one container image layer (a Docker / OCI layer tar, gzip or zstd
 * or plain) into the empty directory `dest`, streamed: nothing is held in
 * memory or written to a temporary file. The input is hashed as it is read
 * (its blob digest) and again after decompression (its diffID); both are
 * compared when the stream ends and a mismatch is an error. The caller
 * unpacks into a staging directory and publishes it only on success, so a
 * tampered layer is never seen by anyone.
 *
 * Members go through TarChecker in `whiteouts: 'overlay'` mode (whiteouts
 * rewritten for overlayfs, the archive's own xattrs dropped, the layer
 * rules of extractArchive), then `tar -x` keeps modes exactly, mtimes,
 * symlinks, hard links and, with `owners: 'keep'`, owners; the only xattr
 * it writes is the opaque marker the checker made.
 */
export async function extractImageLayer(input: Readable, dest: string, opts: ImageLayerExtractOptions): Promise<ImageLayerExtractResult> {
  const { label } = opts;
  const hex = (d: string | undefined, what: string): string | undefined => {
    if (d === undefined) return undefined;
    const h = d.replace(/^sha256:/, '');
    if (!/^[0-9a-f]{64}$/.test(h)) throw new FileError(`${label}: ${what} ${JSON.stringify(d)} is not a sha256 digest`);
    return h;
  };
  const wantDigest = hex(opts.expectDigest, 'expected digest');
  const wantDiffId = hex(opts.expectDiffId, 'expected diffID')!;
  const outer = createHash('sha256');
  const inner = createHash('sha256');
  let bytes = 0;
  let lastReport = 0;
  const counter = new Transform({
    transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback) {
      bytes += chunk.length;
      outer.update(chunk);
      if (opts.onProgress && bytes - lastReport >= 1 << 20) {
        lastReport = bytes;
        opts.onProgress(bytes);
      }
      cb(null, chunk);
    },
  });
  // An uncompressed layer's blob digest is its diffID: hashed once.
  const plain = opts.compression === 'none';
  const uncompressed = plain
    ? undefined
    : new Transform({
        transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback) {
          inner.update(chunk);
          cb(null, chunk);
        },
      });
  const checker = new TarChecker(label, { label, whiteouts: 'overlay' });
  await unpack({
    input,
    counter,
    ...(uncompressed ? { afterDecompress: uncompressed } : {}),
    compression: opts.compression,
    checker,
    tarArgs: [
      '-C',
      dest,
      '--numeric-owner',
      opts.owners === 'keep' ? '--same-owner' : '--no-same-owner',
      '--same-permissions',
      '--xattrs',
      '--xattrs-include=user.overlay.*',
    ],
    label,
    ...(opts.spawnTar ? { spawnTar: opts.spawnTar } : {}),
    ...(opts.signal ? { signal: opts.signal } : {}),
  });
  opts.onProgress?.(bytes);
  const digest = outer.digest('hex');
  const diffId = plain ? digest : inner.digest('hex');
  if (wantDigest !== undefined && digest !== wantDigest)
    throw new FileError(`${label}: blob sha256 is ${digest}, not ${wantDigest} as its manifest says: the layer was altered or damaged; nothing was stored`);
  if (diffId !== wantDiffId)
    throw new FileError(`${label}: uncompressed sha256 (diffID) is ${diffId}, not ${wantDiffId} as the image config says: the layer was altered or damaged; nothing was stored`);
  return { members: checker.members, archiveBytes: bytes, digest, diffId, whiteouts: checker.whiteouts, opaqueDirs: checker.opaqueDirs };
}

export interface UntrustedExtractOptions {
  /** Start of every message, naming the operation (e.g. `download /work`). */
  label: string;
  /**
   * 'tree' (default): the archive is a directory tree (members `./…`) that
   * becomes `dest`. 'file': it holds exactly one regular file, which becomes
   * `dest`.
   */
  kind?: 'tree' | 'file';
  /**
   * The writer of `input` (e.g. tar in a sandbox): awaited after the stream
   * is unpacked and before anything is published; if it rejects, nothing is.
   */
  producer?: Promise<unknown>;
  signal?: AbortSignal;
}

/**
 * Unpack an untrusted, uncompressed tar stream (what code in a sandbox
 * wrote) to a new path `dest` on the host, all or nothing.
 *
 * A separate entry point rather than options of extractArchive, because the
 * two differ in what a safe result is, not in details: a layer's symlinks may
 * point anywhere (they are resolved only inside a sandbox) and the store owns
 * its staging and publishing, whereas a tree handed to a caller on the host
 * must be safe to use there as it is. Here the safe behaviour is the only
 * one, so no caller gets half of it by forgetting an option:
 *
 *  - every symlink must resolve inside `dest` (TarChecker `symlinks:
 *    'inside'`): an absolute target, or a relative one that climbs out
 *    (through other symlinks too), refuses the whole archive, naming the
 *    member. Refused rather than rewritten or dropped, because a silently
 *    changed tree is worse than a clear error;
 *  - hard links only to earlier regular files of the archive; no devices,
 *    FIFOs, `..` or absolute names (the layer checker's rules);
 *  - setuid/setgid bits are cleared and ownership is never restored, so root
 *    never leaves a setuid-root binary behind; other permission bits are
 *    kept exactly (`--same-permissions`, whatever the umask);
 *  - it is unpacked into a staging directory made next to `dest` (same
 *    filesystem, mode 0700 while it fills) and renamed into place only once
 *    everything, the producer included, has succeeded. On any failure the
 *    staging directory is removed and `dest` is untouched.
 *
 * An existing `dest` is never merged into: a tree replaces only an empty
 * directory (rename's own rule); a file replaces a file or a symlink (the
 * link itself, not its target), as cp would, but never a directory. Anything
 * else is an error before anything is unpacked, and checked again by the
 * final rename. Missing parents of `dest` are created.
 */
export async function extractUntrusted(input: Readable, dest: string, opts: UntrustedExtractOptions): Promise<ExtractResult> {
  const { label } = opts;
  const kind = opts.kind ?? 'tree';
  // Awaited only after a successful unpack; until then (or if the unpack
  // fails first) its rejection must not count as unhandled.
  opts.producer?.catch(() => undefined);
  const target = path.resolve(dest);
  const parent = path.dirname(target);
  let staging: string;
  try {
    await fsp.mkdir(parent, { recursive: true });
    await checkUntrustedDestination(target, kind, label);
    staging = await fsp.mkdtemp(path.join(parent, `.${path.basename(target).slice(0, 64)}.msbx-unpack-`));
  } catch (err) {
    input.destroy();
    if (err instanceof FileError) throw err;
    throw new FileError(`${label}: cannot prepare ${target}: ${(err as Error).message}`, { cause: err });
  }
  try {
    const checker = new TarChecker(label, { label, destination: 'the destination', symlinks: 'inside' });
    let bytes = 0;
    const counter = new Transform({
      transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback) {
        bytes += chunk.length;
        cb(null, chunk);
      },
    });
    await unpack({
      input,
      counter,
      compression: 'none',
      checker,
      tarArgs: ['-C', staging, '--no-same-owner', '--same-permissions'],
      label,
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    await opts.producer;
    await publishUntrusted(staging, target, kind, label);
    return { members: checker.members, archiveBytes: bytes };
  } catch (err) {
    await removeTree(staging).catch(() => undefined);
    throw err;
  }
}

function existsAlready(target: string, what: string, label: string): FileError {
  return new FileError(`${label}: ${target} already exists and is ${what}; nothing was written`);
}

async function checkUntrustedDestination(target: string, kind: 'tree' | 'file', label: string): Promise<void> {
  const st = await fsp.lstat(target).catch((err: unknown) => {
    if (codeOf(err) === 'ENOENT') return undefined;
    throw err;
  });
  if (!st) return;
  if (kind === 'file') {
    if (st.isDirectory()) throw existsAlready(target, 'a directory', label);
    return;
  }
  if (!st.isDirectory()) throw existsAlready(target, 'not a directory', label);
  if ((await fsp.readdir(target)).length > 0) throw existsAlready(target, 'a non-empty directory', label);
}

async function publishUntrusted(staging: string, target: string, kind: 'tree' | 'file', label: string): Promise<void> {
  let from = staging;
  if (kind === 'file') {
    const names = await fsp.readdir(staging);
    const only = names.length === 1 ? await fsp.lstat(path.join(staging, names[0]!)) : undefined;
    if (!only?.isFile()) throw new FileError(`${label}: expected the archive to hold one regular file, found ${names.length === 1 ? 'something else' : `${names.length} entries`}`);
    from = path.join(staging, names[0]!);
  }
  try {
    // rename(2) replaces an empty directory, or a file or symlink by a file,
    // and fails on anything else: the rule above holds even if `target`
    // changed since it was checked.
    await fsp.rename(from, target);
  } catch (err) {
    const code = codeOf(err);
    if (code === 'ENOTEMPTY' || code === 'EEXIST') throw existsAlready(target, 'a non-empty directory', label);
    if (code === 'ENOTDIR') throw existsAlready(target, 'not a directory', label);
    if (code === 'EISDIR') throw existsAlready(target, 'a directory', label);
    throw new FileError(`${label}: cannot move the unpacked ${kind} into place at ${target}: ${(err as Error).message}`, { cause: err });
  }
  if (kind === 'file') await fsp.rmdir(staging);
}

interface UnpackSpec {
  /** The archive's bytes, compressed as `compression` says. */
  input: Readable;
  /** Passes the (compressed) input through first, e.g. to count progress. */
  counter?: Transform;
  /** Passes the uncompressed tar through before the checker (e.g. to hash it). */
  afterDecompress?: Transform;
  /** Where `tar -x` runs (default: a child process here). */
  spawnTar?: TarSpawner;
  compression: Compression;
  checker: TarChecker;
  /** Arguments of `tar -x -f -` (where, and how). */
  tarArgs: string[];
  label: string;
  signal?: AbortSignal;
}

/** input -> [decompressor] -> checker -> tar -x, every process waited for, the first failure explained. */
async function unpack(spec: UnpackSpec): Promise<void> {
  const { label, checker } = spec;
  let checkerError: Error | undefined;
  checker.on('error', (e: Error) => (checkerError ??= e));

  const children: ChildProcess[] = [];
  const stderrOf = new Map<ChildProcess, string>();
  const start = (cmd: string, args: string[]): ChildProcess => {
    const child = cmd === 'tar' && spec.spawnTar ? spec.spawnTar(args) : spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    children.push(child);
    // A killed or finished child makes late writes fail with EPIPE after the
    // pipeline has settled; the real cause is reported through exit codes and
    // the checker, so these late stream errors are swallowed here.
    child.stdin?.on('error', () => undefined);
    child.stdout?.on('error', () => undefined);
    stderrOf.set(child, '');
    child.stderr?.on('data', (b: Buffer) => stderrOf.set(child, (stderrOf.get(child) ?? '') + b.toString()));
    return child;
  };
  const exited = (child: ChildProcess, name: string): Promise<void> =>
    new Promise((resolve, reject) => {
      child.on('error', (e) => reject(new FileError(`${label}: cannot run ${name}: ${e.message}`)));
      child.on('close', (code, sig) => {
        if (code === 0) resolve();
        else reject(new FileError(`${label}: ${name} failed (${sig ?? `exit ${code}`}): ${(stderrOf.get(child) ?? '').trim()}`));
      });
    });

  const tar = start('tar', ['-x', '-f', '-', ...spec.tarArgs]);
  const steps: Promise<unknown>[] = [exited(tar, 'tar -x')];
  const sig = spec.signal ?? new AbortController().signal;
  const head: Array<Readable | Transform> = spec.counter ? [spec.input, spec.counter] : [spec.input];
  const after = spec.afterDecompress ? [spec.afterDecompress] : [];
  if (spec.compression === 'none') {
    steps.push(pipeline([...head, ...after, checker, tar.stdin!], { signal: sig }));
  } else {
    const name = spec.compression === 'zstd' ? 'zstd' : 'gzip';
    const dec = start(name, ['-dc', '-q']);
    steps.push(exited(dec, `${name} -dc`));
    steps.push(pipeline([...head, dec.stdin!], { signal: sig }));
    steps.push(pipeline([dec.stdout!, ...after, checker, tar.stdin!], { signal: sig }));
  }

  try {
    // Wait for all; on the first failure kill the rest so nothing hangs.
    await Promise.all(
      steps.map((p) =>
        p.catch((err: unknown) => {
          for (const c of children) if (c.exitCode === null) c.kill('SIGKILL');
          spec.input.destroy();
          throw err;
        }),
      ),
    );
  } catch (err) {
    await Promise.allSettled(steps);
    // Prefer the checker's refusal (it names the member) over the broken
    // pipes and killed processes it causes.
    // (Only its own refusal: a pipeline torn down by an abort destroys the
    // checker with a plain AbortError, which is not the checker's word.)
    if (checkerError instanceof FileError) throw checkerError;
    if (err instanceof FileError) throw err;
    if (spec.signal?.aborted) throw new FileError(`${label}: extraction aborted`, { cause: err });
    throw new FileError(`${label}: ${(err as Error).message}`, { cause: err });
  }
}

export interface PackOptions {
  /** Default 'zstd'. */
  compression?: Compression;
  /** zstd level (default 3) or gzip level (default 6). */
  level?: number;
}

/**
 * Pack a directory into a reproducible archive: names sorted, owner and group
 * 0 (numeric), pax format without atime/ctime (the reproducible-builds.org
 * recipe), mtimes kept. zstd runs with -T0 (all cores); gzip with -n (no
 * name/timestamp in its header). The archive is written to a temporary name
 * next to `outFile` and renamed, so a crash never leaves a truncated archive
 * under the final name.
 */
export async function packDirectory(dir: string, outFile: string, opts: PackOptions = {}): Promise<{ bytes: number }> {
  const st = await fsp.stat(dir).catch(() => undefined);
  if (!st?.isDirectory()) throw new FileError(`pack ${dir}: not a directory`);
  const compression = opts.compression ?? 'zstd';
  const tmp = `${outFile}.tmp-${process.pid}-${Date.now()}`;
  const args = [
    '-c',
    '-f',
    tmp,
    '-C',
    dir,
    '--sort=name',
    '--format=posix',
    '--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime',
    '--owner=0',
    '--group=0',
    '--numeric-owner',
  ];
  if (compression === 'zstd') args.push(`--use-compress-program=zstd -T0 -q -${opts.level ?? 3}`);
  else if (compression === 'gzip') args.push(`--use-compress-program=gzip -n -${opts.level ?? 6}`);
  args.push('.');
  try {
    await new Promise<void>((resolve, reject) => {
      const child = spawn('tar', args, { stdio: ['ignore', 'ignore', 'pipe'] });
      let stderr = '';
      child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
      child.on('error', (e) => reject(new FileError(`pack ${dir}: cannot run tar: ${e.message}`)));
      child.on('close', (code) =>
        code === 0 ? resolve() : reject(new FileError(`pack ${dir} -> ${outFile}: tar failed (exit ${code}): ${stderr.trim()}`)),
      );
    });
    await fsp.rename(tmp, outFile);
  } catch (err) {
    await fsp.rm(tmp, { force: true });
    throw err;
  }
  return { bytes: (await fsp.stat(outFile)).size };
}
