/**
 * The registry client against real registries: Debian's docker-registry
 * (distribution 2.8) started here on loopback ports with a temporary
 * storage, filled over the Registry API with images built here; with
 * htpasswd Basic auth, with token auth (a token server of our own whose
 * JWTs the registry verifies against a certificate made with openssl),
 * with TLS, and with blob redirects to a second server, as registries on
 * object storage send.
 */
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createHash, createSign, randomBytes, X509Certificate } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { MinisandboxError } from '../../lib/errors.js';
import { defaultPlatform, formatReference, isLoopback, parseReference, pullToLayout, RegistryError, type PullProgress } from '../../lib/images/registry.js';

const REGISTRY_BIN = '/usr/bin/docker-registry';
const noRegistry = existsSync(REGISTRY_BIN) ? undefined : `${REGISTRY_BIN} is not installed (Debian package docker-registry)`;
const noOpenssl = (() => {
  try {
    execFileSync('openssl', ['version'], { stdio: 'ignore' });
    return undefined;
  } catch {
    return 'the openssl command is not installed';
  }
})();
/** bcrypt for htpasswd, from the C library's crypt() (libxcrypt) through perl: no extra package. */
function bcrypt(password: string): string | undefined {
  try {
    const salt = randomBytes(16).toString('base64').replace(/[^a-zA-Z0-9]/g, '.').slice(0, 22);
    const out = execFileSync('perl', ['-e', 'print crypt($ARGV[0], $ARGV[1])', password, `$2b$05$${salt}`], { encoding: 'utf8' });
    return out.startsWith('$2b$05$') ? out : undefined;
  } catch {
    return undefined;
  }
}
const noBcrypt = bcrypt('x') ? undefined : "perl's crypt() makes no bcrypt hashes here (libxcrypt), so no htpasswd file can be written";

const ROOT = join(tmpdir(), `msbx-registry-${process.pid}-${randomBytes(3).toString('hex')}`);
const HOST = defaultPlatform();

// ---------------------------------------------------------------- images

/** A ustar archive of regular files: enough for layers whose bytes we control. */
function tarOf(files: Record<string, string | Buffer>): Buffer {
  const blocks: Buffer[] = [];
  for (const [name, content] of Object.entries(files)) {
    const data = Buffer.isBuffer(content) ? content : Buffer.from(content);
    const h = Buffer.alloc(512);
    const field = (off: number, len: number, v: string) => h.write(v, off, len, 'utf8');
    field(0, 100, name);
    field(100, 8, '0000644\0');
    field(108, 8, '0000000\0');
    field(116, 8, '0000000\0');
    field(124, 12, `${data.length.toString(8).padStart(11, '0')}\0`);
    field(136, 12, '00000000000\0');
    field(148, 8, '        ');
    field(156, 1, '0');
    field(257, 8, 'ustar\x0000');
    let sum = 0;
    for (const b of h) sum += b;
    field(148, 8, `${sum.toString(8).padStart(6, '0')}\0 `);
    blocks.push(h, data, Buffer.alloc((512 - (data.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

const sha = (b: Buffer) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

interface Blob {
  mediaType: string;
  digest: string;
  size: number;
  bytes: Buffer;
}
interface BuiltImage {
  config: Blob;
  layers: (Blob & { diffId: string })[];
  manifest: Blob;
}

const blob = (mediaType: string, bytes: Buffer): Blob => ({ mediaType, digest: sha(bytes), size: bytes.length, bytes });

/** An image of gzip'd layers, as Docker (schema 2) or OCI media types. */
function buildImage(platform: { os: string; architecture: string; variant?: string }, layerFiles: Record<string, string | Buffer>[], kind: 'docker' | 'oci' = 'docker'): BuiltImage {
  const layers = layerFiles.map((files) => {
    const tar = tarOf(files);
    return { ...blob(kind === 'docker' ? 'application/vnd.docker.image.rootfs.diff.tar.gzip' : 'application/vnd.oci.image.layer.v1.tar+gzip', gzipSync(tar)), diffId: sha(tar) };
  });
  const config = blob(
    kind === 'docker' ? 'application/vnd.docker.container.image.v1+json' : 'application/vnd.oci.image.config.v1+json',
    Buffer.from(JSON.stringify({ ...platform, config: { Env: ['PATH=/usr/bin'] }, rootfs: { type: 'layers', diff_ids: layers.map((l) => l.diffId) } })),
  );
  const desc = (b: Blob) => ({ mediaType: b.mediaType, digest: b.digest, size: b.size });
  const mediaType = kind === 'docker' ? 'application/vnd.docker.distribution.manifest.v2+json' : 'application/vnd.oci.image.manifest.v1+json';
  const manifest = blob(mediaType, Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType, config: desc(config), layers: layers.map(desc) })));
  return { config, layers, manifest };
}

function indexOf(images: { image: BuiltImage; platform: Record<string, string> }[]): Blob {
  const mediaType = 'application/vnd.oci.image.index.v1+json';
  return blob(
    mediaType,
    Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType,
        manifests: images.map(({ image, platform }) => ({ mediaType: image.manifest.mediaType, digest: image.manifest.digest, size: image.manifest.size, platform })),
      }),
    ),
  );
}

// ---------------------------------------------------------------- servers

async function freePort(): Promise<number> {
  const srv = net.createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as net.AddressInfo).port;
  await new Promise((r) => srv.close(r));
  return port;
}

function request(url: string, init: { method?: string; headers?: Record<string, string>; body?: Buffer } = {}): Promise<{ status: number; headers: http.IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method: init.method ?? 'GET', headers: init.headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    req.end(init.body);
  });
}

interface Registry {
  host: string;
  storage: string;
  stop(): Promise<void>;
}
const running: ChildProcess[] = [];

/** docker-registry with `extra` config (YAML lines) on a free loopback port, answering /v2/ before this resolves. */
async function startRegistry(storage: string, extra = '', tls?: { cert: string; key: string }): Promise<Registry> {
  const port = await freePort();
  const dir = join(ROOT, `registry-${port}`);
  mkdirSync(dir, { recursive: true });
  const config = join(dir, 'config.yml');
  writeFileSync(
    config,
    [
      'version: 0.1',
      'log:',
      '  level: warn',
      '  accesslog:',
      '    disabled: true',
      'storage:',
      '  filesystem:',
      `    rootdirectory: ${storage}`,
      'http:',
      `  addr: 127.0.0.1:${port}`,
      ...(tls ? ['  tls:', `    certificate: ${tls.cert}`, `    key: ${tls.key}`] : []),
      extra,
    ].join('\n'),
  );
  const child = spawn(REGISTRY_BIN, ['serve', config], { stdio: ['ignore', 'ignore', 'pipe'] });
  running.push(child);
  let log = '';
  child.stderr!.on('data', (c: Buffer) => (log += c.toString()));
  const deadline = Date.now() + 15_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`docker-registry exited (${child.exitCode}): ${log}`);
    const up = await new Promise<boolean>((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => {
        s.destroy();
        resolve(true);
      });
      s.on('error', () => resolve(false));
    });
    if (up) break;
    if (Date.now() > deadline) throw new Error(`docker-registry did not listen on ${port}: ${log}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    host: `127.0.0.1:${port}`,
    storage,
    stop: () => stopChild(child),
  };
}

async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  await exited;
}

/** Push blobs and a manifest over the API (monolithic uploads), as `docker push` does. */
async function push(host: string, repo: string, tag: string, image: BuiltImage | { index: Blob; images: BuiltImage[] }): Promise<void> {
  const putBlob = async (b: Blob) => {
    if ((await request(`http://${host}/v2/${repo}/blobs/${b.digest}`, { method: 'HEAD' })).status === 200) return;
    const start = await request(`http://${host}/v2/${repo}/blobs/uploads/`, { method: 'POST' });
    expect(start.status, start.body.toString()).toBe(202);
    const location = new URL(start.headers.location!, `http://${host}`);
    location.searchParams.set('digest', b.digest);
    const done = await request(location.href, { method: 'PUT', headers: { 'content-type': 'application/octet-stream', 'content-length': String(b.size) }, body: b.bytes });
    expect(done.status, done.body.toString()).toBe(201);
  };
  const putManifest = async (ref: string, m: Blob) => {
    const res = await request(`http://${host}/v2/${repo}/manifests/${ref}`, { method: 'PUT', headers: { 'content-type': m.mediaType }, body: m.bytes });
    expect(res.status, res.body.toString()).toBe(201);
  };
  const images = 'index' in image ? image.images : [image];
  for (const img of images) {
    for (const b of [...img.layers, img.config]) await putBlob(b);
    if ('index' in image) await putManifest(img.manifest.digest, img.manifest);
  }
  await putManifest(tag, 'index' in image ? image.index : image.manifest);
}

/** The file the registry keeps a blob's bytes in. */
function storedBlob(storage: string, digest: string): string {
  const hex = digest.slice('sha256:'.length);
  return join(storage, 'docker/registry/v2/blobs/sha256', hex.slice(0, 2), hex, 'data');
}

/** Flip one byte in the middle: same size, another digest. */
function tamper(file: string): void {
  const bytes = readFileSync(file);
  const at = Math.floor(bytes.length / 2);
  bytes[at] = bytes[at]! ^ 0xff;
  writeFileSync(file, bytes);
}

function treeOf(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, encoding: 'utf8' }).sort();
}

async function pullError(p: Promise<unknown>): Promise<RegistryError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RegistryError);
  expect(err).toBeInstanceOf(MinisandboxError);
  return err as RegistryError;
}

afterAll(() => rmSync(ROOT, { recursive: true, force: true }));

let outCount = 0;
const outDir = () => join(ROOT, `out-${++outCount}`);

// ---------------------------------------------------------------- tests

describe('parseReference', () => {
  it('normalises as docker pull does', () => {
    expect(parseReference('ubuntu')).toEqual({ registry: 'registry-1.docker.io', repository: 'library/ubuntu', tag: 'latest' });
    expect(parseReference('docker.io/library/ubuntu:22.04')).toEqual({ registry: 'registry-1.docker.io', repository: 'library/ubuntu', tag: '22.04' });
    expect(parseReference('swebench/sweb.eval.x86_64.django__django-11099:latest')).toEqual({
      registry: 'registry-1.docker.io',
      repository: 'swebench/sweb.eval.x86_64.django__django-11099',
      tag: 'latest',
    });
    expect(parseReference('127.0.0.1:5000/msbx-test/app:1')).toEqual({ registry: '127.0.0.1:5000', repository: 'msbx-test/app', tag: '1' });
    expect(parseReference('localhost/a/b')).toEqual({ registry: 'localhost', repository: 'a/b', tag: 'latest' });
    expect(parseReference('[::1]:5000/a')).toEqual({ registry: '[::1]:5000', repository: 'a', tag: 'latest' });
    expect(parseReference('ghcr.io/o/r')).toEqual({ registry: 'ghcr.io', repository: 'o/r', tag: 'latest' });
    const d = `sha256:${'a'.repeat(64)}`;
    expect(parseReference(`quay.io/x/y@${d}`)).toEqual({ registry: 'quay.io', repository: 'x/y', digest: d });
    expect(parseReference(`x:1@${d}`)).toEqual({ registry: 'registry-1.docker.io', repository: 'library/x', tag: '1', digest: d });
    expect(formatReference(parseReference('busybox'))).toBe('registry-1.docker.io/library/busybox:latest');
  });

  it.each([
    ['', /empty/],
    ['Ubuntu', /must be lowercase/],
    ['a b', /white space/],
    ['repo:', /tag "" is not valid/],
    ['repo:-x', /tag "-x" is not valid/],
    ['repo@sha256:abc', /is not a digest/],
    [`repo@sha512:${'a'.repeat(128)}`, /only sha256 digests are supported, not sha512/],
    [`repo@sha256:${'A'.repeat(64)}`, /not a sha256 digest/],
    ['a//b', /empty path component/],
    ['host:99999/a', /is not a registry host/],
    ['a/../b', /not a valid repository path component/],
    [`x/${'a'.repeat(300)}`, /longer than 255/],
  ])('%j is refused, saying why', (ref, why) => {
    expect(() => parseReference(ref)).toThrow(RegistryError);
    expect(() => parseReference(ref)).toThrow(why);
  });

  it('loopback: 127.0.0.0/8, ::1 in any spelling, localhost; nothing else', () => {
    for (const h of ['127.0.0.1', '127.1.2.3', '::1', '[::1]', '0:0:0:0:0:0:0:1', '::ffff:127.0.0.1', 'localhost']) expect(isLoopback(h), h).toBe(true);
    for (const h of ['10.0.0.1', '::2', 'example.com', '128.0.0.1', 'localhost.example.com']) expect(isLoopback(h), h).toBe(false);
  });
});

describe.skipIf(noRegistry)('pullToLayout from docker-registry', () => {
  let open: Registry;
  const storage = join(ROOT, 'storage');
  const single = buildImage(HOST, [{ 'base.txt': 'base layer\n' }, { 'top.txt': 'top layer\n' }]);
  const amd = buildImage({ os: 'linux', architecture: 'amd64' }, [{ 'arch.txt': 'amd64\n' }], 'oci');
  const arm = buildImage({ os: 'linux', architecture: 'arm64', variant: 'v8' }, [{ 'arch.txt': 'arm64\n' }], 'oci');
  const multi = indexOf([
    { image: amd, platform: { os: 'linux', architecture: 'amd64' } },
    { image: arm, platform: { os: 'linux', architecture: 'arm64', variant: 'v8' } },
  ]);
  const s390 = buildImage({ os: 'linux', architecture: 's390x' }, [{ 'arch.txt': 's390x\n' }], 'oci');
  const otherIndex = indexOf([
    { image: s390, platform: { os: 'linux', architecture: 's390x' } },
    { image: amd, platform: { os: 'unknown', architecture: 'unknown' } },
  ]);
  // 3 MiB that gzip cannot shrink: streamed in many chunks.
  const big = buildImage(HOST, [{ 'noise.bin': randomBytes(3 << 20) }, { 'small.txt': 'small\n' }]);

  beforeAll(async () => {
    mkdirSync(storage, { recursive: true });
    open = await startRegistry(storage);
    await push(open.host, 'test/single', '1', single);
    await push(open.host, 'test/multi', '1', { index: multi, images: [amd, arm] });
    await push(open.host, 'test/other', '1', { index: otherIndex, images: [s390, amd] });
    await push(open.host, 'test/s390x', '1', s390);
    await push(open.host, 'test/big', '1', big);
  });
  afterAll(async () => {
    await Promise.all(running.map(stopChild));
  });

  it('pulls by tag into an OCI layout that skopeo reads, every blob verified', async () => {
    const dir = outDir();
    const seen: PullProgress[] = [];
    const r = await pullToLayout(`${open.host}/test/single:1`, { dir, insecure: true, onProgress: (p) => seen.push(p) });
    expect(r.dir).toBe(dir);
    expect(r.reference).toEqual({ registry: open.host, repository: 'test/single', tag: '1' });
    expect(r.manifestDigest).toBe(single.manifest.digest);
    expect(r.configDigest).toBe(single.config.digest);
    expect(r.config).toEqual(JSON.parse(single.config.bytes.toString()));
    expect(r.layers).toEqual(
      single.layers.map((l) => ({ digest: l.digest, diffId: l.diffId, size: l.size, mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip', present: true })),
    );
    for (const b of [...single.layers, single.config, single.manifest]) expect(readFileSync(join(dir, 'blobs/sha256', b.digest.slice(7)))).toEqual(b.bytes);
    expect(JSON.parse(readFileSync(join(dir, 'oci-layout'), 'utf8'))).toEqual({ imageLayoutVersion: '1.0.0' });
    const index = JSON.parse(readFileSync(join(dir, 'index.json'), 'utf8'));
    expect(index.manifests).toHaveLength(1);
    expect(index.manifests[0].annotations).toEqual({ 'org.opencontainers.image.ref.name': '1' });
    // The layout's manifest is the OCI translation of the registry's Docker one: same config and layers.
    const layoutManifest = JSON.parse(readFileSync(join(dir, 'blobs/sha256', index.manifests[0].digest.slice(7)), 'utf8'));
    expect(layoutManifest.mediaType).toBe('application/vnd.oci.image.manifest.v1+json');
    expect(layoutManifest.config.digest).toBe(single.config.digest);
    expect(layoutManifest.layers.map((l: { digest: string }) => l.digest)).toEqual(single.layers.map((l) => l.digest));
    // No temporary file is left.
    expect(treeOf(dir).filter((f) => f.includes('partial'))).toEqual([]);
    const total = single.layers.reduce((n, l) => n + l.size, 0);
    expect(seen[0]).toEqual({ bytes: 0, totalBytes: total, layers: 0, totalLayers: 2 });
    expect(seen.at(-1)).toEqual({ bytes: total, totalBytes: total, layers: 2, totalLayers: 2 });
    // A real OCI tool reads the layout and checks every digest again.
    const skopeo = spawnSync('skopeo', ['copy', '-q', `oci:${dir}:1`, `dir:${join(ROOT, 'skopeo-copy')}`]);
    if (skopeo !== undefined) expect(skopeo.status, skopeo.stderr).toBe(0);
  });

  it('pulls by digest, and a tag with a digest pins the digest', async () => {
    const r = await pullToLayout(`${open.host}/test/single@${single.manifest.digest}`, { dir: outDir(), insecure: true });
    expect(r.reference).toEqual({ registry: open.host, repository: 'test/single', digest: single.manifest.digest });
    expect(r.manifestDigest).toBe(single.manifest.digest);
    const index = JSON.parse(readFileSync(join(r.dir, 'index.json'), 'utf8'));
    expect(index.manifests[0].annotations).toBeUndefined();
    const both = await pullToLayout(`${open.host}/test/single:nonexistent@${single.manifest.digest}`, { dir: outDir(), insecure: true });
    expect(both.configDigest).toBe(single.config.digest);
  });

  it('an unknown tag or digest is a 404 naming the registry, repository and what the registry said', async () => {
    const err = await pullError(pullToLayout(`${open.host}/test/single:2`, { dir: outDir(), insecure: true }));
    expect(err.message).toBe(`pull ${open.host}/test/single:2: manifest 2: 404 Not Found (MANIFEST_UNKNOWN: manifest unknown)`);
    expect([err.registry, err.repository, err.status, err.code]).toEqual([open.host, 'test/single', 404, 'MSBX_REGISTRY']);
    const missing = `sha256:${'0'.repeat(64)}`;
    const byDigest = await pullError(pullToLayout(`${open.host}/test/nothing@${missing}`, { dir: outDir(), insecure: true }));
    expect(byDigest.message).toMatch(/test\/nothing@sha256:0+: manifest sha256:0+: 404 Not Found/);
  });

  it('an index gives the entry for the platform asked (default: this machine), OCI media types kept byte for byte', async () => {
    const a = await pullToLayout(`${open.host}/test/multi:1`, { dir: outDir(), insecure: true, platform: { os: 'linux', architecture: 'amd64' } });
    expect([a.manifestDigest, a.indexDigest, a.configDigest]).toEqual([amd.manifest.digest, multi.digest, amd.config.digest]);
    const index = JSON.parse(readFileSync(join(a.dir, 'index.json'), 'utf8'));
    expect(index.manifests[0]).toMatchObject({ digest: amd.manifest.digest, platform: { os: 'linux', architecture: 'amd64' } });
    const b = await pullToLayout(`${open.host}/test/multi:1`, { dir: outDir(), insecure: true, platform: { os: 'linux', architecture: 'arm64' } });
    expect([b.manifestDigest, b.configDigest]).toEqual([arm.manifest.digest, arm.config.digest]);
    expect(treeOf(join(b.dir, 'blobs/sha256'))).not.toContain(amd.layers[0]!.digest.slice(7));
    if (HOST.architecture === 'amd64' || HOST.architecture === 'arm64') {
      const mine = await pullToLayout(`${open.host}/test/multi:1`, { dir: outDir(), insecure: true });
      expect(mine.configDigest).toBe((HOST.architecture === 'amd64' ? amd : arm).config.digest);
    }
  });

  it('an index or image only for another platform is refused, naming the platforms present, and nothing is kept', async () => {
    const dir = outDir();
    const err = await pullError(pullToLayout(`${open.host}/test/other:1`, { dir, insecure: true, platform: { os: 'linux', architecture: 'amd64' } }));
    expect(err.message).toBe(`pull ${open.host}/test/other:1: no image for linux/amd64 in the index; it has linux/s390x`);
    expect(existsSync(dir)).toBe(false);
    const single390 = await pullError(pullToLayout(`${open.host}/test/s390x:1`, { dir, insecure: true, platform: { os: 'linux', architecture: 'amd64' } }));
    expect(single390.message).toBe(`pull ${open.host}/test/s390x:1: the image is for linux/s390x, not linux/amd64`);
    expect(existsSync(dir)).toBe(false);
  });

  it("have() leaves out the layers the caller has: absent from the layout, present: false, not counted in progress", async () => {
    const asked: string[] = [];
    let last: PullProgress | undefined;
    const r = await pullToLayout(`${open.host}/test/single:1`, {
      dir: outDir(),
      insecure: true,
      have: async (diffId) => (asked.push(diffId), diffId === single.layers[0]!.diffId),
      onProgress: (p) => (last = p),
    });
    expect(asked).toEqual(single.layers.map((l) => l.diffId));
    expect(r.layers.map((l) => l.present)).toEqual([false, true]);
    const blobs = treeOf(join(r.dir, 'blobs/sha256'));
    expect(blobs).not.toContain(single.layers[0]!.digest.slice(7));
    expect(blobs).toContain(single.layers[1]!.digest.slice(7));
    expect(last).toEqual({ bytes: single.layers[1]!.size, totalBytes: single.layers[1]!.size, layers: 1, totalLayers: 1 });
  });

  it('a layer tampered in the registry fails the digest check, and nothing of the pull is kept', async () => {
    const img = buildImage(HOST, [{ 'a.txt': 'kept\n' }, { 'b.txt': `tampered ${randomBytes(8).toString('hex')}\n` }]);
    await push(open.host, 'test/tampered', '1', img);
    tamper(storedBlob(storage, img.layers[1]!.digest));
    const fresh = outDir();
    const err = await pullError(pullToLayout(`${open.host}/test/tampered:1`, { dir: join(fresh, 'parents', 'made', 'too'), insecure: true }));
    expect(err.message).toMatch(new RegExp(`^pull ${open.host}/test/tampered:1: layer ${img.layers[1]!.digest}: digest mismatch: the registry sent bytes whose sha256 is sha256:[0-9a-f]{64}$`));
    expect(existsSync(fresh)).toBe(false);
    // A directory the caller made is left as it was: empty.
    const given = outDir();
    mkdirSync(given);
    await pullError(pullToLayout(`${open.host}/test/tampered:1`, { dir: given, insecure: true }));
    expect(treeOf(given)).toEqual([]);
  });

  it("a manifest tampered in the registry fails against Docker-Content-Digest (by tag) and against the pinned digest", async () => {
    const img = buildImage(HOST, [{ 'm.txt': `manifest ${randomBytes(8).toString('hex')}\n` }]);
    await push(open.host, 'test/badmanifest', '1', img);
    tamper(storedBlob(storage, img.manifest.digest));
    const byTag = await pullError(pullToLayout(`${open.host}/test/badmanifest:1`, { dir: outDir(), insecure: true }));
    expect(byTag.message).toMatch(/manifest 1: the registry sent a manifest whose digest is sha256:[0-9a-f]{64}, not the sha256:[0-9a-f]{64} it announced \(Docker-Content-Digest\)/);
    const byDigest = await pullError(pullToLayout(`${open.host}/test/badmanifest@${img.manifest.digest}`, { dir: outDir(), insecure: true }));
    expect(byDigest.message).toMatch(/the registry sent a manifest whose digest is sha256:[0-9a-f]{64}$/);
  });

  it('an abort stops the download, and nothing of the pull is kept', async () => {
    const dir = outDir();
    const ac = new AbortController();
    const err = await pullError(
      pullToLayout(`${open.host}/test/big:1`, {
        dir,
        insecure: true,
        signal: ac.signal,
        onProgress: (p) => {
          if (p.bytes > 0) ac.abort();
        },
      }),
    );
    expect(err.message).toBe(`pull ${open.host}/test/big:1: aborted`);
    expect(existsSync(dir)).toBe(false);
  });

  it('plain HTTP: refused for a registry off loopback, and only with insecure on loopback', async () => {
    const dir = outDir();
    const off = await pullError(pullToLayout('10.11.12.13:5000/test/single:1', { dir, insecure: true }));
    expect(off.message).toBe(
      'pull 10.11.12.13:5000/test/single:1: plain HTTP (insecure) is allowed only for a loopback registry (127.0.0.0/8, ::1, localhost), and 10.11.12.13:5000 is not one: use HTTPS',
    );
    expect(existsSync(dir)).toBe(false);
    // Without insecure it speaks TLS to the plain-HTTP registry, and says what to do.
    const tls = await pullError(pullToLayout(`${open.host}/test/single:1`, { dir, timeoutMs: 5000 }));
    expect(tls.message).toMatch(new RegExp(`^pull ${open.host}/test/single:1: manifest 1: cannot reach ${open.host}: TLS handshake failed: wrong version number \\(the registry does not speak TLS: for a plain-HTTP registry on loopback pass insecure\\)$`));
    const viaName = await pullToLayout(`localhost:${open.host.split(':')[1]}/test/single:1`, { dir, insecure: true });
    expect(viaName.configDigest).toBe(single.config.digest);
  });

  it('a registry that accepts the connection and sends nothing times out, naming it', async () => {
    const silent = net.createServer(() => undefined);
    await new Promise<void>((r) => silent.listen(0, '127.0.0.1', r));
    const port = (silent.address() as net.AddressInfo).port;
    try {
      const t = Date.now();
      const err = await pullError(pullToLayout(`127.0.0.1:${port}/test/single:1`, { dir: outDir(), insecure: true, timeoutMs: 300 }));
      expect(err.message).toBe(`pull 127.0.0.1:${port}/test/single:1: manifest 1: 127.0.0.1:${port} sent nothing for 0.3 s`);
      expect(Date.now() - t).toBeLessThan(5000);
      const refused = await pullError(pullToLayout(`127.0.0.1:${await freePort()}/test/single:1`, { dir: outDir(), insecure: true }));
      expect(refused.message).toMatch(/manifest 1: cannot reach 127\.0\.0\.1:\d+: connect ECONNREFUSED/);
    } finally {
      silent.close();
    }
  });

  /** A proxy to the real registry that stops sending the response to `path` after `keep` bytes. */
  async function stallingProxy(stallsOn: (url: string) => boolean, keep: number): Promise<{ host: string; close(): void }> {
    const proxy = http.createServer((req, res) => {
      const upstream = http.request(`http://${open.host}${req.url}`, { method: req.method, headers: req.headers }, (up) => {
        res.writeHead(up.statusCode!, up.headers);
        if (!stallsOn(req.url!)) return void up.pipe(res);
        let sent = 0;
        up.on('data', (c: Buffer) => {
          if (sent < keep) res.write(c.subarray(0, keep - sent));
          sent += c.length;
        });
      });
      upstream.end();
    });
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    return {
      host: `127.0.0.1:${(proxy.address() as net.AddressInfo).port}`,
      close: () => {
        proxy.closeAllConnections();
        proxy.close();
      },
    };
  }

  it('a registry that stalls in the middle of a layer or a manifest times out, saying where', async () => {
    const stalled = big.layers[0]!.digest;
    const layer = await stallingProxy((url) => url.endsWith(`/blobs/${stalled}`), 65536);
    const manifest = await stallingProxy((url) => url.includes('/manifests/'), 10);
    try {
      const dir = outDir();
      const err = await pullError(pullToLayout(`${layer.host}/test/big:1`, { dir, insecure: true, timeoutMs: 500 }));
      expect(err.message).toBe(`pull ${layer.host}/test/big:1: layer ${stalled}: the registry sent nothing for 0.5 s (after 65536 of ${big.layers[0]!.size} bytes)`);
      expect(existsSync(dir)).toBe(false);
      const early = await pullError(pullToLayout(`${manifest.host}/test/big:1`, { dir, insecure: true, timeoutMs: 500 }));
      expect(early.message).toBe(`pull ${manifest.host}/test/big:1: manifest 1: nothing received for 0.5 s (after 10 bytes)`);
    } finally {
      layer.close();
      manifest.close();
    }
  });

  describe.skipIf(noBcrypt)('Basic auth (htpasswd), with blobs redirected to another server', () => {
    let reg: Registry;
    let storageServer: http.Server;
    const blobRequests: { path: string; authorization: string | undefined }[] = [];

    beforeAll(async () => {
      // Serves the registry's storage as object storage would, recording what it was sent.
      storageServer = http.createServer((req, res) => {
        blobRequests.push({ path: req.url!, authorization: req.headers.authorization });
        const file = join(storage, decodeURIComponent(new URL(req.url!, 'http://x').pathname));
        if (!file.startsWith(storage) || !existsSync(file) || !statSync(file).isFile()) return void res.writeHead(404).end();
        res.writeHead(200, { 'content-length': statSync(file).size }).end(readFileSync(file));
      });
      await new Promise<void>((r) => storageServer.listen(0, '127.0.0.1', r));
      const storagePort = (storageServer.address() as net.AddressInfo).port;
      const htpasswd = join(ROOT, 'htpasswd');
      writeFileSync(htpasswd, `alice:${bcrypt('wonderland')}\n`);
      reg = await startRegistry(
        storage,
        ['auth:', '  htpasswd:', '    realm: msbx-test', `    path: ${htpasswd}`, 'middleware:', '  storage:', '    - name: redirect', '      options:', `        baseurl: http://127.0.0.1:${storagePort}/`].join('\n'),
      );
    });
    afterAll(async () => {
      await reg?.stop();
      storageServer?.close();
    });

    it('pulls with the right credentials; the redirected blob requests carry no Authorization', async () => {
      blobRequests.length = 0;
      const r = await pullToLayout(`${reg.host}/test/single:1`, { dir: outDir(), insecure: true, auth: { username: 'alice', password: 'wonderland' } });
      expect(r.configDigest).toBe(single.config.digest);
      expect(readFileSync(join(r.dir, 'blobs/sha256', single.layers[1]!.digest.slice(7)))).toEqual(single.layers[1]!.bytes);
      // Config and both layers came from the storage server, never with the registry's credentials.
      expect(blobRequests.map((b) => b.path.split('/').at(-2)).sort()).toEqual([single.config, ...single.layers].map((b) => b.digest.slice(7)).sort());
      expect(blobRequests.map((b) => b.authorization)).toEqual([undefined, undefined, undefined]);
    });

    it('without credentials, or with wrong ones, a clear 401', async () => {
      const none = await pullError(pullToLayout(`${reg.host}/test/single:1`, { dir: outDir(), insecure: true }));
      expect(none.message).toBe(`pull ${reg.host}/test/single:1: manifest 1: 401 Unauthorized without credentials: the registry asks for Basic auth (a username and password)`);
      const wrong = await pullError(pullToLayout(`${reg.host}/test/single:1`, { dir: outDir(), insecure: true, auth: { username: 'alice', password: 'nope' } }));
      expect(wrong.message).toBe(
        `pull ${reg.host}/test/single:1: manifest 1: 401 Unauthorized after authenticating as alice: the credentials were refused or do not allow pulling test/single`,
      );
      expect(wrong.status).toBe(401);
    });
  });

  describe.skipIf(noOpenssl)('token auth (Bearer), the registry verifying our token server\'s JWTs', () => {
    let reg: Registry;
    let tokenServer: http.Server;
    const tokenRequests: { query: URLSearchParams; user: string | undefined }[] = [];
    /** What the token server grants: by user ('' = anonymous), the repositories it may pull. */
    const grants: Record<string, string[]> = { '': ['test/single'], bob: ['test/single', 'test/multi'] };

    beforeAll(async () => {
      const key = join(ROOT, 'token.key');
      const cert = join(ROOT, 'token.crt');
      execFileSync('openssl', ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert, '-days', '2', '-subj', '/CN=msbx-test token issuer'], { stdio: 'ignore' });
      const x5c = new X509Certificate(readFileSync(cert)).raw.toString('base64');
      const privateKey = readFileSync(key);
      const b64url = (b: Buffer | string) => Buffer.from(b).toString('base64url');
      tokenServer = http.createServer((req, res) => {
        const query = new URL(req.url!, 'http://x').searchParams;
        const basicAuth = req.headers.authorization?.startsWith('Basic ') ? Buffer.from(req.headers.authorization.slice(6), 'base64').toString() : undefined;
        const user = basicAuth?.split(':')[0];
        tokenRequests.push({ query, user });
        if (basicAuth !== undefined && basicAuth !== 'bob:builder') return void res.writeHead(401, { 'content-type': 'application/json' }).end('{"details":"bad credentials"}');
        const access = (query.getAll('scope') ?? [])
          .map((s) => s.split(':'))
          .filter(([type, name]) => type === 'repository' && (grants[user ?? ''] ?? []).includes(name!))
          .map(([type, name]) => ({ type, name, actions: ['pull'] }));
        const now = Math.floor(Date.now() / 1000);
        const header = b64url(JSON.stringify({ typ: 'JWT', alg: 'RS256', x5c: [x5c] }));
        const claims = b64url(JSON.stringify({ iss: 'msbx-test-issuer', sub: user ?? '', aud: query.get('service'), exp: now + 300, nbf: now - 10, iat: now, jti: randomBytes(8).toString('hex'), access }));
        const signature = createSign('RSA-SHA256').update(`${header}.${claims}`).sign(privateKey);
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ token: `${header}.${claims}.${b64url(signature)}`, expires_in: 300 }));
      });
      await new Promise<void>((r) => tokenServer.listen(0, '127.0.0.1', r));
      const tokenPort = (tokenServer.address() as net.AddressInfo).port;
      reg = await startRegistry(
        storage,
        ['auth:', '  token:', `    realm: http://127.0.0.1:${tokenPort}/token`, '    service: msbx-test-registry', '    issuer: msbx-test-issuer', `    rootcertbundle: ${cert}`].join('\n'),
      );
    });
    afterAll(async () => {
      await reg?.stop();
      tokenServer?.close();
    });

    it('anonymous: the token server is asked for the repository scope, the registry accepts its token', async () => {
      tokenRequests.length = 0;
      const r = await pullToLayout(`${reg.host}/test/single:1`, { dir: outDir(), insecure: true });
      expect(r.configDigest).toBe(single.config.digest);
      // One token for the whole pull: the manifest's challenge, then reused for every blob.
      expect(tokenRequests).toHaveLength(1);
      expect([tokenRequests[0]!.user, tokenRequests[0]!.query.get('service'), tokenRequests[0]!.query.getAll('scope')]).toEqual([
        undefined,
        'msbx-test-registry',
        ['repository:test/single:pull'],
      ]);
    });

    it('with credentials: sent to the token server, and the grant they give is used', async () => {
      tokenRequests.length = 0;
      const r = await pullToLayout(`${reg.host}/test/multi:1`, { dir: outDir(), insecure: true, auth: { username: 'bob', password: 'builder' }, platform: { os: 'linux', architecture: 'arm64' } });
      expect(r.configDigest).toBe(arm.config.digest);
      expect(tokenRequests.map((t) => t.user)).toEqual(['bob']);
    });

    it('a token without the grant, and refused credentials, are clear errors', async () => {
      const anonymous = await pullError(pullToLayout(`${reg.host}/test/multi:1`, { dir: outDir(), insecure: true }));
      expect(anonymous.message).toBe(`pull ${reg.host}/test/multi:1: manifest 1: 401 Unauthorized without credentials: the registry needs a username and password (auth)`);
      const refused = await pullError(pullToLayout(`${reg.host}/test/single:1`, { dir: outDir(), insecure: true, auth: { username: 'bob', password: 'wrong' } }));
      expect(refused.message).toMatch(new RegExp(`^pull ${reg.host}/test/single:1: token from http://127\\.0\\.0\\.1:\\d+/token: 401 Unauthorized: the credentials for bob were refused$`));
    });
  });

  describe.skipIf(noOpenssl)('HTTPS (the default)', () => {
    let reg: Registry;
    let ca: Buffer;

    beforeAll(async () => {
      const key = join(ROOT, 'tls.key');
      const cert = join(ROOT, 'tls.crt');
      execFileSync(
        'openssl',
        ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', key, '-out', cert, '-days', '2', '-subj', '/CN=127.0.0.1', '-addext', 'subjectAltName=IP:127.0.0.1'],
        { stdio: 'ignore' },
      );
      ca = readFileSync(cert);
      reg = await startRegistry(storage, '', { cert, key });
    });
    afterAll(async () => {
      await reg?.stop();
    });

    it('pulls over TLS from a registry whose CA is given, and refuses an untrusted certificate', async () => {
      const r = await pullToLayout(`${reg.host}/test/single:1`, { dir: outDir(), ca });
      expect(r.configDigest).toBe(single.config.digest);
      const err = await pullError(pullToLayout(`${reg.host}/test/single:1`, { dir: outDir() }));
      expect(err.message).toMatch(new RegExp(`^pull ${reg.host}/test/single:1: manifest 1: cannot reach ${reg.host}: self.signed certificate.*pass its CA as ca\\)$`));
    });
  });
});

/** The fixture registry (scripts/test-images.sh) answers for msbx-test/app:1, or why not. */
const FIXTURE = '127.0.0.1:5000';
const noFixture = await request(`http://${FIXTURE}/v2/msbx-test/app/manifests/1`, {
  method: 'HEAD',
  headers: { accept: 'application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json' },
}).then(
  (r) => (r.status === 200 ? undefined : `the fixture registry on ${FIXTURE} has no msbx-test/app:1 (HTTP ${r.status}): scripts/test-images.sh pushes it`),
  (err: Error) => `no fixture registry on ${FIXTURE} (${err.message}): scripts/test-images.sh starts it`,
);

describe.skipIf(noFixture)(`the fixture registry on ${FIXTURE}`, () => {

  it('pulls msbx-test/app:1, then app2:1 fetching only the layer app does not have', async () => {
    const app = await pullToLayout(`${FIXTURE}/msbx-test/app:1`, { dir: outDir(), insecure: true });
    const config = app.config as { architecture: string; config: { User?: string; WorkingDir?: string } };
    expect([config.architecture, config.config.User, config.config.WorkingDir]).toEqual([HOST.architecture, 'dev', '/home/dev/project']);
    expect(app.layers).toHaveLength(2);
    for (const l of app.layers) expect(statSync(join(app.dir, 'blobs/sha256', l.digest.slice(7))).size).toBe(l.size);
    const have = new Set(app.layers.map((l) => l.diffId));
    let last: PullProgress | undefined;
    const app2 = await pullToLayout(`${FIXTURE}/msbx-test/app2:1`, { dir: outDir(), insecure: true, have: (d) => have.has(d), onProgress: (p) => (last = p) });
    expect(app2.layers.map((l) => l.present)).toEqual([false, true]);
    expect(app2.layers[0]!.diffId).toBe(app.layers[0]!.diffId);
    expect(last).toMatchObject({ layers: 1, totalLayers: 1, totalBytes: app2.layers[1]!.size });
  });
});

/** `spawnSync` of a command that may be absent: undefined then. */
function spawnSync(cmd: string, args: string[]): { status: number | null; stderr: string } | undefined {
  try {
    execFileSync('which', [cmd], { stdio: 'ignore' });
  } catch {
    return undefined;
  }
  try {
    execFileSync(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    return { status: 0, stderr: '' };
  } catch (err) {
    const e = err as { status: number | null; stderr: Buffer };
    return { status: e.status, stderr: e.stderr.toString() };
  }
}
