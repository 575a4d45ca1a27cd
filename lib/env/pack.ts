/**
 * A directory becomes a store layer through its archive: pack to .tar.zst
 * (reproducible: sorted, numeric owner 0, mtimes kept), add the archive to the
 * store (its digest is the archive's sha256, so the same tree packed twice is
 * one layer), and keep the archive as envs/archives/<digest>.tar.zst: it is
 * what would be shipped to another machine (and what the extraction baseline
 * unpacks).
 *
 * Without an archive to keep, packing and unpacking again would only cost
 * time (zstd, then tar), so the directory is added as it is.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { packDirectory } from '../files/extract.js';
import type { Layer, LayerStore, PinRequest } from '../layers/index.js';
import { archiveFileFor, envsDir } from './manifest.js';

export interface PackedLayer {
  layer: Layer;
  /** Absolute archive path (kept), or undefined with keepArchive: false. */
  archive?: string;
  /** Size of the archive; undefined with keepArchive: false (none is made). */
  archiveBytes?: number;
}

export async function packAsLayer(
  dir: string,
  store: LayerStore,
  opts: { name: string; prefix?: string; keepArchive?: boolean; pin?: PinRequest; signal?: AbortSignal },
): Promise<PackedLayer> {
  const add = {
    name: opts.name,
    ...(opts.prefix ? { prefix: opts.prefix } : {}),
    ...(opts.pin !== undefined ? { pin: opts.pin } : {}),
    ...(opts.signal ? { signal: opts.signal } : {}),
  };
  if (opts.keepArchive === false) return { layer: await store.addDirectory(dir, add) };
  const archivesDir = path.join(envsDir(store.root), 'archives');
  await fsp.mkdir(archivesDir, { recursive: true });
  const tmp = path.join(archivesDir, `.pack-${process.pid}-${randomBytes(4).toString('hex')}.tar.zst`);
  try {
    const { bytes } = await packDirectory(dir, tmp, { compression: 'zstd' });
    const layer = await store.addArchive(tmp, { ...add, compression: 'zstd' });
    const final = archiveFileFor(store.root, layer.digest);
    // Same digest = same bytes: an existing archive is as good as ours.
    await fsp.rename(tmp, final);
    return { layer, archive: final, archiveBytes: bytes };
  } finally {
    await fsp.rm(tmp, { force: true });
  }
}
