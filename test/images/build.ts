/**
 * Small images made by hand for the tests that need what no real image
 * has (a tampered layer, `../` members, a device node, another platform):
 * raw tar bytes written header by header, so nothing between the test and
 * the importer cleans them up, then a `docker save` directory or an OCI
 * image layout around them.
 */
import { createHash } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';

export interface TarEntry {
  name: string;
  /** '0' file (default), '5' directory, '2' symlink, '1' hard link, '3' char device. */
  type?: '0' | '1' | '2' | '3' | '5';
  data?: string | Buffer;
  mode?: number;
  uid?: number;
  gid?: number;
  link?: string;
  /** pax records sent before the member (e.g. SCHILY.xattr.*). */
  pax?: Record<string, string>;
}

function header(name: string, type: string, size: number, opts: { mode: number; uid: number; gid: number; link?: string }): Buffer {
  const h = Buffer.alloc(512);
  const octal = (v: number, at: number, len: number) => h.write(`${v.toString(8).padStart(len - 1, '0')}\0`, at, len, 'latin1');
  h.write(name.slice(0, 100), 0, 'utf8');
  octal(opts.mode, 100, 8);
  octal(opts.uid, 108, 8);
  octal(opts.gid, 116, 8);
  octal(size, 124, 12);
  octal(1_700_000_000, 136, 12);
  h.write(type, 156, 'latin1');
  if (opts.link) h.write(opts.link, 157, 'utf8');
  h.write('ustar\0' + '00', 257, 'latin1');
  octal(0, 329, 8);
  octal(0, 337, 8);
  h.fill(0x20, 148, 156);
  let sum = 0;
  for (const b of h) sum += b;
  h.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8, 'latin1');
  return h;
}

const pad = (n: number) => Buffer.alloc((512 - (n % 512)) % 512);

export function tarBytes(entries: TarEntry[]): Buffer {
  const parts: Buffer[] = [];
  for (const e of entries) {
    const type = e.type ?? '0';
    const data = type === '0' ? Buffer.from(e.data ?? '') : Buffer.alloc(0);
    const records = { ...(e.pax ?? {}), ...(Buffer.byteLength(e.name) > 100 ? { path: e.name } : {}) };
    if (Object.keys(records).length > 0) {
      let body = '';
      for (const [k, v] of Object.entries(records)) {
        const rest = ` ${k}=${v}\n`;
        let len = Buffer.byteLength(rest) + 1;
        while (String(len).length + Buffer.byteLength(rest) !== len) len = String(len).length + Buffer.byteLength(rest);
        body += `${len}${rest}`;
      }
      const b = Buffer.from(body);
      parts.push(header('PaxHeader', 'x', b.length, { mode: 0o644, uid: 0, gid: 0 }), b, pad(b.length));
    }
    parts.push(header(e.name, type, data.length, { mode: e.mode ?? (type === '5' ? 0o755 : 0o644), uid: e.uid ?? 0, gid: e.gid ?? 0, ...(e.link ? { link: e.link } : {}) }), data, pad(data.length));
  }
  parts.push(Buffer.alloc(1024));
  return Buffer.concat(parts);
}

export const sha = (b: Buffer | string) => createHash('sha256').update(b).digest('hex');

export interface HandImage {
  layers: TarEntry[][];
  config?: Record<string, unknown>;
  architecture?: string;
  /** Replace a layer's bytes after its diffID was computed (a tampered layer). */
  tamper?: (i: number, bytes: Buffer) => Buffer;
  gzip?: boolean;
}

function configOf(img: HandImage, diffIds: string[]): Buffer {
  return Buffer.from(
    JSON.stringify({
      architecture: img.architecture ?? ({ x64: 'amd64', arm64: 'arm64' } as Record<string, string>)[process.arch] ?? process.arch,
      os: 'linux',
      config: img.config ?? {},
      rootfs: { type: 'layers', diff_ids: diffIds.map((d) => `sha256:${d}`) },
    }),
  );
}

/** A `docker save` directory (manifest.json, <config sha>.json, <n>/layer.tar). Returns the config's sha and the diffIDs. */
export function writeDockerSave(dir: string, img: HandImage, tag = 'hand/made:1'): { id: string; diffIds: string[] } {
  mkdirSync(dir, { recursive: true });
  const diffIds: string[] = [];
  const files: string[] = [];
  img.layers.forEach((entries, i) => {
    const raw = tarBytes(entries);
    diffIds.push(sha(raw));
    let bytes = img.gzip ? gzipSync(raw) : raw;
    if (img.tamper) bytes = img.tamper(i, bytes);
    mkdirSync(join(dir, `l${i}`), { recursive: true });
    writeFileSync(join(dir, `l${i}`, 'layer.tar'), bytes);
    files.push(`l${i}/layer.tar`);
  });
  const config = configOf(img, diffIds);
  const id = sha(config);
  writeFileSync(join(dir, `${id}.json`), config);
  writeFileSync(join(dir, 'manifest.json'), JSON.stringify([{ Config: `${id}.json`, RepoTags: [tag], Layers: files }]));
  return { id, diffIds };
}

/** An OCI image layout; `platforms` makes index.json point at an index of one manifest per platform (all the same image). */
export function writeOciLayout(dir: string, img: HandImage, platforms?: string[]): { id: string; diffIds: string[] } {
  const blobs = join(dir, 'blobs', 'sha256');
  mkdirSync(blobs, { recursive: true });
  const put = (b: Buffer) => {
    const d = sha(b);
    writeFileSync(join(blobs, d), b);
    return { digest: `sha256:${d}`, size: b.length };
  };
  const diffIds: string[] = [];
  const layers = img.layers.map((entries, i) => {
    const raw = tarBytes(entries);
    diffIds.push(sha(raw));
    const bytes = gzipSync(raw);
    const desc = put(bytes);
    if (img.tamper) writeFileSync(join(blobs, desc.digest.slice(7)), img.tamper(i, bytes));
    return { mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', ...desc };
  });
  const config = configOf(img, diffIds);
  const manifest = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...put(config) }, layers }));
  const mdesc = { mediaType: 'application/vnd.oci.image.manifest.v1+json', ...put(manifest) };
  let top: Record<string, unknown> = { ...mdesc, annotations: { 'org.opencontainers.image.ref.name': 'hand' } };
  if (platforms) {
    const index = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: 'application/vnd.oci.image.index.v1+json',
        manifests: platforms.map((p) => ({ ...mdesc, platform: { os: p.split('/')[0], architecture: p.split('/')[1] } })),
      }),
    );
    top = { mediaType: 'application/vnd.oci.image.index.v1+json', ...put(index), annotations: { 'org.opencontainers.image.ref.name': 'hand' } };
  }
  writeFileSync(join(dir, 'index.json'), JSON.stringify({ schemaVersion: 2, manifests: [top] }));
  writeFileSync(join(dir, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  return { id: sha(config), diffIds };
}
