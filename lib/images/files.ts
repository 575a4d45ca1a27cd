/**
 * The files of an image source, by name: a directory (an OCI layout, an
 * unpacked `docker save`), or a tar of one read in place. A tar is indexed
 * once (headers only, seeking past the data) and each member is then read
 * as a byte range of the file: nothing is unpacked or held in memory, so a
 * multi-gigabyte archive costs one pass over its headers. A compressed tar
 * (`docker save | gzip`) cannot be read by range; it is unpacked once into
 * the store's staging directory, through the checked extractor.
 */
import { createReadStream, promises as fsp } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { codeOf } from '../errors.js';
import { compressionOf, extractArchive } from '../files/extract.js';
import { removeTree } from '../files/fsTree.js';
import { ImageError } from './errors.js';

export interface ImageFiles {
  /** What messages call the source. */
  readonly label: string;
  size(name: string): Promise<number | undefined>;
  /** The first `n` bytes (fewer if the file is shorter). */
  head(name: string, n: number): Promise<Buffer>;
  /** A whole small file (JSON); refuses one larger than `max`. */
  read(name: string, max?: number): Promise<Buffer>;
  open(name: string): Promise<Readable>;
  close(): Promise<void>;
}

const JSON_MAX = 16 << 20;

/** A name from a manifest, as a relative path that stays inside the source. */
function checkName(label: string, name: string): string {
  const parts = name.split('/').filter((c) => c !== '' && c !== '.');
  if (name.startsWith('/') || parts.includes('..') || parts.length === 0 || name.includes('\0'))
    throw new ImageError(`${label}: refers to ${JSON.stringify(name)}, which is not a path inside the image`);
  return parts.join('/');
}

class DirFiles implements ImageFiles {
  constructor(
    readonly label: string,
    private readonly dir: string,
    private readonly cleanup?: () => Promise<void>,
  ) {}

  private async abs(name: string): Promise<string> {
    const rel = checkName(this.label, name);
    // No component may be a symlink: a layout's files are plain files, and a
    // link could make the importer read anything the caller can.
    let p = this.dir;
    for (const c of rel.split('/')) {
      p = path.join(p, c);
      const st = await fsp.lstat(p).catch((err: unknown) => {
        if (codeOf(err) === 'ENOENT' || codeOf(err) === 'ENOTDIR') return undefined;
        throw err;
      });
      if (!st) return p;
      if (st.isSymbolicLink()) throw new ImageError(`${this.label}: ${rel} goes through a symlink (${path.relative(this.dir, p)}), which an image source may not have`);
    }
    return p;
  }

  async size(name: string): Promise<number | undefined> {
    const st = await fsp.lstat(await this.abs(name)).catch(() => undefined);
    return st?.isFile() ? st.size : undefined;
  }

  async head(name: string, n: number): Promise<Buffer> {
    const fh = await fsp.open(await this.abs(name), 'r');
    try {
      const b = Buffer.alloc(n);
      const { bytesRead } = await fh.read(b, 0, n, 0);
      return b.subarray(0, bytesRead);
    } finally {
      await fh.close();
    }
  }

  async read(name: string, max = JSON_MAX): Promise<Buffer> {
    const size = await this.size(name);
    if (size === undefined) throw new ImageError(`${this.label}: ${name} is missing`);
    if (size > max) throw new ImageError(`${this.label}: ${name} is ${size} bytes, more than the ${max} a metadata file may have`);
    return fsp.readFile(await this.abs(name));
  }

  async open(name: string): Promise<Readable> {
    const p = await this.abs(name);
    if ((await this.size(name)) === undefined) throw new ImageError(`${this.label}: ${name} is missing`);
    return createReadStream(p, { highWaterMark: 1 << 20 });
  }

  async close(): Promise<void> {
    await this.cleanup?.();
  }
}

interface TarMember {
  offset: number;
  size: number;
}

class TarFiles implements ImageFiles {
  constructor(
    readonly label: string,
    private readonly file: string,
    private readonly members: Map<string, TarMember>,
  ) {}

  private member(name: string): TarMember | undefined {
    return this.members.get(checkName(this.label, name));
  }

  async size(name: string): Promise<number | undefined> {
    return this.member(name)?.size;
  }

  async head(name: string, n: number): Promise<Buffer> {
    const m = this.member(name);
    if (!m) throw new ImageError(`${this.label}: ${name} is missing`);
    const fh = await fsp.open(this.file, 'r');
    try {
      const b = Buffer.alloc(Math.min(n, m.size));
      await fh.read(b, 0, b.length, m.offset);
      return b;
    } finally {
      await fh.close();
    }
  }

  async read(name: string, max = JSON_MAX): Promise<Buffer> {
    const m = this.member(name);
    if (!m) throw new ImageError(`${this.label}: ${name} is missing`);
    if (m.size > max) throw new ImageError(`${this.label}: ${name} is ${m.size} bytes, more than the ${max} a metadata file may have`);
    return this.head(name, m.size);
  }

  async open(name: string): Promise<Readable> {
    const m = this.member(name);
    if (!m) throw new ImageError(`${this.label}: ${name} is missing`);
    if (m.size === 0) return Readable.from([]);
    return createReadStream(this.file, { start: m.offset, end: m.offset + m.size - 1, highWaterMark: 1 << 20 });
  }

  async close(): Promise<void> {}
}

/**
 * Regular-file members of an uncompressed tar and where their data lies.
 * ustar, pax ('x' path/size) and GNU long names are read; a bad header
 * checksum ends the scan with an error rather than a guess.
 */
async function indexTar(file: string, label: string): Promise<Map<string, TarMember>> {
  const members = new Map<string, TarMember>();
  const fh = await fsp.open(file, 'r');
  try {
    const total = (await fh.stat()).size;
    const block = Buffer.alloc(512);
    let pos = 0;
    let paxPath: string | undefined;
    let paxSize: number | undefined;
    let longName: string | undefined;
    while (pos + 512 <= total) {
      await fh.read(block, 0, 512, pos);
      if (block.every((b) => b === 0)) break;
      let sum = 0;
      for (let i = 0; i < 512; i++) sum += i >= 148 && i < 156 ? 32 : block[i]!;
      const stored = parseInt(block.subarray(148, 156).toString('latin1').replace(/\0.*$/s, '').trim(), 8);
      if (stored !== sum) throw new ImageError(`${label}: not a tar archive, or damaged (bad header checksum at byte ${pos})`);
      const type = String.fromCharCode(block[156]!);
      const sizeField = block.subarray(124, 136);
      const size = paxSize ?? (sizeField[0]! & 0x80 ? Number(sizeField.readBigUInt64BE(4)) : parseInt(sizeField.toString('latin1').replace(/\0.*$/s, '').trim() || '0', 8));
      const dataAt = pos + 512;
      const data = async () => {
        const b = Buffer.alloc(size);
        await fh.read(b, 0, size, dataAt);
        return b;
      };
      if (type === 'x' || type === 'L') {
        if (size > 1 << 20) throw new ImageError(`${label}: extended header of ${size} bytes at byte ${pos}`);
        const b = await data();
        if (type === 'L') longName = b.toString('utf8').replace(/\0.*$/s, '');
        else {
          for (const rec of b.toString('utf8').split('\n')) {
            const m = /^\d+ ([^=]+)=(.*)$/s.exec(rec);
            if (m?.[1] === 'path') paxPath = m[2];
            if (m?.[1] === 'size') paxSize = Number(m[2]);
          }
        }
      } else if (type !== 'g') {
        const cstr = (b: Buffer) => b.toString('utf8').replace(/\0.*$/s, '');
        const prefix = block.subarray(257, 263).toString('latin1') === 'ustar\0' ? cstr(block.subarray(345, 500)) : '';
        const name = paxPath ?? longName ?? (prefix ? `${prefix}/${cstr(block.subarray(0, 100))}` : cstr(block.subarray(0, 100)));
        if (type === '0' || type === '\0' || type === '7') {
          const parts = name.split('/').filter((c) => c !== '' && c !== '.');
          if (!parts.includes('..') && parts.length > 0) members.set(parts.join('/'), { offset: dataAt, size });
        }
        paxPath = paxSize = longName = undefined;
      }
      pos = dataAt + Math.ceil(size / 512) * 512;
    }
  } finally {
    await fh.close();
  }
  return members;
}

/** Open an image source: a directory, or a tar (compressed ones are unpacked into `scratch`, a new directory the caller names). */
export async function openImageFiles(source: string, scratch: () => Promise<string>): Promise<ImageFiles> {
  const abs = path.resolve(source);
  const label = `image ${source}`;
  const st = await fsp.stat(abs).catch((err: unknown) => {
    throw new ImageError(`${label}: cannot read: ${(err as Error).message}`, { cause: err });
  });
  if (st.isDirectory()) return new DirFiles(label, abs);
  if (!st.isFile()) throw new ImageError(`${label}: neither a directory nor a file`);
  const compression = await compressionOf(abs);
  if (compression === 'none') return new TarFiles(label, abs, await indexTar(abs, label));
  const dir = await scratch();
  try {
    await extractArchive(abs, dir, { compression });
  } catch (err) {
    await removeTree(dir).catch(() => undefined);
    throw new ImageError(`${label}: ${(err as Error).message}`, { cause: err });
  }
  return new DirFiles(label, dir, () => removeTree(dir));
}
