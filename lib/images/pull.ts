/**
 * `image pull`: the registry client writes an OCI layout (fetching only the
 * layers whose diffID the store lacks), which is then imported like any
 * layout. The layout is a scratch directory in the store's staging area,
 * removed afterwards whatever happens.
 */
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { adopt } from '../errors.js';
import { removeTree } from '../files/fsTree.js';
import { selfStartTime } from '../files/proc.js';
import type { LayerStore } from '../layers/index.js';
import { ImageError } from './errors.js';
import { importLayout, type ImageRecord, type ImportProgress } from './images.js';
import { formatReference, parseReference, pullToLayout, type PullOptions, type PullProgress } from './registry.js';

export interface PullImageOptions extends Omit<PullOptions, 'dir' | 'have' | 'onProgress'> {
  /** Names to record besides the reference. */
  names?: string[];
  /** Download progress (bytes and layers fetched). */
  onProgress?: (p: PullProgress) => void;
  /** Unpack progress, per layer, as for importImage. */
  onImportProgress?: (p: ImportProgress) => void;
}

export async function pullImage(store: LayerStore, ref: string, opts: PullImageOptions = {}): Promise<ImageRecord> {
  const { names, onProgress, onImportProgress, ...pull } = opts;
  let canonical: string;
  try {
    canonical = formatReference(parseReference(ref));
  } catch (err) {
    throw adopt(err, ImageError);
  }
  const dir = path.join(store.root, 'staging', `image-pull.${process.pid}-${selfStartTime()}.${randomBytes(4).toString('hex')}`);
  try {
    await pullToLayout(ref, {
      ...pull,
      dir,
      have: async (diffId) => (await store.get(diffId)) !== undefined,
      ...(onProgress ? { onProgress } : {}),
    }).catch((err: unknown) => {
      throw adopt(err, ImageError);
    });
    return await importLayout(store, dir, {
      names: [...new Set([ref, ...(names ?? [])])],
      source: canonical,
      ...(onImportProgress ? { onProgress: onImportProgress } : {}),
      ...(pull.signal ? { signal: pull.signal } : {}),
    });
  } finally {
    await removeTree(dir).catch(() => undefined);
  }
}
