/**
 * `image pull`'s download half: an image from a Registry API v2 registry
 * into an OCI image layout directory, every byte verified against its
 * digest while it streams, layers the caller already has left out. The
 * images room's importer (importLayout) reads that directory.
 *
 * Only sha256 is accepted anywhere a digest is read, so a digest can never
 * name a path outside `blobs/sha256/`.
 */
import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir, readdir, rename, rm, rmdir, stat, unlink, writeFile } from 'node:fs/promises';
import type http from 'node:http';
import path from 'node:path';
import { Transform, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { readBody, RegistryHttp, type Credentials } from './registry-http.js';
import { formatReference, parseReference, RegistryError, SHA256_DIGEST, type ImageReference } from './registry-ref.js';

export { RegistryError, parseReference, formatReference, type ImageReference } from './registry-ref.js';
export { isLoopback } from './registry-http.js';

export const MEDIA_TYPES = {
  ociIndex: 'application/vnd.oci.image.index.v1+json',
  dockerList: 'application/vnd.docker.distribution.manifest.list.v2+json',
  ociManifest: 'application/vnd.oci.image.manifest.v1+json',
  dockerManifest: 'application/vnd.docker.distribution.manifest.v2+json',
  ociConfig: 'application/vnd.oci.image.config.v1+json',
  dockerConfig: 'application/vnd.docker.container.image.v1+json',
} as const;

/** The layer blobs the importer can read: tar, gzip'd tar, zstd'd tar. */
export const LAYER_MEDIA_TYPES = new Set([
  'application/vnd.oci.image.layer.v1.tar',
  'application/vnd.oci.image.layer.v1.tar+gzip',
  'application/vnd.oci.image.layer.v1.tar+zstd',
  'application/vnd.docker.image.rootfs.diff.tar.gzip',
]);

const ACCEPT = [MEDIA_TYPES.ociIndex, MEDIA_TYPES.dockerList, MEDIA_TYPES.ociManifest, MEDIA_TYPES.dockerManifest].join(', ');
/** containerd's limit for a manifest: anything bigger is not a manifest. */
const MANIFEST_LIMIT = 4 << 20;
const CONFIG_LIMIT = 32 << 20;
/** Docker's layer media types and their OCI names (the same bytes). */
const OCI_LAYER_TYPE: Record<string, string> = {
  'application/vnd.docker.image.rootfs.diff.tar.gzip': 'application/vnd.oci.image.layer.v1.tar+gzip',
  'application/vnd.docker.image.rootfs.foreign.diff.tar.gzip': 'application/vnd.oci.image.layer.nondistributable.v1.tar+gzip',
};

/** The OCI manifest for a Docker schema 2 one: same config and layers, OCI media types. */
function ociManifestOf(m: { config: Descriptor; layers: Descriptor[] }): { mediaType: string; bytes: Buffer } {
  const d = (x: Descriptor, mediaType: string) => ({ mediaType, digest: x.digest, size: x.size });
  const oci = {
    schemaVersion: 2,
    mediaType: MEDIA_TYPES.ociManifest,
    config: d(m.config, MEDIA_TYPES.ociConfig),
    layers: m.layers.map((l) => d(l, OCI_LAYER_TYPE[l.mediaType] ?? l.mediaType)),
  };
  return { mediaType: MEDIA_TYPES.ociManifest, bytes: Buffer.from(JSON.stringify(oci)) };
}

/** Docker's default: three layers at a time. */
const PARALLEL_LAYERS = 3;
const DEFAULT_TIMEOUT_MS = 30_000;

export interface Platform {
  os: string;
  architecture: string;
  variant?: string;
}

export interface PullProgress {
  /** Layer bytes received so far, of `totalBytes` (the compressed sizes of the layers fetched). */
  bytes: number;
  totalBytes: number;
  /** Layers complete so far, of `totalLayers` (those fetched: the ones `have()` skips are not counted). */
  layers: number;
  totalLayers: number;
}

export interface PullOptions {
  /** The OCI layout to write: created if absent; on failure what the pull wrote is removed. */
  dir: string;
  /** Whether the caller already has the layer with this diffID (then its blob is not fetched). */
  have?: (diffId: string) => boolean | Promise<boolean>;
  /** Default: linux and this machine's architecture in OCI's terms (amd64, arm64...). */
  platform?: Platform;
  /** Plain HTTP, allowed only for a loopback registry. */
  insecure?: boolean;
  auth?: Credentials;
  onProgress?: (p: PullProgress) => void;
  signal?: AbortSignal;
  /** A request or body that sends nothing for this long fails (default 30 s). */
  timeoutMs?: number;
  /** Certificates (PEM) trusted besides Node's bundle, for a registry with its own CA. */
  ca?: string | Buffer;
}

export interface PulledLayer {
  /** The blob's digest (compressed, as the manifest names it). */
  digest: string;
  /** The uncompressed tar's digest (the config's rootfs.diff_ids, same index). */
  diffId: string;
  size: number;
  /** As the layout's manifest names it: OCI's name for a Docker layer type (same bytes). */
  mediaType: string;
  /** False when `have()` said the caller has it: its blob is not in the layout. */
  present: boolean;
}

export interface PullResult {
  dir: string;
  /**
   * The registry's image manifest digest (the platform's entry when the
   * reference names an index), kept in the layout as a blob. For a Docker
   * schema 2 manifest, index.json points at its OCI translation instead.
   */
  manifestDigest: string;
  /** The index or manifest list's digest, when the reference named one (Docker's RepoDigest). */
  indexDigest?: string;
  configDigest: string;
  config: unknown;
  /** Bottom layer first. */
  layers: PulledLayer[];
  reference: ImageReference;
}

/** Node's process.arch in OCI/Go terms. */
const GOARCH: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ia32: '386', ppc64: 'ppc64le', s390x: 's390x', riscv64: 'riscv64', loong64: 'loong64', mips: 'mips', mipsel: 'mipsle' };

export function defaultPlatform(): Platform {
  const architecture = GOARCH[process.arch] ?? process.arch;
  const armVersion = (process.config.variables as Record<string, unknown>).arm_version;
  return architecture === 'arm' && armVersion ? { os: 'linux', architecture, variant: `v${String(armVersion)}` } : { os: 'linux', architecture };
}

function platformText(p: Partial<Platform>): string {
  return [p.os ?? '?', p.architecture ?? '?', p.variant].filter(Boolean).join('/');
}

function platformMatches(p: Partial<Platform> | undefined, want: Platform): boolean {
  if (!p || p.os !== want.os || p.architecture !== want.architecture) return false;
  // arm64's variant is v8 or unset; a variant is compared only when both sides name one.
  return want.variant === undefined || p.variant === undefined || p.variant === want.variant;
}

interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
  platform?: Partial<Platform>;
  urls?: unknown;
}

/** Writes into the layout, and undoes them if the pull fails. */
class LayoutWriter {
  readonly blobs: string;
  #written: string[] = [];
  #createdDirs: string[] = [];

  constructor(readonly dir: string) {
    this.blobs = path.join(dir, 'blobs', 'sha256');
  }

  async open(): Promise<void> {
    for (const d of [this.dir, path.join(this.dir, 'blobs'), this.blobs]) {
      const existed = await stat(d).then((s) => s.isDirectory(), () => false);
      if (!existed) {
        await mkdir(d);
        this.#createdDirs.unshift(d);
      }
    }
  }

  blobPath(digest: string): string {
    if (!SHA256_DIGEST.test(digest)) throw new Error(`not a sha256 digest: ${digest}`);
    return path.join(this.blobs, digest.slice('sha256:'.length));
  }

  /** A temporary name next to `file`, renamed into place once verified. */
  partial(file: string): string {
    const p = `${file}.partial-${randomBytes(6).toString('hex')}`;
    this.#written.push(p);
    return p;
  }

  async put(file: string, data: Buffer | string): Promise<void> {
    const tmp = this.partial(file);
    await writeFile(tmp, data, { mode: 0o644 });
    await this.publish(tmp, file);
  }

  async publish(tmp: string, file: string): Promise<void> {
    await rename(tmp, file);
    this.#written.push(file);
  }

  async undo(): Promise<void> {
    for (const f of this.#written) await unlink(f).catch(() => undefined);
    if (this.#createdDirs.length === 3) {
      // The whole directory is ours: remove it even if something else landed in it meanwhile.
      await rm(this.dir, { recursive: true, force: true });
      return;
    }
    for (const d of this.#createdDirs) {
      if ((await readdir(d).catch(() => ['?'])).length === 0) await rmdir(d).catch(() => undefined);
    }
  }
}

/**
 * Pull `ref` into the OCI image layout `opts.dir`: its manifest (for
 * `opts.platform` when the reference names an index), config, and the
 * layer blobs whose diffIDs `opts.have` does not claim. Every blob and
 * manifest is checked against its digest before it is kept; on any
 * failure, abort included, what this call wrote is removed and a
 * RegistryError names the registry, the repository and the reason.
 */
export async function pullToLayout(ref: string, opts: PullOptions): Promise<PullResult> {
  const reference = parseReference(ref);
  const label = `pull ${formatReference(reference)}`;
  const want = opts.platform ?? defaultPlatform();
  // Stops the other downloads when one fails, so the failure is reported without waiting for them.
  const stop = new AbortController();
  const signal = opts.signal ? AbortSignal.any([opts.signal, stop.signal]) : stop.signal;
  const client = new RegistryHttp(label, reference.registry, reference.repository, {
    timeoutMs: opts.timeoutMs ?? DEFAULT_TIMEOUT_MS,
    ...(opts.insecure ? { insecure: true } : {}),
    ...(opts.auth ? { auth: opts.auth } : {}),
    ...(opts.ca ? { ca: opts.ca } : {}),
    signal,
  });
  const layout = new LayoutWriter(path.resolve(opts.dir));
  try {
    await layout.open();
    return await pull(client, reference, want, layout, opts, () => stop.abort());
  } catch (err) {
    await layout.undo();
    if (opts.signal?.aborted && !(err instanceof RegistryError && err.message.endsWith(': aborted'))) throw client.aborted(opts.signal);
    if (err instanceof RegistryError) throw err;
    throw client.error(err instanceof Error ? err.message : String(err), { cause: err });
  } finally {
    client.close();
  }
}

async function pull(
  client: RegistryHttp,
  reference: ImageReference,
  want: Platform,
  layout: LayoutWriter,
  opts: PullOptions,
  stopOthers: () => void,
): Promise<PullResult> {
  const top = await fetchManifest(client, reference.digest ?? reference.tag!, reference.digest);
  let chosen = top;
  let indexDigest: string | undefined;
  if (top.kind === 'index') {
    indexDigest = top.digest;
    const entries = ((top.json as { manifests?: unknown }).manifests ?? []) as Descriptor[];
    if (!Array.isArray(entries)) throw client.error(`manifest ${top.digest}: an index without a manifests list`);
    // BuildKit lists attestations as platform unknown/unknown: they are not images.
    const images = entries.filter((d) => d?.platform?.os !== 'unknown');
    const entry = images.find((d) => platformMatches(d.platform, want));
    if (!entry) {
      const present = images.map((d) => platformText(d.platform ?? {}));
      throw client.error(`no image for ${platformText(want)} in the index; it has ${present.length > 0 ? present.join(', ') : 'no platform images'}`);
    }
    checkDescriptor(client, entry, 'the index entry');
    chosen = await fetchManifest(client, entry.digest, entry.digest);
    if (chosen.kind !== 'manifest') throw client.error(`manifest ${entry.digest} (for ${platformText(want)}): an index inside an index is not supported`);
  }

  const manifest = chosen.json as { config?: Descriptor; layers?: Descriptor[] };
  if (!manifest.config || !Array.isArray(manifest.layers)) throw client.error(`manifest ${chosen.digest}: no config or layers`);
  checkDescriptor(client, manifest.config, 'the config descriptor');
  manifest.layers.forEach((d, i) => checkDescriptor(client, d, `layer ${i}`));
  if (manifest.config.size > CONFIG_LIMIT) throw client.error(`config ${manifest.config.digest}: ${manifest.config.size} bytes is more than a config can be (${CONFIG_LIMIT})`);

  const configBytes = await fetchSmallBlob(client, manifest.config, 'config');
  let config: { os?: string; architecture?: string; variant?: string; rootfs?: { type?: string; diff_ids?: unknown } };
  try {
    config = JSON.parse(configBytes.toString('utf8')) as typeof config;
  } catch (err) {
    throw client.error(`config ${manifest.config.digest}: not JSON (${(err as Error).message})`);
  }
  if (!platformMatches(config as Partial<Platform>, want)) {
    throw client.error(`the image is for ${platformText(config as Partial<Platform>)}, not ${platformText(want)}`);
  }
  const diffIds = config.rootfs?.diff_ids;
  if (config.rootfs?.type !== 'layers' || !Array.isArray(diffIds) || !diffIds.every((d) => typeof d === 'string' && SHA256_DIGEST.test(d))) {
    throw client.error(`config ${manifest.config.digest}: rootfs is not a list of sha256 diff_ids`);
  }
  if (diffIds.length !== manifest.layers.length) {
    throw client.error(`manifest ${chosen.digest} has ${manifest.layers.length} layers but its config lists ${diffIds.length} diff_ids`);
  }

  const layers: PulledLayer[] = [];
  for (const [i, d] of manifest.layers.entries()) {
    const diffId = diffIds[i] as string;
    const have = opts.have ? await opts.have(diffId) : false;
    if (!have && !LAYER_MEDIA_TYPES.has(d.mediaType)) {
      throw client.error(`layer ${i} (${d.digest}) has media type ${d.mediaType}, which cannot be imported (${[...LAYER_MEDIA_TYPES].join(', ')})`);
    }
    layers.push({ digest: d.digest, diffId, size: d.size, mediaType: d.mediaType, present: !have });
  }

  // One download per blob, even if the manifest repeats a layer.
  const toFetch = [...new Map(layers.filter((l) => l.present).map((l) => [l.digest, l])).values()];
  const progress: PullProgress = { bytes: 0, totalBytes: toFetch.reduce((n, l) => n + l.size, 0), layers: 0, totalLayers: toFetch.length };
  const report = () => opts.onProgress?.({ ...progress });
  report();
  await inParallel(toFetch, PARALLEL_LAYERS, async (l) => {
    await fetchBlobToFile(client, l, layout, (n) => {
      progress.bytes += n;
      report();
    });
    progress.layers += 1;
    report();
  }, stopOthers);

  // Downloads that finished as the abort came would otherwise let the pull complete.
  if (opts.signal?.aborted) throw client.aborted(opts.signal);
  await layout.put(layout.blobPath(manifest.config.digest), configBytes);
  await layout.put(layout.blobPath(chosen.digest), chosen.bytes);
  // OCI tools (skopeo, umoci) read only OCI manifests from a layout, so a
  // Docker schema 2 manifest is rewritten as the OCI one skopeo would make:
  // the config and layer blobs, and so their digests, are the same bytes.
  // The registry's manifest stays in the layout too, and is what
  // manifestDigest names.
  const entry = chosen.mediaType === MEDIA_TYPES.dockerManifest ? ociManifestOf(manifest as Required<typeof manifest>) : { mediaType: chosen.mediaType, bytes: chosen.bytes };
  const entryDigest = `sha256:${createHash('sha256').update(entry.bytes).digest('hex')}`;
  if (entryDigest !== chosen.digest) await layout.put(layout.blobPath(entryDigest), entry.bytes);
  for (const l of layers) l.mediaType = OCI_LAYER_TYPE[l.mediaType] ?? l.mediaType;
  const platform: Platform = { os: config.os!, architecture: config.architecture!, ...(config.variant ? { variant: config.variant } : {}) };
  const index = {
    schemaVersion: 2,
    mediaType: MEDIA_TYPES.ociIndex,
    manifests: [
      {
        mediaType: entry.mediaType,
        digest: entryDigest,
        size: entry.bytes.length,
        platform,
        ...(reference.tag !== undefined ? { annotations: { 'org.opencontainers.image.ref.name': reference.tag } } : {}),
      },
    ],
  };
  await layout.put(path.join(layout.dir, 'oci-layout'), `${JSON.stringify({ imageLayoutVersion: '1.0.0' })}\n`);
  await layout.put(path.join(layout.dir, 'index.json'), `${JSON.stringify(index, null, 2)}\n`);

  return {
    dir: layout.dir,
    manifestDigest: chosen.digest,
    ...(indexDigest !== undefined ? { indexDigest } : {}),
    configDigest: manifest.config.digest,
    config,
    layers,
    reference,
  };
}

function checkDescriptor(client: RegistryHttp, d: Descriptor, what: string): void {
  if (typeof d !== 'object' || d === null) throw client.error(`${what}: not a descriptor`);
  if (typeof d.digest !== 'string' || !SHA256_DIGEST.test(d.digest)) {
    throw client.error(`${what}: digest ${JSON.stringify(d.digest)} is not sha256:<64 hex digits> (only sha256 is supported)`);
  }
  if (!Number.isSafeInteger(d.size) || d.size < 0) throw client.error(`${what} ${d.digest}: size ${JSON.stringify(d.size)} is not a byte count`);
  if (typeof d.mediaType !== 'string') throw client.error(`${what} ${d.digest}: no mediaType`);
}

interface FetchedManifest {
  kind: 'index' | 'manifest';
  mediaType: string;
  digest: string;
  bytes: Buffer;
  json: unknown;
}

/**
 * GET a manifest and verify it: against `pinned` when the reference or an
 * index names its digest, else against Docker-Content-Digest when sent.
 */
async function fetchManifest(client: RegistryHttp, tagOrDigest: string, pinned: string | undefined): Promise<FetchedManifest> {
  const what = `manifest ${tagOrDigest}`;
  const res = await client.get(`manifests/${tagOrDigest}`, { accept: ACCEPT }, what);
  const bytes = await readBody(res, MANIFEST_LIMIT, what).catch((err: Error) => {
    throw client.error(`${what}: ${err.message}`, { cause: err });
  });
  const digest = `sha256:${createHash('sha256').update(bytes).digest('hex')}`;
  const announced = headerOf(res, 'docker-content-digest');
  if (pinned !== undefined && digest !== pinned) throw client.error(`${what}: the registry sent a manifest whose digest is ${digest}`);
  if (pinned === undefined && announced?.startsWith('sha256:') && announced !== digest) {
    throw client.error(`${what}: the registry sent a manifest whose digest is ${digest}, not the ${announced} it announced (Docker-Content-Digest)`);
  }
  let json: Record<string, unknown>;
  try {
    json = JSON.parse(bytes.toString('utf8')) as Record<string, unknown>;
  } catch (err) {
    throw client.error(`${what}: not JSON (${(err as Error).message})`);
  }
  if (json.schemaVersion === 1) throw client.error(`${what}: Docker schema 1 manifests are not supported (the image needs re-pushing with a current client)`);
  const contentType = headerOf(res, 'content-type')?.split(';')[0]!.trim();
  const mediaType =
    typeof json.mediaType === 'string' ? json.mediaType : Array.isArray(json.manifests) ? MEDIA_TYPES.ociIndex : json.config ? MEDIA_TYPES.ociManifest : (contentType ?? '');
  if (mediaType === MEDIA_TYPES.ociIndex || mediaType === MEDIA_TYPES.dockerList) return { kind: 'index', mediaType, digest, bytes, json };
  if (mediaType === MEDIA_TYPES.ociManifest || mediaType === MEDIA_TYPES.dockerManifest) return { kind: 'manifest', mediaType, digest, bytes, json };
  throw client.error(`${what}: media type ${JSON.stringify(mediaType)} is not an image manifest or index`);
}

function headerOf(res: http.IncomingMessage, name: string): string | undefined {
  const v = res.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

/** A blob small enough to hold (the config), verified. */
async function fetchSmallBlob(client: RegistryHttp, d: Descriptor, what: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  await streamBlob(client, d, `${what} ${d.digest}`, () => undefined, (c) => chunks.push(c));
  return Buffer.concat(chunks);
}

/** A layer blob into the layout, by way of a temporary file renamed once verified. */
async function fetchBlobToFile(client: RegistryHttp, l: PulledLayer, layout: LayoutWriter, onBytes: (n: number) => void): Promise<void> {
  const file = layout.blobPath(l.digest);
  const tmp = layout.partial(file);
  await streamBlob(client, l, `layer ${l.digest}`, onBytes, undefined, tmp);
  await layout.publish(tmp, file);
}

/**
 * GET a blob and pass its bytes through a sha256 and size check (and an
 * idle watchdog) to `sink` or into `file`; any mismatch fails before the
 * caller keeps anything.
 */
async function streamBlob(
  client: RegistryHttp,
  d: Descriptor,
  what: string,
  onBytes: (n: number) => void,
  sink?: (chunk: Buffer) => void,
  file?: string,
): Promise<void> {
  const res = await client.get(`blobs/${d.digest}`, {}, what);
  const length = headerOf(res, 'content-length');
  if (length !== undefined && Number(length) !== d.size) {
    res.resume();
    throw client.error(`${what}: the registry sends ${length} bytes, the manifest says ${d.size}`);
  }
  const hash = createHash('sha256');
  let received = 0;
  const timeoutMs = client.opts.timeoutMs;
  let idle: NodeJS.Timeout | undefined;
  const watch = () => {
    clearTimeout(idle);
    idle = setTimeout(() => res.destroy(client.error(`${what}: the registry sent nothing for ${timeoutMs / 1000} s (after ${received} of ${d.size} bytes)`)), timeoutMs);
  };
  const check = new Transform({
    transform(chunk: Buffer, _enc, done) {
      received += chunk.length;
      if (received > d.size) return done(client.error(`${what}: the registry sent more than the ${d.size} bytes the manifest says`));
      hash.update(chunk);
      watch();
      onBytes(chunk.length);
      done(null, chunk);
    },
    flush(done) {
      if (received !== d.size) return done(client.error(`${what}: the registry sent ${received} bytes, the manifest says ${d.size}`));
      const digest = `sha256:${hash.digest('hex')}`;
      if (digest !== d.digest) return done(client.error(`${what}: digest mismatch: the registry sent bytes whose sha256 is ${digest}`));
      done();
    },
  });
  watch();
  try {
    const signal = client.opts.signal;
    const out = file
      ? createWriteStream(file, { flags: 'wx', mode: 0o644 })
      : new Writable({
          write(chunk: Buffer, _enc, done) {
            sink!(chunk);
            done();
          },
        });
    await (signal ? pipeline(res, check, out, { signal }) : pipeline(res, check, out));
  } catch (err) {
    if (err instanceof RegistryError) throw err;
    throw client.error(`${what}: ${(err as Error).message}`, { cause: err });
  } finally {
    clearTimeout(idle);
  }
}

/** Run `fn` over `items`, at most `n` at once; the first failure stops new starts and is thrown once all running ones settle. */
async function inParallel<T>(items: T[], n: number, fn: (item: T) => Promise<void>, onFailure: () => void): Promise<void> {
  let next = 0;
  let failure: { err: unknown } | undefined;
  const worker = async () => {
    while (!failure && next < items.length) {
      const item = items[next++]!;
      try {
        await fn(item);
      } catch (err) {
        if (!failure) {
          failure = { err };
          onFailure();
        }
      }
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
  if (failure) throw failure.err;
}
