/**
 * Image records over the layer store: import, pull, list, find, remove.
 *
 *   <store>/images/<config hex>.json   one record per image (ImageRecord)
 *   <store>/locks/images.lock          every change to images/ is made under it
 *
 * An image pins its layers (owner `image:<config hex>`), so `gc` keeps them
 * while the image exists and collects them once it is removed. While an
 * import runs, the layers it has stored are held by a pin of its own that
 * counts only while the importing process lives; on failure the layers it
 * built (and nobody else uses) are removed again, so a refused or broken
 * image leaves nothing behind.
 */
import { randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import path from 'node:path';
import { MinisandboxError, adopt, codeOf } from '../errors.js';
import { withLock } from '../files/lock.js';
import { selfStartTime } from '../files/proc.js';
import { openStore, type Layer, type LayerStore, type StoreOptions } from '../layers/index.js';
import { ImageError } from './errors.js';
import { openImageFiles, type ImageFiles } from './files.js';
import { listInRange, ownersMode, removeInRange, type Owners } from './owners.js';
import { compressionOfHead, readImagePlans, type ImagePlan, type ImageRunConfig } from './read.js';

export interface ImageRecord {
  version: 1;
  /** Hex sha256 of the config: the image's id. */
  id: string;
  configDigest: string;
  manifestDigest?: string;
  /** Names (tags, references) it is known by. */
  names: string[];
  /** diffIDs, bottom layer first ('sha256:<hex>'). */
  layers: string[];
  /** The config fields a sandbox applies. */
  config: ImageRunConfig;
  architecture?: string;
  os?: string;
  /** When the image was built (its config's `created`). */
  created?: string;
  /** When it was imported or pulled here. */
  imported: string;
  /** Apparent bytes of its layers' files. */
  size: number;
  /** Whose ids its files carry in the store (see owners.ts); 'squashed': every file is the caller's. */
  owners: Owners;
  /** Where it came from (file, directory or reference). */
  source: string;
}

export interface ImportProgress {
  /** The layer being stored (1-based) and how many the image has. */
  layer: number;
  layers: number;
  diffId: string;
  /** Bytes of this layer read so far, and its size (blob bytes). */
  done: number;
  total: number;
  /** The layer was already in the store: nothing to read. */
  cached?: boolean;
}

export interface ImportOptions {
  /** Names to record (instead of the archive's RepoTags / ref.name). */
  names?: string[];
  onProgress?: (p: ImportProgress) => void;
  signal?: AbortSignal;
}

export interface LayoutImportOptions extends ImportOptions {
  /** Where the layout came from, for the record (default: the directory). */
  source?: string;
}

/** The store with the remover image layers of an unprivileged caller's range need (see owners.ts). */
export function openImageStore(opts: StoreOptions = {}): Promise<LayerStore> {
  return openStore({ ...opts, ...(ownersMode().owners === 'range' ? { removeForeign: removeInRange, listForeign: listInRange } : {}) });
}


function imagesDir(store: LayerStore): string {
  return path.join(store.root, 'images');
}

function withImagesLock<T>(store: LayerStore, fn: () => Promise<T>): Promise<T> {
  return withLock(path.join(store.root, 'locks', 'images.lock'), fn, { what: `image records of ${store.root}` }).catch((err: unknown) => {
    throw adopt(err, ImageError);
  });
}

async function readRecord(file: string): Promise<ImageRecord | undefined> {
  try {
    return JSON.parse(await fsp.readFile(file, 'utf8')) as ImageRecord;
  } catch (err) {
    if (codeOf(err) === 'ENOENT') return undefined;
    throw new ImageError(`image record ${file}: ${(err as Error).message}`, { cause: err });
  }
}

async function writeRecord(store: LayerStore, rec: ImageRecord): Promise<void> {
  const dir = imagesDir(store);
  await fsp.mkdir(dir, { recursive: true });
  const tmp = path.join(dir, `.${rec.id}.${process.pid}.${randomBytes(4).toString('hex')}`);
  await fsp.writeFile(tmp, `${JSON.stringify(rec, null, 2)}\n`);
  await fsp.rename(tmp, path.join(dir, `${rec.id}.json`));
}

/** Every image in the store, by name then id. */
export async function listImages(store: LayerStore): Promise<ImageRecord[]> {
  const dir = imagesDir(store);
  const names = await fsp.readdir(dir).catch((err: unknown) => {
    if (codeOf(err) === 'ENOENT') return [] as string[];
    throw err;
  });
  const out: ImageRecord[] = [];
  for (const n of names.sort()) {
    const m = /^([0-9a-f]{64})\.json$/.exec(n);
    if (!m) continue;
    const rec = await readRecord(path.join(dir, n));
    if (rec) out.push(rec);
  }
  return out.sort((a, b) => ((a.names[0] ?? '~') + a.id < (b.names[0] ?? '~') + b.id ? -1 : 1));
}

/** A name without a tag or digest means `:latest`, as in Docker. */
function withTag(ref: string): string {
  const last = ref.slice(ref.lastIndexOf('/') + 1);
  return last.includes(':') || last.includes('@') ? ref : `${ref}:latest`;
}

/**
 * The image `ref` names: one of its names (`app` is `app:latest`), its id
 * or config digest (`sha256:…`), or a unique prefix of its id (at least 4
 * hex digits). Undefined if none; an ambiguous prefix is an error.
 */
export async function findImage(store: LayerStore, ref: string): Promise<ImageRecord | undefined> {
  const all = await listImages(store);
  const byName = all.find((r) => r.names.includes(ref) || r.names.includes(withTag(ref)));
  if (byName) return byName;
  const hex = ref.startsWith('sha256:') ? ref.slice(7) : ref;
  if (!/^[0-9a-f]{4,64}$/.test(hex)) return undefined;
  const hits = all.filter((r) => r.id.startsWith(hex));
  if (hits.length > 1) throw new ImageError(`image ${ref}: ambiguous, it begins the ids of ${hits.map((r) => r.id.slice(0, 12)).join(', ')}`);
  return hits[0];
}

/** As findImage, but an image that is not there is an error naming the ref. */
export async function getImage(store: LayerStore, ref: string): Promise<ImageRecord> {
  const rec = await findImage(store, ref);
  if (!rec) throw new ImageError(`image ${ref}: no such image in ${store.root} (see \`minisandbox image ls\`)`);
  return rec;
}

/** The store's layers of an image, top first (the order overlayfs and `root: { layers }` take). */
export async function imageLayers(store: LayerStore, rec: ImageRecord): Promise<Layer[]> {
  const out: Layer[] = [];
  for (const d of [...rec.layers].reverse()) {
    const layer = await store.get(d);
    if (!layer) throw new ImageError(`image ${rec.names[0] ?? rec.id.slice(0, 12)}: layer ${d} is missing from the store; import or pull the image again`);
    out.push(layer);
  }
  return out;
}

/**
 * Removes an image. A name of an image known by several names only drops
 * that name (as `docker rmi` of a tag does); otherwise the record goes and
 * the image's pin with it, so the next `gc` collects the layers no other
 * image, env or task uses. Returns what was done.
 */
export async function removeImage(store: LayerStore, ref: string): Promise<{ id: string; removed: 'name' | 'image' }> {
  return withImagesLock(store, async () => {
    const rec = await getImage(store, ref);
    const name = rec.names.includes(ref) ? ref : rec.names.includes(withTag(ref)) ? withTag(ref) : undefined;
    if (name !== undefined && rec.names.length > 1) {
      await writeRecord(store, { ...rec, names: rec.names.filter((n) => n !== name) });
      return { id: rec.id, removed: 'name' as const };
    }
    await fsp.rm(path.join(imagesDir(store), `${rec.id}.json`), { force: true });
    await store.unpin(`image:${rec.id}`);
    return { id: rec.id, removed: 'image' as const };
  });
}

/**
 * Imports a `docker save` archive or an OCI image layout (a directory or a
 * tar of one) into the store; returns the image records (a `docker save`
 * archive may hold several images).
 */
export async function importImage(store: LayerStore, source: string, opts: ImportOptions = {}): Promise<ImageRecord[]> {
  const files = await openImageFiles(source, () => scratchDir(store)).catch((err: unknown) => {
    throw adopt(err, ImageError);
  });
  try {
    const plans = await readImagePlans(files, opts.names ? { names: opts.names } : {}).catch((err: unknown) => {
      throw adopt(err, ImageError);
    });
    const out: ImageRecord[] = [];
    for (const plan of plans) out.push(await importPlan(store, files, plan, path.resolve(source), opts, false));
    return out;
  } finally {
    await files.close();
  }
}

/**
 * Imports the OCI layout `dir` (what a registry pull writes). Layer blobs
 * may be absent from it when the store already has their diffID (the pull
 * skipped them).
 */
export async function importLayout(store: LayerStore, dir: string, opts: LayoutImportOptions = {}): Promise<ImageRecord> {
  const files = await openImageFiles(dir, () => scratchDir(store)).catch((err: unknown) => {
    throw adopt(err, ImageError);
  });
  try {
    const plans = await readImagePlans(files, opts.names ? { names: opts.names } : {}).catch((err: unknown) => {
      throw adopt(err, ImageError);
    });
    if (plans.length !== 1) throw new ImageError(`image ${dir}: expected one image in the layout, found ${plans.length}`);
    return await importPlan(store, files, plans[0]!, opts.source ?? path.resolve(dir), opts, true);
  } finally {
    await files.close();
  }
}

async function scratchDir(store: LayerStore): Promise<string> {
  // Named as the store's staging dirs are (pid and start time): a crash
  // leaves it to gc, which removes the dirs of dead processes.
  const dir = path.join(store.root, 'staging', `image-import.${process.pid}-${selfStartTime()}.${randomBytes(4).toString('hex')}`);
  await fsp.mkdir(dir, { recursive: true, mode: 0o700 });
  return dir;
}

async function importPlan(store: LayerStore, files: ImageFiles, plan: ImagePlan, source: string, opts: ImportOptions, layersMayBeAbsent: boolean): Promise<ImageRecord> {
  const label = files.label;
  const mode = ownersMode();
  const work = `image-import:${plan.id}:${process.pid}:${randomBytes(4).toString('hex')}`;
  const built: string[] = [];
  const total = plan.layers.length;
  let size = 0;
  let owners: Owners = mode.owners;
  try {
    for (const [i, l] of plan.layers.entries()) {
      opts.signal?.throwIfAborted();
      const have = await store.get(l.diffId);
      const blobSize = await files.size(l.blob);
      let layer: Layer;
      if (have) {
        layer = await store.pin(work, [have.digest], { whileAlive: true, label: `import of ${plan.names[0] ?? plan.id.slice(0, 12)}` }).then(() => have);
        opts.onProgress?.({ layer: i + 1, layers: total, diffId: l.diffId, done: blobSize ?? 0, total: blobSize ?? 0, cached: true });
      } else {
        if (blobSize === undefined)
          throw new ImageError(`${label}: layer ${i + 1} of ${total} (${l.diffId}) is missing${layersMayBeAbsent ? ' from the layout and not in the store' : ` (no ${l.blob})`}`);
        const compression = compressionOfHead(await files.head(l.blob, 4));
        opts.onProgress?.({ layer: i + 1, layers: total, diffId: l.diffId, done: 0, total: blobSize });
        layer = await store.addImageLayer(
          {
            diffId: l.diffId,
            ...(l.blobDigest ? { blobDigest: l.blobDigest } : {}),
            bytes: blobSize,
            compression,
            open: () => files.open(l.blob),
            source: `${plan.names[0] ?? path.basename(source)} layer ${i + 1}/${total}`,
            owners: mode.owners,
            ...(mode.spawnTar ? { spawnTar: mode.spawnTar } : {}),
          },
          {
            pin: { owner: work, whileAlive: true, label: `import of ${plan.names[0] ?? plan.id.slice(0, 12)}` },
            ...(opts.signal ? { signal: opts.signal } : {}),
            onProgress: (p) => opts.onProgress?.({ layer: i + 1, layers: total, diffId: l.diffId, done: p.done, total: blobSize }),
          },
        );
        built.push(layer.digest);
      }
      size += layer.manifest.size;
      // A layer stored by another caller mode (e.g. before a range existed) keeps its owners: the image is as weak as its weakest layer.
      if (layer.manifest.owners === 'squashed') owners = 'squashed';
    }
    const rec: ImageRecord = {
      version: 1,
      id: plan.id,
      configDigest: `sha256:${plan.id}`,
      ...(plan.manifestDigest ? { manifestDigest: plan.manifestDigest } : {}),
      names: plan.names,
      layers: plan.layers.map((l) => `sha256:${l.diffId.replace(/^sha256:/, '')}`),
      config: pickRunConfig(plan.config.config),
      ...(plan.config.architecture ? { architecture: plan.config.architecture } : {}),
      ...(plan.config.os ? { os: plan.config.os } : {}),
      ...(plan.config.created ? { created: plan.config.created } : {}),
      imported: new Date().toISOString(),
      size,
      owners,
      source,
    };
    return await withImagesLock(store, async () => {
      await store.pin(`image:${plan.id}`, rec.layers, { label: `image ${rec.names[0] ?? plan.id.slice(0, 12)}` });
      const before = await readRecord(path.join(imagesDir(store), `${plan.id}.json`));
      const names = [...new Set([...(before?.names ?? []), ...rec.names])];
      // A name moves to the image imported under it, as a Docker tag does.
      for (const other of await listImages(store)) {
        if (other.id === plan.id || !other.names.some((n) => names.includes(n))) continue;
        await writeRecord(store, { ...other, names: other.names.filter((n) => !names.includes(n)) });
      }
      const final = { ...rec, names };
      await writeRecord(store, final);
      return final;
    });
  } catch (err) {
    await store.unpin(work).catch(() => undefined);
    // Layers this import stored and nobody else uses go again: a refused image leaves nothing.
    for (const d of built) await store.remove(d).catch(() => undefined);
    if (err instanceof Error && !(err instanceof MinisandboxError) && 'code' in err)
      throw new ImageError(`${label}: ${err.message}`, { cause: err }); // a system call's failure (EACCES, ENOSPC...)
    throw adopt(err, ImageError);
  } finally {
    await store.unpin(work).catch(() => undefined);
  }
}

function pickRunConfig(c: ImageRunConfig | undefined): ImageRunConfig {
  const out: ImageRunConfig = {};
  if (!c) return out;
  if (Array.isArray(c.Env)) out.Env = c.Env.filter((e) => typeof e === 'string');
  if (typeof c.WorkingDir === 'string' && c.WorkingDir !== '') out.WorkingDir = c.WorkingDir;
  if (typeof c.User === 'string' && c.User !== '') out.User = c.User;
  if (Array.isArray(c.Entrypoint)) out.Entrypoint = c.Entrypoint;
  if (Array.isArray(c.Cmd)) out.Cmd = c.Cmd;
  return out;
}

