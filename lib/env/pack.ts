/**
 * A directory becomes a store layer through its archive: pack to .tar.zst
 * (reproducible: sorted, numeric owner 0, mtimes kept), add the archive to the
 * store (its digest is the archive's sha256, so the same tree packed twice is
 * one layer), and keep the archive as envs/archives/<digest>.tar.zst: it is
 * what would be shipped to another machine, and what extract mode unpacks.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { packDirectory, type Layer, type LayerStore } from '../layers/index.js';
import { archiveFileFor, envsDir } from './manifest.js';

export interface PackedLayer {
  layer: Layer;
  /** Absolute archive path (kept), or undefined with keepArchive: false. */
  archive?: string;
  archiveBytes: number;
}

export async function packAsLayer(
  dir: string,
  store: LayerStore,
  opts: { name: string; prefix?: string; keepArchive?: boolean },
): Promise<PackedLayer> {
  const archivesDir = path.join(envsDir(store.root), 'archives');
  await fsp.mkdir(archivesDir, { recursive: true });
  const tmp = path.join(archivesDir, `.pack-${process.pid}-${randomBytes(4).toString('hex')}.tar.zst`);
  try {
    const { bytes } = await packDirectory(dir, tmp, { compression: 'zstd' });
    const layer = await store.addArchive(tmp, { name: opts.name, compression: 'zstd', ...(opts.prefix ? { prefix: opts.prefix } : {}) });
    if (opts.keepArchive === false) return { layer, archiveBytes: bytes };
    const final = archiveFileFor(store.root, layer.digest);
    // Same digest = same bytes: an existing archive is as good as ours.
    await fsp.rename(tmp, final);
    return { layer, archive: final, archiveBytes: bytes };
  } finally {
    await fsp.rm(tmp, { force: true });
  }
}
