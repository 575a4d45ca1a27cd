import { promises as fsp } from 'node:fs';
import { join } from 'node:path';
import { listImages, openImageStore, removeImage } from '../../lib/images/index.js';
import type { LayerStore } from '../../lib/layers/index.js';
import { tempDir } from '../helpers.js';

/** A fresh store in a temp dir, and its removal: images removed and gc'd first (an id range's layers need the images room's remover). */
export async function tempStore(): Promise<{ store: LayerStore; dir: string; remove(): Promise<void> }> {
  const t = tempDir('msbx-images-');
  const store = await openImageStore({ root: join(t.path, 'store'), budget: false });
  return {
    store,
    dir: t.path,
    remove: async () => {
      for (const r of await listImages(store)) await removeImage(store, r.id).catch(() => undefined);
      await store.gc().catch(() => undefined);
      t.remove();
    },
  };
}

/** Nothing of an image in the store: no layer, no record, no staging dir, no image pin. */
export async function storeIsEmpty(store: LayerStore): Promise<{ layers: number; images: number; staging: string[]; pins: number }> {
  return {
    layers: (await store.list()).length,
    images: (await listImages(store)).length,
    staging: await fsp.readdir(join(store.root, 'staging')),
    pins: (await store.pins()).length,
  };
}

export const EMPTY = { layers: 0, images: 0, staging: [], pins: 0 };
