/**
 * Reads a zip's central directory (no decompression) to decide whether it
 * may be unpacked: every entry must land inside the target directory. The
 * unpacking itself is done by `unzip` inside the sandbox, after this check.
 *
 * Refused: absolute names, `..` components (with `\` read as a separator,
 * as unzip does), symbolic links (unzip would create them; Python's
 * zipfile, which SWE-ReX uses, never does), too many entries, or a total
 * uncompressed size above the limit (zip bombs).
 */
import { MinisandboxError } from '../errors.js';

/** A zip that would unpack outside its target, or too much (see above). */
export class ZipRefusedError extends MinisandboxError {
  static override readonly code = 'MSBX_ZIP_REFUSED';
}

/** Not a zip file at all (Python: zipfile.BadZipFile). */
export class BadZipError extends MinisandboxError {
  static override readonly code = 'MSBX_BAD_ZIP';
}

export interface ZipEntry {
  name: string;
  uncompressedSize: number;
  isDirectory: boolean;
  isSymlink: boolean;
}

const EOCD_SIG = 0x06054b50;
const ZIP64_LOCATOR_SIG = 0x07064b50;
const ZIP64_EOCD_SIG = 0x06064b50;
const CENTRAL_SIG = 0x02014b50;
const S_IFMT = 0o170000;
const S_IFLNK = 0o120000;
const UNIX_HOST = 3;

function findEndOfCentralDirectory(buf: Buffer): number {
  // The EOCD record is 22 bytes plus a comment of at most 65535.
  const stop = Math.max(0, buf.length - 22 - 0xffff);
  for (let i = buf.length - 22; i >= stop; i--) {
    if (buf.readUInt32LE(i) === EOCD_SIG) return i;
  }
  throw new BadZipError('File is not a zip file');
}

function readBigSize(buf: Buffer, off: number): number {
  const v = buf.readBigUInt64LE(off);
  if (v > BigInt(Number.MAX_SAFE_INTEGER)) throw new BadZipError('zip64 size out of range');
  return Number(v);
}

/** Entries of the central directory. */
function listZipEntries(buf: Buffer): ZipEntry[] {
  if (buf.length < 22) throw new BadZipError('File is not a zip file');
  const eocd = findEndOfCentralDirectory(buf);
  let count = buf.readUInt16LE(eocd + 10);
  let cdOffset = buf.readUInt32LE(eocd + 16);
  if ((count === 0xffff || cdOffset === 0xffffffff) && eocd >= 20 && buf.readUInt32LE(eocd - 20) === ZIP64_LOCATOR_SIG) {
    const z64 = readBigSize(buf, eocd - 20 + 8);
    if (z64 + 56 > buf.length || buf.readUInt32LE(z64) !== ZIP64_EOCD_SIG) throw new BadZipError('corrupt zip64 end of central directory');
    count = readBigSize(buf, z64 + 32);
    cdOffset = readBigSize(buf, z64 + 48);
  }
  const entries: ZipEntry[] = [];
  let p = cdOffset;
  for (let i = 0; i < count; i++) {
    if (p + 46 > buf.length || buf.readUInt32LE(p) !== CENTRAL_SIG) throw new BadZipError('corrupt central directory');
    const madeBy = buf.readUInt16LE(p + 4) >> 8;
    const flags = buf.readUInt16LE(p + 8);
    let uncompressedSize = buf.readUInt32LE(p + 24);
    const nameLen = buf.readUInt16LE(p + 28);
    const extraLen = buf.readUInt16LE(p + 30);
    const commentLen = buf.readUInt16LE(p + 32);
    const externalAttrs = buf.readUInt32LE(p + 38);
    if (p + 46 + nameLen + extraLen > buf.length) throw new BadZipError('corrupt central directory');
    const rawName = buf.subarray(p + 46, p + 46 + nameLen);
    // Bit 11: UTF-8 names; otherwise CP437, whose ASCII part is all the checks need.
    const name = flags & 0x800 ? rawName.toString('utf8') : rawName.toString('latin1');
    if (uncompressedSize === 0xffffffff) uncompressedSize = zip64UncompressedSize(buf.subarray(p + 46 + nameLen, p + 46 + nameLen + extraLen));
    const mode = (externalAttrs >>> 16) & 0xffff;
    entries.push({
      name,
      uncompressedSize,
      isDirectory: name.endsWith('/') || name.endsWith('\\'),
      isSymlink: madeBy === UNIX_HOST && (mode & S_IFMT) === S_IFLNK,
    });
    p += 46 + nameLen + extraLen + commentLen;
  }
  return entries;
}

function zip64UncompressedSize(extra: Buffer): number {
  for (let q = 0; q + 4 <= extra.length; ) {
    const id = extra.readUInt16LE(q);
    const size = extra.readUInt16LE(q + 2);
    // The zip64 extra field starts with the uncompressed size when the header's is 0xffffffff.
    if (id === 0x0001 && size >= 8) return readBigSize(extra, q + 4);
    q += 4 + size;
  }
  throw new BadZipError('zip64 entry without its extra field');
}

export interface ZipLimits {
  maxEntries: number;
  maxUncompressedBytes: number;
}

/** Throws ZipRefusedError (or BadZipError) unless every entry stays inside the target directory. */
export function checkZipIsSafe(buf: Buffer, limits: ZipLimits): ZipEntry[] {
  const entries = listZipEntries(buf);
  if (entries.length > limits.maxEntries) throw new ZipRefusedError(`zip has ${entries.length} entries, more than the limit of ${limits.maxEntries}`);
  let total = 0;
  for (const e of entries) {
    const parts = e.name.replace(/\\/g, '/').split('/');
    if (e.name === '' || e.name.includes('\0')) throw new ZipRefusedError('zip entry with an empty or invalid name');
    if (parts[0] === '' || /^[A-Za-z]:$/.test(parts[0]!)) throw new ZipRefusedError(`zip entry ${JSON.stringify(e.name)} has an absolute path`);
    if (parts.includes('..')) throw new ZipRefusedError(`zip entry ${JSON.stringify(e.name)} would be written outside the target directory`);
    if (e.isSymlink) throw new ZipRefusedError(`zip entry ${JSON.stringify(e.name)} is a symbolic link; links are not unpacked`);
    total += e.uncompressedSize;
    if (total > limits.maxUncompressedBytes) {
      throw new ZipRefusedError(`zip unpacks to more than ${limits.maxUncompressedBytes} bytes`);
    }
  }
  return entries;
}
