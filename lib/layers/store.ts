import { createHash, randomBytes } from 'node:crypto';
import { promises as fsp } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { adopt, codeOf } from '../errors.js';
import type { Readable } from 'node:stream';
import { extractArchive, extractImageLayer, type Compression, type TarSpawner } from '../files/extract.js';
import type { FileDigest } from '../files/unpack.js';
import { removeTree, walkTree } from '../files/fsTree.js';
import { hashFile, sha256Hex } from '../files/hash.js';
import { acquireLock, tryLock, type FileLock } from '../files/lock.js';
import { processIsAlive, run, selfStartTime } from '../files/proc.js';
import { IoBudget, type BudgetOptions, type BudgetProgress } from './budget.js';
import { gcObjects, type DedupOptions, type DedupResult } from './dedup.js';
import { finishTree, finishTreeByWalks, treeListingInWorkers } from './finish.js';
import { LayerError } from './errors.js';
import { checkOwner, isLive, pinRequest, readPin, readPins, removePin, withPinsLock, writePin, type Pin, type PinOptions, type PinRequest } from './pins.js';
import { type PrefixFile } from './relocate.js';
import { LISTING_FILE, compareListings, listingText, type HashCache, type LayerProblem, type ListingEntry, type ListingResult } from './verify.js';

/**
 * Content-addressed store of read-only layer trees.
 *
 * Layout under the root (one filesystem, so renames are atomic and dedup
 * hard links work):
 *   layers/<sha256>/manifest.json   what the layer is (see LayerManifest)
 *   layers/<sha256>/listing.jsonl   the tree as built, for verify() (see verify.ts)
 *   layers/<sha256>/tree/           the read-only tree: mount this as lowerdir
 *   objects/ab/cdef…                dedup objects (hard-linked into trees)
 *   staging/                        unpacking in progress, and trash being deleted
 *   locks/<sha256>.lock             build-once flock per layer (never deleted:
 *                                   deleting a lock file someone waits on
 *                                   would let two processes hold "the" lock)
 *   locks/pins.lock                 every change to pins/ is made under it
 *   pins/<sha256 of owner>.json     who uses which layers (see pins.ts): gc
 *                                   keeps every layer a live pin names
 *   budget/                         cross-process I/O budget slots
 *
 * The manifest sits next to the tree, not in it, so the mounted layer shows
 * only the layer's own files.
 *
 * A layer becomes visible only by one rename of a finished staging directory,
 * so a crash never leaves a half layer under layers/. Nothing outside the root
 * is modified or deleted: digests are checked to be 64 hex characters before
 * they are used as names, and deletion is lstat-based and never follows a
 * symlink.
 */
export interface LayerManifest {
  version: 1;
  /** sha256 of the source archive, or of the canonical listing of a directory source. */
  digest: string;
  /** Apparent size of the regular files, bytes. */
  size: number;
  /** Regular files. */
  fileCount: number;
  /** All entries (files, directories, symlinks). */
  entryCount: number;
  /** Source name (archive or directory path, or the caller's name). */
  source: string;
  /** 'image-layer': a container image's layer, keyed by its diffID (see addImageLayer). */
  sourceKind: 'archive' | 'directory' | 'image-layer';
  /**
   * Image layers: whose ids the files carry. 'kept': the image's own (a root
   * caller); 'range': the image's shifted into the caller's subordinate
   * range, as its `ids: 'range'` sandboxes see them; 'squashed': all the
   * caller's (no range to keep them in).
   */
  owners?: 'kept' | 'range' | 'squashed';
  /** Absolute path the tree was built at (venv prefix), if given. */
  prefix?: string;
  /** Files embedding `prefix`, for relocateTree(). */
  prefixFiles?: PrefixFile[];
  /** ISO time the layer was created. */
  created: string;
  dedup?: DedupResult;
  /** sha256 of listing.jsonl, the tree as built; absent in layers built before it was recorded. */
  treeDigest?: string;
}

export interface Layer {
  digest: string;
  /** The read-only tree: what a sandbox mounts as an overlay lower dir. */
  path: string;
  /** The layer's directory in the store (holds manifest.json and tree/). */
  dir: string;
  manifest: LayerManifest;
}

export interface StoreOptions {
  /** Default: $XDG_CACHE_HOME/minisandbox/store or ~/.cache/minisandbox/store. */
  root?: string;
  /** Shared unpack budget; default one in <root>/budget with its defaults. false: none. */
  budget?: IoBudget | Omit<BudgetOptions, 'dir'> | false;
  /** Deduplicate files across layers (default true). */
  dedup?: boolean | DedupOptions;
  /** Max wait for another process building the same layer (default: forever). */
  lockTimeoutMs?: number;
  /**
   * Deletes a tree the caller cannot delete itself: an image layer whose
   * files belong to the caller's subordinate ids (owners 'range'), whose
   * directories the caller may not even open. Called with a path under the
   * store (a trash or staging directory) when the store's own removal fails
   * with EACCES or EPERM. The images room provides one that runs `rm -rf`
   * in an `ids: 'range'` sandbox.
   */
  removeForeign?: (dir: string) => Promise<void>;
  /**
   * The listing (see verify.ts) of such a tree, which the caller cannot
   * read itself: used to record and verify image layers stored with owners
   * 'range'. The images room provides one that reads the tree from an
   * `ids: 'range'` sandbox.
   */
  listForeign?: (tree: string) => Promise<ListingEntry[]>;
  /**
   * @internal How layers are finished: 'workers' (the default), 'reread'
   * (the workers, reading every file again instead of taking the content
   * hashes made during the unpack: what addArchive did before) or 'walks',
   * the reference path it replaced, kept for the store benchmark and the
   * tests that compare the two (lib/layers/finish.ts).
   */
  finish?: 'workers' | 'reread' | 'walks';
}

/** A container image layer for addImageLayer. */
export interface ImageLayerSource {
  /** sha256 of the uncompressed layer tar (the config's rootfs.diff_ids entry): the layer's name in the store. */
  diffId: string;
  /** sha256 of the bytes `open` gives, when known (an OCI blob digest): checked too. */
  blobDigest?: string;
  /** How many bytes `open` gives (budget and progress). */
  bytes: number;
  compression: Compression;
  /** Opens the layer's bytes; called at most once, only when the layer must be built. */
  open: () => Promise<Readable>;
  /** Source name recorded in the manifest. */
  source: string;
  /** 'kept' / 'range': tar restores the archive's owners (`spawnTar` runs it where that is allowed); 'squashed': it does not. */
  owners: 'kept' | 'range' | 'squashed';
  spawnTar?: TarSpawner;
}

export interface AddOptions {
  /** Source name recorded in the manifest (default: the path given). */
  name?: string;
  /** Absolute prefix the tree was built at: scanned for and recorded for relocation. */
  prefix?: string;
  /** Archive compression (default: from the file name). */
  compression?: Compression;
  /**
   * Add the layer to this owner's pin (made if there is none, with these
   * options; see pin()) before the layer's build lock is released, so that
   * no gc can take it between being built (or found) and being pinned.
   */
  pin?: PinRequest;
  onProgress?: (p: BudgetProgress) => void;
  signal?: AbortSignal;
}

export interface DiskUsage {
  layers: number;
  /** Sum of sizes of regular files, counting every name in every layer. */
  apparentBytes: number;
  /** Blocks actually used by the store (each inode once), bytes. */
  diskBytes: number;
  /** Blocks the layers would use without dedup (every entry of every layer counted per name). */
  undedupedDiskBytes: number;
  /** File blocks not stored twice thanks to dedup (per-name minus per-inode file blocks). */
  savedBytes: number;
  objects: number;
  /**
   * Directories not counted because this user may not list them: in an
   * unprivileged caller's image layers, directories only an image user
   * may read (apt's partial/); the figures leave out what they hold.
   */
  unreadableDirs: number;
}

export interface GcOptions {
  /** Layers to keep besides the pinned ones (e.g. mounted by sandboxes that no pin covers). */
  inUse?: Iterable<string>;
}

export interface GcResult {
  removedLayers: string[];
  /** Unpinned layers kept because someone held them at that moment (being pinned, removed or verified). */
  busyLayers: string[];
  /** Pins of work in progress (`whileAlive`) whose process is gone. */
  removedPins: number;
  removedObjects: number;
  removedStaging: number;
}

export interface LayerCheck {
  digest: string;
  source: string;
  /** 'ok': the tree is as built; 'mismatch': see problems; 'unverifiable': see reason. */
  status: 'ok' | 'mismatch' | 'unverifiable';
  /** Every difference found, in path order. */
  problems: LayerProblem[];
  /** Why the layer could not be checked. */
  reason?: string;
  /** Regular files in the tree now, and their bytes. */
  files: number;
  bytes: number;
}

const DIGEST = /^[0-9a-f]{64}$/;

export function defaultStoreRoot(): string {
  const cache = process.env.XDG_CACHE_HOME && path.isAbsolute(process.env.XDG_CACHE_HOME)
    ? process.env.XDG_CACHE_HOME
    : path.join(os.homedir(), '.cache');
  return path.join(cache, 'minisandbox', 'store');
}

/** Accepts "sha256:<hex>" or "<hex>"; refuses anything else, so it is always safe as a file name. */
export function normalizeDigest(digest: string): string {
  const d = digest.startsWith('sha256:') ? digest.slice(7) : digest;
  if (!DIGEST.test(d)) throw new LayerError(`layer digest ${JSON.stringify(digest)}: not a sha256 hex digest`);
  return d;
}

export async function openStore(opts: StoreOptions = {}): Promise<LayerStore> {
  const root = path.resolve(opts.root ?? defaultStoreRoot());
  for (const sub of ['layers', 'objects', 'staging', 'locks', 'pins']) await fsp.mkdir(path.join(root, sub), { recursive: true });
  let budget: IoBudget | undefined;
  if (opts.budget instanceof IoBudget) budget = opts.budget;
  else if (opts.budget !== false) budget = new IoBudget({ ...(opts.budget ?? {}), dir: path.join(root, 'budget') });
  const dedup = opts.dedup === false ? undefined : opts.dedup === true || opts.dedup === undefined ? {} : opts.dedup;
  return new LayerStore(root, budget, dedup, opts.lockTimeoutMs, opts.removeForeign, opts.listForeign, opts.finish ?? 'workers');
}

/** Fills the staging tree; may return the content of files it wrote (extractArchive's hashFiles), which finishing then need not read. */
type Builder = (tree: string, ticketProgress: (done: number) => void) => Promise<Map<string, FileDigest> | void>;

/** What a layer is built from: its digest, the bytes to unpack or copy, and its name in the manifest. */
interface LayerSource {
  digest: string;
  bytes: number;
  kind: 'archive' | 'directory' | 'image-layer';
  source: string;
  owners?: 'kept' | 'range' | 'squashed';
}

export class LayerStore {
  /** @internal use openStore() */
  constructor(
    readonly root: string,
    readonly budget: IoBudget | undefined,
    private readonly dedupOpts: DedupOptions | undefined,
    private readonly lockTimeoutMs: number | undefined,
    private readonly removeForeign?: (dir: string) => Promise<void>,
    private readonly listForeign?: (tree: string) => Promise<ListingEntry[]>,
    private readonly finish: 'workers' | 'reread' | 'walks' = 'workers',
  ) {}

  /** The listing of an image layer's tree, read where its owners' files can be read. */
  private async imageListing(tree: string, owners: string | undefined, cache?: HashCache): Promise<ListingResult> {
    if (owners !== 'range' || !this.listForeign) return treeListingInWorkers(tree, cache ? { cache } : {});
    return listingText(await this.listForeign(tree));
  }

  /** Delete a tree under the store, through removeForeign when the caller's own rights do not reach. */
  private async removeTree(dir: string): Promise<void> {
    try {
      await removeTree(dir);
    } catch (err) {
      const code = codeOf(err);
      if (!this.removeForeign || (code !== 'EACCES' && code !== 'EPERM')) throw err;
      await this.removeForeign(dir);
    }
  }

  private layerDir(d: string): string {
    return path.join(this.root, 'layers', d);
  }

  private lockFile(d: string): string {
    return path.join(this.root, 'locks', `${d}.lock`);
  }

  /** The build lock of layer `d` (every change to it is made under it); waits at most lockTimeoutMs. */
  private lockLayer(d: string, what: string, signal?: AbortSignal): Promise<FileLock> {
    return acquireLock(this.lockFile(d), {
      what,
      ...(this.lockTimeoutMs !== undefined ? { timeoutMs: this.lockTimeoutMs } : {}),
      ...(signal ? { signal } : {}),
    }).catch((err: unknown) => {
      throw adopt(err, LayerError);
    });
  }

  /** Add a .tar.zst / .tar.gz / .tar archive; its digest is the sha256 of the archive file. */
  async addArchive(archive: string, opts: AddOptions = {}): Promise<Layer> {
    const abs = path.resolve(archive);
    const st = await fsp.stat(abs).catch((err: unknown) => {
      throw new LayerError(`layer archive ${abs}: cannot read: ${(err as Error).message}`, { cause: err });
    });
    const digest = await hashFile(abs, st.size);
    return this.build({ digest, bytes: st.size, kind: 'archive', source: opts.name ?? abs }, opts, async (tree, progress) => {
      // The staging tree is this process's alone until it is published (no
      // sandbox sees it, nothing else writes it), so the content tar wrote
      // is the content finishing would read: it is hashed as it passes.
      const { digests } = await extractArchive(abs, tree, {
        ...(opts.compression ? { compression: opts.compression } : {}),
        ...(opts.signal ? { signal: opts.signal } : {}),
        hashFiles: this.finish === 'workers',
        onProgress: (done) => progress(done),
      });
      return digests;
    });
  }

  /** Add a directory (copied with cp -a); its digest is that of a canonical listing. */
  async addDirectory(dir: string, opts: AddOptions = {}): Promise<Layer> {
    const abs = path.resolve(dir);
    const st = await fsp.lstat(abs).catch(() => undefined);
    if (!st?.isDirectory()) throw new LayerError(`layer directory ${abs}: not a directory`);
    const { digest, bytes } = await digestDirectory(abs);
    return this.build({ digest, bytes, kind: 'directory', source: opts.name ?? abs }, opts, async (tree, progress) => {
      // cp -a keeps modes, mtimes (ns), symlinks as symlinks and hard links;
      // not ownership, for the same reason as tar's --no-same-owner.
      await run('cp', ['-a', '--no-preserve=ownership', `${abs}/.`, tree], { what: `layer directory ${abs}: copy` });
      progress(bytes);
    });
  }

  /**
   * Add a container image layer, keyed by its diffID, so a `docker save`
   * archive, an OCI layout and a registry pull of the same image share it.
   * The bytes are streamed through extractImageLayer (whiteouts in overlayfs
   * form, the archive's xattrs dropped, blob digest and diffID checked before
   * the layer is published; a mismatch leaves nothing). Unlike other layers,
   * an image layer keeps its modes exactly (what `ls -l` shows in Docker, it
   * shows in a sandbox; set-id bits excepted) and is not deduplicated: its
   * files may belong to several owners, which a shared inode could not have.
   */
  async addImageLayer(src: ImageLayerSource, opts: AddOptions = {}): Promise<Layer> {
    const digest = normalizeDigest(src.diffId);
    return this.build({ digest, bytes: src.bytes, kind: 'image-layer', source: src.source, owners: src.owners }, opts, async (tree, progress) => {
      await extractImageLayer(await src.open(), tree, {
        label: `layer sha256:${digest} (${src.source})`,
        compression: src.compression,
        expectDiffId: digest,
        ...(src.blobDigest ? { expectDigest: src.blobDigest } : {}),
        owners: src.owners === 'squashed' ? 'squash' : 'keep',
        ...(src.spawnTar ? { spawnTar: src.spawnTar } : {}),
        ...(opts.signal ? { signal: opts.signal } : {}),
        onProgress: (done) => progress(done),
      });
    });
  }

  private async build(src: LayerSource, opts: AddOptions, fill: Builder): Promise<Layer> {
    try {
      return await this.buildOnce(src, opts, fill);
    } catch (err) {
      // An archive refused, a lock not acquired, a copy failed: the store's error.
      throw adopt(err, LayerError);
    }
  }

  private async buildOnce(src: LayerSource, opts: AddOptions, fill: Builder): Promise<Layer> {
    const { digest, bytes, source } = src;
    if (opts.prefix !== undefined && !path.isAbsolute(opts.prefix))
      throw new LayerError(`layer ${source}: prefix ${opts.prefix} is not an absolute path`);
    const pin = opts.pin === undefined ? undefined : pinRequest(opts.pin);
    const existing = await this.get(digest);
    if (existing && !pin) return existing;

    // Build exactly once across processes: whoever gets the lock builds; the
    // others wait, then find the finished layer and reuse it.
    const lock = await this.lockLayer(digest, `layer ${digest} (${source})`, opts.signal);
    try {
      const built = await this.get(digest);
      if (built) {
        if (pin) await this.addToPin(pin.owner, [digest], pin);
        return built;
      }
      await this.removeStaleStaging(digest);
      const ticket = this.budget
        ? await this.budget.acquire(bytes, { label: `${digest.slice(0, 12)} ${path.basename(source)}`, ...(opts.signal ? { signal: opts.signal } : {}) })
        : undefined;
      const staging = path.join(this.root, 'staging', `${digest}.${process.pid}-${selfStartTime()}.${randomBytes(4).toString('hex')}`);
      try {
        const tree = path.join(staging, 'tree');
        await fsp.mkdir(tree, { recursive: true });
        const known = await fill(tree, (done) => {
          ticket?.progress(done);
          opts.onProgress?.({ label: digest, done, total: bytes });
        });
        const { manifest, listing } = await this.finishTree(tree, src, opts, known || undefined);
        await fsp.writeFile(path.join(staging, LISTING_FILE), listing, { mode: 0o444 });
        await fsp.writeFile(path.join(staging, 'manifest.json'), `${JSON.stringify(manifest, null, 2)}\n`, { mode: 0o444 });
        try {
          await fsp.rename(staging, this.layerDir(digest));
        } catch (err) {
          const code = codeOf(err);
          if (code !== 'ENOTEMPTY' && code !== 'EEXIST') throw err;
          // Built meanwhile without our lock (e.g. by another store root
          // sharing the layers dir): keep theirs, drop ours.
          await this.removeTree(staging);
        }
      } catch (err) {
        await this.removeTree(staging).catch(() => undefined);
        throw err;
      } finally {
        await ticket?.release();
      }
      const layer = await this.get(digest);
      if (!layer) throw new LayerError(`layer ${digest} (${source}): vanished right after it was built`);
      if (pin) await this.addToPin(pin.owner, [digest], pin);
      return layer;
    } finally {
      await lock.release();
    }
  }

  /** With the build locks of `digests` held: add them to `owner`'s pin, made if it has none. */
  private addToPin(owner: string, digests: string[], opts: PinOptions = {}): Promise<Pin> {
    return withPinsLock(this.root, async () => {
      const before = await readPin(this.root, owner);
      const had = before && isLive(before) ? before : undefined;
      const holder = had ? had.process : opts.whileAlive ? { pid: process.pid, startTime: selfStartTime() } : undefined;
      const pin: Pin = {
        owner,
        label: opts.label ?? had?.label ?? owner,
        digests: [...new Set([...(had?.digests ?? []), ...digests])].sort(),
        updated: new Date().toISOString(),
        ...(holder ? { process: holder } : {}),
      };
      await writePin(this.root, pin);
      return pin;
    });
  }

  /**
   * Adds `digests` to `owner`'s pin, making it if there is none (a pin may
   * name no layer yet), and returns the pin. gc keeps every layer a pin
   * names until its owner is unpinned. Each layer must be in the store: a
   * missing one (never built, or collected before it was pinned) is an
   * error naming it, and the pin is left as it was. `opts` apply to a new
   * pin (a label given replaces the old one).
   */
  async pin(owner: string, digests: Iterable<string>, opts: PinOptions = {}): Promise<Pin> {
    checkOwner(owner);
    const names = [...new Set([...digests].map(normalizeDigest))].sort();
    // The layers' build locks, in one order (no two pinners wait on each
    // other), held until the pin is written: gc cannot remove them meanwhile.
    const locks: FileLock[] = [];
    try {
      for (const d of names) locks.push(await this.lockLayer(d, `pin ${owner}: layer ${d}`));
      for (const d of names) if (!(await this.get(d))) throw new LayerError(`pin ${JSON.stringify(owner)}: layer ${d} is not in the store ${this.root}`);
      return await this.addToPin(owner, names, opts);
    } finally {
      for (const l of locks.reverse()) await l.release();
    }
  }

  /**
   * A pin of work in progress (it counts while this process lives) on
   * layers that are already in the store, for readers of them such as a
   * running sandbox: made under the pins lock alone, without the layers'
   * build locks that pin() takes (one lock instead of one per layer: this
   * is on the path of every sandbox start). It is safe all the same: gc
   * and remove() decide under the pins lock too, so a layer found here is
   * either kept by the pin or was already gone (an error naming it).
   * Dropped with unpin(owner).
   */
  async hold(owner: string, digests: Iterable<string>, opts: { label?: string } = {}): Promise<Pin> {
    checkOwner(owner);
    const names = [...new Set([...digests].map(normalizeDigest))].sort();
    return withPinsLock(this.root, async () => {
      for (const d of names) if (!(await this.get(d))) throw new LayerError(`hold ${JSON.stringify(owner)}: layer ${d} is not in the store ${this.root}`);
      const pin: Pin = { owner, label: opts.label ?? owner, digests: names, updated: new Date().toISOString(), process: { pid: process.pid, startTime: selfStartTime() } };
      await writePin(this.root, pin);
      return pin;
    });
  }

  /** Drops `owner`'s pin: its layers go at the next gc unless another pin keeps them. False if it had none. */
  async unpin(owner: string): Promise<boolean> {
    checkOwner(owner);
    return withPinsLock(this.root, () => removePin(this.root, owner));
  }

  /** Every pin that counts (pins of work in progress whose process is gone do not), by owner. */
  async pins(): Promise<Pin[]> {
    return (await readPins(this.root))
      .map((p) => p.pin)
      .filter(isLive)
      .sort((a, b) => (a.owner < b.owner ? -1 : a.owner > b.owner ? 1 : 0));
  }

  /** Scan, set final modes, dedup, count, list: everything before publishing (finish.ts). */
  private async finishTree(tree: string, src: LayerSource, opts: AddOptions, known?: Map<string, FileDigest>): Promise<{ manifest: LayerManifest; listing: string }> {
    if (src.kind === 'image-layer') {
      // Modes as the image has them and no dedup (see addImageLayer); the
      // tree is only ever mounted read-only, as a lower dir.
      const listing = await this.imageListing(tree, src.owners);
      return {
        manifest: {
          version: 1,
          digest: src.digest,
          size: listing.bytes,
          fileCount: listing.files,
          entryCount: listing.entries.length - 1,
          source: src.source,
          sourceKind: src.kind,
          ...(src.owners ? { owners: src.owners } : {}),
          created: new Date().toISOString(),
          treeDigest: sha256Hex(listing.text),
        },
        listing: listing.text,
      };
    }
    const how = {
      objectsDir: path.join(this.root, 'objects'),
      ...(this.dedupOpts ? { dedup: this.dedupOpts } : {}),
      ...(opts.prefix ? { prefix: opts.prefix } : {}),
      ...(known ? { known } : {}),
    };
    const { prefixFiles, dedup, counts, listing } = this.finish === 'walks' ? await finishTreeByWalks(tree, how) : await finishTree(tree, how);
    const manifest: LayerManifest = {
      version: 1,
      digest: src.digest,
      size: counts.bytes,
      fileCount: counts.files,
      entryCount: counts.entries,
      source: src.source,
      sourceKind: src.kind,
      ...(opts.prefix ? { prefix: opts.prefix, prefixFiles: prefixFiles ?? [] } : {}),
      created: new Date().toISOString(),
      ...(dedup ? { dedup } : {}),
      treeDigest: sha256Hex(listing),
    };
    return { manifest, listing };
  }

  /** Under the layer's lock, any staging dir for it belongs to a crashed builder. */
  private async removeStaleStaging(digest: string): Promise<void> {
    const dir = path.join(this.root, 'staging');
    for (const name of await fsp.readdir(dir)) if (name.startsWith(`${digest}.`)) await this.removeTree(path.join(dir, name));
  }

  async get(digest: string): Promise<Layer | undefined> {
    const d = normalizeDigest(digest);
    const dir = this.layerDir(d);
    let text: string;
    try {
      const st = await fsp.lstat(dir);
      if (!st.isDirectory()) return undefined;
      text = await fsp.readFile(path.join(dir, 'manifest.json'), 'utf8');
    } catch (err) {
      if (codeOf(err) === 'ENOENT' || codeOf(err) === 'ENOTDIR') return undefined;
      throw err;
    }
    let manifest: LayerManifest;
    try {
      manifest = JSON.parse(text) as LayerManifest;
    } catch (err) {
      throw new LayerError(`layer ${d}: manifest.json is not valid JSON`, { cause: err });
    }
    return { digest: d, dir, path: path.join(dir, 'tree'), manifest };
  }

  async list(): Promise<Layer[]> {
    const out: Layer[] = [];
    for (const name of (await fsp.readdir(path.join(this.root, 'layers'))).sort()) {
      if (!DIGEST.test(name)) continue;
      const layer = await this.get(name);
      if (layer) out.push(layer);
    }
    return out;
  }

  /**
   * Remove one layer. Returns false if it was not there; refuses a pinned
   * layer, naming its users. Takes the layer's build lock (which pinning
   * holds too: no pin can appear while this decides).
   */
  async remove(digest: string): Promise<boolean> {
    const d = normalizeDigest(digest);
    const lock = await this.lockLayer(d, `remove layer ${d}`);
    try {
      // Decided under the pins lock too, as gc does: hold() pins without the layer's lock.
      const trash = await withPinsLock(this.root, async () => {
        const users = (await this.pins()).filter((p) => p.digests.includes(d)).map((p) => p.label);
        if (users.length > 0) throw new LayerError(`remove layer ${d}: in use by ${users.join('; ')}; unpin it first`);
        return this.moveToTrash(d);
      });
      if (trash === undefined) return false;
      await this.removeTree(trash);
      return true;
    } finally {
      await lock.release();
    }
  }

  private async removeLocked(d: string): Promise<boolean> {
    const trash = await this.moveToTrash(d);
    if (trash === undefined) return false;
    await this.removeTree(trash);
    return true;
  }

  /** One rename makes the layer disappear atomically (deleted at leisure); undefined if it was not there. */
  private async moveToTrash(d: string): Promise<string | undefined> {
    const trash = path.join(this.root, 'staging', `trash-${d}.${process.pid}-${selfStartTime()}.${randomBytes(4).toString('hex')}`);
    try {
      // (A symlink planted at layers/<d> is moved and unlinked, never followed.)
      await fsp.rename(this.layerDir(d), trash);
      return trash;
    } catch (err) {
      if (codeOf(err) === 'ENOENT') return undefined;
      throw new LayerError(`remove layer ${d}: ${(err as Error).message}`, { cause: err });
    }
  }

  /**
   * Remove every layer no live pin names (and not in `inUse`), pins of work
   * in progress whose process died, staging dirs left by dead processes,
   * and dedup objects no layer links to any more. Runs under the pins lock,
   * so no pin changes while it decides; a layer someone holds right then (a
   * pin being made, a verify) is left for the next run.
   */
  async gc(opts: GcOptions = {}): Promise<GcResult> {
    const keep = new Set<string>([...(opts.inUse ?? [])].map(normalizeDigest));
    const result: GcResult = { removedLayers: [], busyLayers: [], removedPins: 0, removedObjects: 0, removedStaging: 0 };
    await withPinsLock(this.root, async () => {
      for (const { file, pin } of await readPins(this.root)) {
        if (isLive(pin)) for (const d of pin.digests) keep.add(d);
        else {
          await fsp.rm(file, { force: true });
          result.removedPins++;
        }
      }
      for (const name of (await fsp.readdir(path.join(this.root, 'layers'))).sort()) {
        if (!DIGEST.test(name) || keep.has(name)) continue;
        // Never wait here: whoever holds the lock may be waiting for the pins lock we hold.
        const lock = await tryLock(this.lockFile(name), { what: `gc layer ${name}` });
        if (!lock) {
          result.busyLayers.push(name);
          continue;
        }
        try {
          if (await this.removeLocked(name)) result.removedLayers.push(name);
        } finally {
          await lock.release();
        }
      }
    });
    const staging = path.join(this.root, 'staging');
    for (const name of await fsp.readdir(staging)) {
      const m = /\.(\d+)-(\d+)\.[0-9a-f]+$/.exec(name);
      if (m && processIsAlive(Number(m[1]), m[2]!)) continue;
      await this.removeTree(path.join(staging, name));
      result.removedStaging++;
    }
    result.removedObjects = (await gcObjects(path.join(this.root, 'objects'))).removed;
    return result;
  }

  /**
   * Re-hash each layer (or the named ones) and compare its tree with the
   * listing recorded when it was built: every file's content, size, mode and
   * mtime, every directory's mode, every symlink's target, nothing missing
   * and nothing added; and the manifest and listing themselves. Files shared
   * by dedup are read once. The trees are read in finishing's worker pool
   * (treeListingInWorkers), never from hashes made at build time: verify
   * trusts nothing but the bytes on disk now. Each layer is checked under its build lock, so a
   * concurrent remove waits and gc leaves it for its next run. Throws for a
   * named layer that is not in the store.
   */
  async verify(digests?: Iterable<string>): Promise<LayerCheck[]> {
    let names: string[];
    if (digests === undefined) names = (await fsp.readdir(path.join(this.root, 'layers'))).filter((n) => DIGEST.test(n)).sort();
    else {
      names = [...new Set([...digests].map(normalizeDigest))];
      for (const d of names) if (!(await this.get(d))) throw new LayerError(`verify: layer ${d} is not in the store ${this.root}`);
    }
    const cache: HashCache = new Map();
    const out: LayerCheck[] = [];
    for (const d of names) {
      const lock = await this.lockLayer(d, `verify layer ${d}`);
      try {
        const layer = await this.get(d);
        if (layer) out.push(await this.verifyLayer(layer, cache));
      } finally {
        await lock.release();
      }
    }
    return out;
  }

  private async verifyLayer(layer: Layer, cache: HashCache): Promise<LayerCheck> {
    const m = layer.manifest;
    const check: LayerCheck = { digest: layer.digest, source: String(m.source), status: 'ok', problems: [], files: 0, bytes: 0 };
    if (m.digest !== layer.digest)
      check.problems.push({ path: 'manifest.json', what: 'manifest', expected: layer.digest, actual: `says the layer's digest is ${JSON.stringify(m.digest)}, not its name` });
    if (typeof m.treeDigest !== 'string') {
      return {
        ...check,
        status: check.problems.length > 0 ? 'mismatch' : 'unverifiable',
        reason: 'no tree digest in manifest.json (built before listings were recorded): remove the layer and add it again to make it verifiable',
      };
    }
    let recorded: ListingEntry[] | undefined;
    let text: string | undefined;
    try {
      text = await fsp.readFile(path.join(layer.dir, LISTING_FILE), 'utf8');
    } catch (err) {
      check.problems.push({ path: LISTING_FILE, what: 'unreadable', actual: (err as Error).message });
    }
    if (text !== undefined) {
      const sha = sha256Hex(text);
      if (sha !== m.treeDigest) {
        check.problems.push({ path: LISTING_FILE, what: 'listing', expected: m.treeDigest, actual: `sha256 ${sha}, but manifest.json records ${m.treeDigest}` });
      } else {
        recorded = text.split('\n').filter(Boolean).map((l) => JSON.parse(l) as ListingEntry);
      }
    }
    const listed = m.sourceKind === 'image-layer' ? this.imageListing(layer.path, m.owners, cache) : treeListingInWorkers(layer.path, { cache });
    const now = await listed.catch((err: unknown) => {
      check.problems.push({ path: '.', what: 'unreadable', actual: (err as Error).message });
      return undefined;
    });
    if (now) {
      check.files = now.files;
      check.bytes = now.bytes;
      // Without a listing we trust, only the fact that it is bad can be said.
      if (recorded) check.problems.push(...compareListings(recorded, now.entries));
    }
    check.status = check.problems.length > 0 ? 'mismatch' : 'ok';
    return check;
  }

  /** Apparent size, real disk use (each inode once) and what dedup saves. */
  async du(): Promise<DiskUsage> {
    const usage: DiskUsage = { layers: 0, apparentBytes: 0, diskBytes: 0, undedupedDiskBytes: 0, savedBytes: 0, objects: 0, unreadableDirs: 0 };
    const unreadable = { onUnreadable: () => void usage.unreadableDirs++ };
    const seen = new Set<string>();
    const fileInodes = new Set<string>();
    let fileBlocksPerName = 0;
    let uniqueFileBlocks = 0;
    const count = (st: { dev: bigint; ino: bigint; blocks: bigint }) => {
      const id = `${st.dev}:${st.ino}`;
      if (seen.has(id)) return;
      seen.add(id);
      usage.diskBytes += Number(st.blocks) * 512;
    };
    for (const layer of await this.list()) {
      usage.layers++;
      for await (const e of walkTree(layer.path, '', unreadable)) {
        const blocks = Number(e.st.blocks) * 512;
        usage.undedupedDiskBytes += blocks;
        if (e.st.isFile()) {
          usage.apparentBytes += Number(e.st.size);
          fileBlocksPerName += blocks;
          const id = `${e.st.dev}:${e.st.ino}`;
          if (!fileInodes.has(id)) {
            fileInodes.add(id);
            uniqueFileBlocks += blocks;
          }
        }
        count(e.st);
      }
    }
    for await (const e of walkTree(path.join(this.root, 'objects'))) {
      if (e.st.isFile()) usage.objects++;
      count(e.st); // objects' inodes are the layers' inodes: counted once
    }
    // Saving = file blocks counted once per name minus once per inode. The
    // objects/ directories' own blocks are a real cost and stay in diskBytes.
    usage.savedBytes = fileBlocksPerName - uniqueFileBlocks;
    return usage;
  }
}

/**
 * Digest of a directory source: sha256 over a canonical listing, one line
 * per entry in byte order of path: type, permission bits, mtime (seconds),
 * size, and content sha256 or symlink target. mtime is included because it
 * is part of what a layer provides (.pyc validity).
 */
export async function digestDirectory(dir: string): Promise<{ digest: string; bytes: number }> {
  const h = createHash('sha256');
  let bytes = 0;
  for await (const e of walkTree(dir)) {
    const mode = (Number(e.st.mode) & 0o7777).toString(8);
    const mtime = (e.st.mtimeNs / 1_000_000_000n).toString();
    let type: string;
    let body: string;
    if (e.st.isFile()) {
      type = 'f';
      body = await hashFile(e.abs, Number(e.st.size));
      bytes += Number(e.st.size);
    } else if (e.st.isDirectory()) {
      type = 'd';
      body = '-';
    } else if (e.st.isSymbolicLink()) {
      type = 'l';
      body = JSON.stringify(await fsp.readlink(e.abs));
    } else {
      throw new LayerError(`layer directory ${dir}: ${e.rel} is not a file, directory or symlink`);
    }
    h.update(`${type} ${mode} ${mtime} ${e.st.isFile() ? e.st.size : 0} ${body} ${JSON.stringify(e.rel)}\n`);
  }
  return { digest: h.digest('hex'), bytes };
}
