/**
 * Reading an image source into what import needs: the config (its bytes,
 * checked against its digest), the manifest's digest, the names, and each
 * layer's blob with its expected digests. Two formats:
 *
 *  - `docker save`: manifest.json lists, per image, the config file, the
 *    RepoTags and the layer tars (plain or compressed), bottom first. The
 *    config's name is its sha256 (`<hex>.json` or `blobs/sha256/<hex>`); a
 *    layer is known by the diffID the config gives for its position.
 *  - an OCI image layout: index.json → a manifest, or an index of them (a
 *    multi-platform image: the linux/<this machine> one is chosen) →
 *    config → layers, every blob named by its digest.
 *
 * Every digest is checked before the bytes are used: the index's
 * manifests and the config here (sha256 of the bytes read), layers as they
 * are unpacked (blob digest for OCI, diffID for both; see the store).
 */
import { createHash } from 'node:crypto';
import type { Compression } from '../files/extract.js';
import { ImageError } from './errors.js';
import type { ImageFiles } from './files.js';

/** The config fields a sandbox applies (Docker's names). */
export interface ImageRunConfig {
  Env?: string[];
  WorkingDir?: string;
  User?: string;
  Entrypoint?: string[] | null;
  Cmd?: string[] | null;
}

export interface ImageConfig {
  architecture?: string;
  os?: string;
  variant?: string;
  created?: string;
  config?: ImageRunConfig;
  rootfs?: { type?: string; diff_ids?: string[] };
}

export interface LayerPlan {
  /** 'sha256:<hex>' of the uncompressed tar. */
  diffId: string;
  /** Name of the blob in the source. */
  blob: string;
  /** OCI: the blob's digest from the manifest ('sha256:<hex>'). */
  blobDigest?: string;
  /** OCI: the media type (compression), for messages; the bytes' magic decides. */
  mediaType?: string;
}

export interface ImagePlan {
  /** Hex sha256 of the config: the image's id. */
  id: string;
  config: ImageConfig;
  configBytes: Buffer;
  /** 'sha256:<hex>' of the manifest (OCI). */
  manifestDigest?: string;
  names: string[];
  layers: LayerPlan[];
}

const HEX = /^[0-9a-f]{64}$/;

export function sha256(b: Buffer): string {
  return createHash('sha256').update(b).digest('hex');
}

function parseJson<T>(label: string, what: string, bytes: Buffer): T {
  try {
    return JSON.parse(bytes.toString('utf8')) as T;
  } catch (err) {
    throw new ImageError(`${label}: ${what} is not valid JSON (${(err as Error).message})`, { cause: err });
  }
}

/** 'sha256:<hex>' → hex; anything else is refused (names in blobs/ are built from it). */
function digestHex(label: string, what: string, d: unknown): string {
  if (typeof d !== 'string' || !d.startsWith('sha256:') || !HEX.test(d.slice(7)))
    throw new ImageError(`${label}: ${what} has digest ${JSON.stringify(d)}, not a sha256 digest`);
  return d.slice(7);
}

/** The platform images are chosen for: linux and this machine's architecture, in OCI's names. */
export function hostPlatform(): { os: string; architecture: string } {
  const arch: Record<string, string> = { x64: 'amd64', arm64: 'arm64', arm: 'arm', ia32: '386', ppc64: 'ppc64le', s390x: 's390x', riscv64: 'riscv64' };
  return { os: 'linux', architecture: arch[process.arch] ?? process.arch };
}

/** A config, checked: its digest, rootfs.diff_ids, and that it runs here. */
function checkConfig(label: string, id: string, bytes: Buffer, layerCount: number): ImageConfig {
  const got = sha256(bytes);
  if (got !== id) throw new ImageError(`${label}: config sha256:${id} has sha256 ${got}: it was altered or damaged`);
  const config = parseJson<ImageConfig>(label, `config sha256:${id}`, bytes);
  if (typeof config !== 'object' || config === null) throw new ImageError(`${label}: config sha256:${id} is not a JSON object`);
  const diffIds = config.rootfs?.diff_ids;
  if (!Array.isArray(diffIds)) throw new ImageError(`${label}: config sha256:${id} has no rootfs.diff_ids`);
  if (diffIds.length !== layerCount)
    throw new ImageError(`${label}: config sha256:${id} lists ${diffIds.length} layer diffIDs but the manifest has ${layerCount} layers`);
  for (const d of diffIds) digestHex(label, `config sha256:${id} rootfs.diff_ids entry`, d);
  const host = hostPlatform();
  if ((config.os ?? 'linux') !== 'linux' || (config.architecture !== undefined && config.architecture !== host.architecture))
    throw new ImageError(`${label}: image sha256:${id} is for ${config.os ?? '?'}/${config.architecture ?? '?'}, and this machine is ${host.os}/${host.architecture}`);
  return config;
}

interface DockerManifestEntry {
  Config?: string;
  RepoTags?: string[] | null;
  Layers?: string[];
}

interface Descriptor {
  mediaType?: string;
  digest?: string;
  size?: number;
  platform?: { os?: string; architecture?: string; variant?: string };
  annotations?: Record<string, string>;
}

interface OciIndex {
  schemaVersion?: number;
  mediaType?: string;
  manifests?: Descriptor[];
}

interface OciManifest {
  mediaType?: string;
  config?: Descriptor;
  layers?: Descriptor[];
  manifests?: Descriptor[];
}

const INDEX_TYPES = new Set(['application/vnd.oci.image.index.v1+json', 'application/vnd.docker.distribution.manifest.list.v2+json']);

/** The images a source holds: `docker save` if it has manifest.json, else an OCI layout (index.json). */
export async function readImagePlans(files: ImageFiles, opts: { names?: string[] } = {}): Promise<ImagePlan[]> {
  const { label } = files;
  if ((await files.size('manifest.json')) !== undefined) return readDockerSave(files, opts.names);
  if ((await files.size('index.json')) !== undefined) return [await readOciLayout(files, opts.names)];
  throw new ImageError(`${label}: neither a docker save archive (no manifest.json) nor an OCI image layout (no index.json)`);
}

async function readDockerSave(files: ImageFiles, names: string[] | undefined): Promise<ImagePlan[]> {
  const { label } = files;
  const manifest = parseJson<DockerManifestEntry[]>(label, 'manifest.json', await files.read('manifest.json'));
  if (!Array.isArray(manifest) || manifest.length === 0) throw new ImageError(`${label}: manifest.json lists no image`);
  if (names && names.length > 0 && manifest.length > 1)
    throw new ImageError(`${label}: holds ${manifest.length} images; a name can be given to one only`);
  const plans: ImagePlan[] = [];
  for (const entry of manifest) {
    if (typeof entry.Config !== 'string' || !Array.isArray(entry.Layers)) throw new ImageError(`${label}: manifest.json has an entry without Config or Layers`);
    const m = /^(?:blobs\/sha256\/)?([0-9a-f]{64})(?:\.json)?$/.exec(entry.Config);
    if (!m) throw new ImageError(`${label}: config ${JSON.stringify(entry.Config)} is not named by its sha256, so it cannot be checked`);
    const id = m[1]!;
    const config = checkConfig(label, id, await files.read(entry.Config), entry.Layers.length);
    const diffIds = config.rootfs!.diff_ids!;
    plans.push({
      id,
      config,
      configBytes: await files.read(entry.Config),
      names: names && names.length > 0 ? names : (entry.RepoTags ?? []).filter((t) => typeof t === 'string'),
      layers: entry.Layers.map((blob, i) => {
        if (typeof blob !== 'string') throw new ImageError(`${label}: manifest.json has a layer that is not a file name`);
        // Newer Docker writes an OCI layout beside manifest.json: its layer
        // files are blobs named by digest, which can be checked too.
        const named = /^blobs\/sha256\/([0-9a-f]{64})$/.exec(blob);
        return { diffId: diffIds[i]!, blob, ...(named ? { blobDigest: `sha256:${named[1]}` } : {}) };
      }),
    });
  }
  return plans;
}

async function readBlobJson<T>(files: ImageFiles, desc: Descriptor, what: string): Promise<{ value: T; hex: string; bytes: Buffer }> {
  const hex = digestHex(files.label, what, desc.digest);
  const name = `blobs/sha256/${hex}`;
  if ((await files.size(name)) === undefined) throw new ImageError(`${files.label}: ${what} sha256:${hex} is missing (no ${name})`);
  const bytes = await files.read(name);
  const got = sha256(bytes);
  if (got !== hex) throw new ImageError(`${files.label}: ${what} sha256:${hex} has sha256 ${got}: it was altered or damaged`);
  return { value: parseJson<T>(files.label, `${what} sha256:${hex}`, bytes), hex, bytes };
}

function platformName(p: Descriptor['platform']): string {
  return p ? `${p.os ?? '?'}/${p.architecture ?? '?'}${p.variant ? `/${p.variant}` : ''}` : 'unknown';
}

/** From an index's entries, the one manifest for this machine, or an error naming the platforms there are. */
function choosePlatform(label: string, manifests: Descriptor[]): Descriptor {
  const host = hostPlatform();
  const withPlatform = manifests.filter((d) => d.platform);
  if (withPlatform.length === 0) {
    if (manifests.length === 1) return manifests[0]!;
    throw new ImageError(`${label}: holds ${manifests.length} manifests and names no platform for them; import one image at a time`);
  }
  const fits = withPlatform.filter((d) => d.platform!.os === host.os && d.platform!.architecture === host.architecture);
  if (fits.length === 0)
    throw new ImageError(
      `${label}: has no image for this machine (${host.os}/${host.architecture}); it has ${[...new Set(withPlatform.map((d) => platformName(d.platform)))].join(', ')}`,
    );
  return fits[0]!;
}

async function readOciLayout(files: ImageFiles, names: string[] | undefined): Promise<ImagePlan> {
  const { label } = files;
  const index = parseJson<OciIndex>(label, 'index.json', await files.read('index.json'));
  if (!Array.isArray(index.manifests) || index.manifests.length === 0) throw new ImageError(`${label}: index.json lists no manifest`);
  let desc = choosePlatform(label, index.manifests);
  const refName = desc.annotations?.['org.opencontainers.image.ref.name'];
  let manifest: OciManifest;
  let manifestHex: string;
  // An index (or Docker manifest list) of per-platform manifests: one level down.
  for (let depth = 0; ; depth++) {
    const read = await readBlobJson<OciManifest>(files, desc, 'manifest');
    if (INDEX_TYPES.has(read.value.mediaType ?? desc.mediaType ?? '') || (Array.isArray(read.value.manifests) && !read.value.config)) {
      if (depth > 2) throw new ImageError(`${label}: indexes nested too deep`);
      if (!Array.isArray(read.value.manifests) || read.value.manifests.length === 0) throw new ImageError(`${label}: index sha256:${read.hex} lists no manifest`);
      desc = choosePlatform(label, read.value.manifests);
      continue;
    }
    manifest = read.value;
    manifestHex = read.hex;
    break;
  }
  if (!manifest.config || !Array.isArray(manifest.layers)) throw new ImageError(`${label}: manifest sha256:${manifestHex} has no config or no layers`);
  const configHex = digestHex(label, 'config', manifest.config.digest);
  const configName = `blobs/sha256/${configHex}`;
  if ((await files.size(configName)) === undefined) throw new ImageError(`${label}: config sha256:${configHex} is missing (no ${configName})`);
  const configBytes = await files.read(configName);
  const config = checkConfig(label, configHex, configBytes, manifest.layers.length);
  const diffIds = config.rootfs!.diff_ids!;
  return {
    id: configHex,
    config,
    configBytes,
    manifestDigest: `sha256:${manifestHex}`,
    names: names && names.length > 0 ? names : refName ? [refName] : [],
    layers: manifest.layers.map((l, i) => {
      const hex = digestHex(label, `layer ${i + 1}`, l.digest);
      return { diffId: diffIds[i]!, blob: `blobs/sha256/${hex}`, blobDigest: `sha256:${hex}`, ...(l.mediaType ? { mediaType: l.mediaType } : {}) };
    }),
  };
}

/** Compression of a layer blob, from its first bytes (media types lie more often than magic does). */
export function compressionOfHead(head: Buffer): Compression {
  if (head.length >= 4 && head.readUInt32LE(0) === 0xfd2fb528) return 'zstd';
  if (head.length >= 2 && head[0] === 0x1f && head[1] === 0x8b) return 'gzip';
  return 'none';
}
