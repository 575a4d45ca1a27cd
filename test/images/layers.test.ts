/**
 * Images made by hand (test/images/build.ts): whiteouts and opaque
 * directories as overlayfs sees them, the archive's own xattrs dropped,
 * refusals that leave nothing behind, layers shared between images, gc.
 */
import { execFileSync } from 'node:child_process';
import { lstatSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ImageError, createImageSandbox, getImage, importImage, listImages, removeImage, runImage } from '../../lib/images/index.js';
import type { LayerStore } from '../../lib/layers/index.js';
import { listInRange } from '../../lib/images/owners.js';
import { treeListing } from '../../lib/layers/verify.js';
import { idRangeSupport } from '../../lib/sandbox/index.js';
import { writeDockerSave, writeOciLayout, type HandImage, type TarEntry } from './build.js';
import { EMPTY, storeIsEmpty, tempStore } from './helpers.js';

const hostArch = ({ x64: 'amd64', arm64: 'arm64' } as Record<string, string>)[process.arch] ?? process.arch;
const otherArch = hostArch === 'arm64' ? 'amd64' : 'arm64';

/** The host's /usr for the tools, the image's /data for the test. */
const BASE: TarEntry[] = [
  { name: 'bin', type: '2', link: 'usr/bin' },
  { name: 'lib', type: '2', link: 'usr/lib' },
  { name: 'lib64', type: '2', link: 'usr/lib64' },
  { name: 'usr/', type: '5' },
  { name: 'data/', type: '5' },
  { name: 'data/keep', data: 'keep\n' },
  { name: 'data/gone', data: 'gone\n' },
  { name: 'data/dir/', type: '5' },
  { name: 'data/dir/old', data: 'old\n' },
  { name: 'data/fake/', type: '5' },
  { name: 'data/fake/below', data: 'below\n' },
  { name: `data/${'l'.repeat(90)}/`, type: '5' },
  { name: `data/${'l'.repeat(90)}/${'m'.repeat(60)}`, data: 'long\n' },
];
const TOP: TarEntry[] = [
  { name: 'data/', type: '5' },
  { name: 'data/.wh.gone' },
  // Names past ustar's 100 bytes come as pax paths: the whiteout keeps its whole name.
  { name: `data/${'l'.repeat(90)}/.wh.${'m'.repeat(60)}` },
  { name: 'data/dir/', type: '5', mode: 0o750, uid: 0, gid: 0 },
  { name: 'data/dir/.wh..wh..opq' },
  { name: 'data/dir/new', data: 'new\n' },
  // An image may not plant overlay xattrs: this one must not make fake/ opaque.
  { name: 'data/fake/', type: '5', pax: { 'SCHILY.xattr.user.overlay.opaque': 'y', 'SCHILY.xattr.trusted.overlay.opaque': 'y' } },
  { name: 'data/fake/mine', data: 'mine\n', pax: { 'SCHILY.xattr.user.foo': 'bar' } },
  { name: 'data/run.sh', data: '#!/bin/sh\necho ran "$@"\n', mode: 0o4755 },
];

let t: Awaited<ReturnType<typeof tempStore>>;
let store: LayerStore;
beforeEach(async () => {
  t = await tempStore();
  store = t.store;
});
afterEach(async () => {
  await t.remove();
});

const usr = [{ type: 'bind' as const, source: '/usr', target: '/usr', readOnly: true }];

async function refused(img: HandImage, kind: 'docker' | 'oci', pattern: RegExp, platforms?: string[]): Promise<void> {
  const dir = join(t.dir, `img-${kind}`);
  if (kind === 'docker') writeDockerSave(dir, img);
  else writeOciLayout(dir, img, platforms);
  const err = await importImage(store, dir).catch((e: unknown) => e);
  expect(err).toBeInstanceOf(ImageError);
  expect((err as Error).message).toMatch(pattern);
  expect(await storeIsEmpty(store)).toEqual(EMPTY);
}

describe('image layers made by hand', () => {
  it('stores whiteouts and opaque dirs in overlayfs form, drops the archive xattrs, clears set-id bits', async () => {
    const dir = join(t.dir, 'img');
    const { diffIds } = writeDockerSave(dir, { layers: [BASE, TOP], config: { Cmd: ['/bin/sh', '/data/run.sh'] } });
    const [rec] = await importImage(store, dir);
    expect(rec!.names).toEqual(['hand/made:1']);
    const top = (await store.get(diffIds[1]!))!;
    const wh = lstatSync(join(top.path, 'data', 'gone'));
    expect(wh.isCharacterDevice() && wh.rdev === 0).toBe(true);
    expect(lstatSync(join(top.path, 'data', 'dir')).mode & 0o7777).toBe(0o750);
    expect(lstatSync(join(top.path, 'data', 'run.sh')).mode & 0o7777).toBe(0o755);
    const xattrs = execFileSync('python3', ['-c', 'import os,sys; print(sorted(os.listxattr(sys.argv[1])), sorted(os.listxattr(sys.argv[2])), sorted(os.listxattr(sys.argv[3])))', join(top.path, 'data/dir'), join(top.path, 'data/fake'), join(top.path, 'data/fake/mine')], { encoding: 'utf8' });
    expect(xattrs.trim()).toBe("['user.overlay.opaque'] [] []");

    const r = await runImage(store, 'hand/made:1', ['/bin/sh', '-c', 'ls -A /data; echo --; ls -A /data/dir; echo --; ls -A /data/fake; cat /data/keep; ls -A /data/l*'], { mounts: usr });
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe(`dir\nfake\nkeep\n${'l'.repeat(90)}\nrun.sh\n--\nnew\n--\nbelow\nmine\nkeep\n`);
    // Cmd, and argv replacing it.
    expect((await runImage(store, rec!.id.slice(0, 8), undefined, { mounts: usr })).stdout).toBe('ran\n');
    const exit = await runImage(store, rec!.id, ['/bin/sh', '-c', 'exit 3'], { mounts: usr });
    expect(exit.exitCode).toBe(3);
  });

  it('reads a tar of the archive in place, and an OCI layout with gzip layers', async () => {
    const dir = join(t.dir, 'img');
    const { id } = writeDockerSave(dir, { layers: [BASE, TOP] });
    execFileSync('tar', ['-cf', join(t.dir, 'img.tar'), '-C', dir, '.']);
    const [a] = await importImage(store, join(t.dir, 'img.tar'));
    expect(a!.id).toBe(id);
    const oci = join(t.dir, 'oci');
    const o = writeOciLayout(oci, { layers: [BASE, TOP] }, [`linux/${otherArch}`, `linux/${hostArch}`]);
    const b = await importLayout(oci);
    expect(b.id).toBe(o.id);
    expect(b.manifestDigest).toMatch(/^sha256:/);
    // Same diffIDs: the layers are shared, not stored again.
    expect((await store.list()).length).toBe(2);
    expect((await runImage(store, 'hand', ['/bin/cat', '/data/dir/new'], { mounts: usr })).stdout).toBe('new\n');
  });

  it('reads a gzip-compressed archive (unpacked once in staging, removed after)', async () => {
    const dir = join(t.dir, 'img');
    const { id } = writeDockerSave(dir, { layers: [BASE, TOP] });
    execFileSync('tar', ['-czf', join(t.dir, 'img.tar.gz'), '-C', dir, '.']);
    const [rec] = await importImage(store, join(t.dir, 'img.tar.gz'));
    expect(rec!.id).toBe(id);
    expect((await storeIsEmpty(store)).staging).toEqual([]);
  });

  it('stops when aborted, leaving nothing', async () => {
    const dir = join(t.dir, 'img');
    writeDockerSave(dir, { layers: [BASE, [{ name: 'big', data: Buffer.alloc(48 << 20, 1) }]] });
    const ac = new AbortController();
    const err = await importImage(store, dir, { signal: ac.signal, onProgress: (p) => p.layer === 2 && p.done > 0 && ac.abort() }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ImageError);
    expect((err as Error).message).toMatch(/aborted/);
    expect(await storeIsEmpty(store)).toEqual(EMPTY);
  });

  async function importLayout(dir: string) {
    const { importLayout: imp } = await import('../../lib/images/index.js');
    return imp(store, dir);
  }

  it('two images on one base store the base once; gc keeps layers while an image uses them and collects them after rm', async () => {
    writeDockerSave(join(t.dir, 'a'), { layers: [BASE, TOP] }, 'a:1');
    writeDockerSave(join(t.dir, 'b'), { layers: [BASE, [{ name: 'data/b', data: 'b\n' }]] }, 'b:1');
    await importImage(store, join(t.dir, 'a'));
    await importImage(store, join(t.dir, 'b'));
    expect((await store.list()).length).toBe(3);
    expect((await store.gc()).removedLayers).toEqual([]);
    await removeImage(store, 'a:1');
    expect((await store.gc()).removedLayers.length).toBe(1);
    expect((await listImages(store)).map((r) => r.names)).toEqual([['b:1']]);
    await expect(removeImage(store, 'b')).rejects.toThrow(/image b: no such image/); // b is b:latest, as in Docker
    await removeImage(store, 'b:1');
    await expect(getImage(store, 'b:1')).rejects.toThrow(/no such image/);
    expect((await store.gc()).removedLayers.length).toBe(2);
    expect(await storeIsEmpty(store)).toEqual(EMPTY);
  });

  it('keeps the layers of a running sandbox through image rm and gc, and lets them go when it closes', async () => {
    const dir = join(t.dir, 'img');
    writeDockerSave(dir, { layers: [BASE, TOP] });
    const [rec] = await importImage(store, dir);
    const sb = await createImageSandbox(store, rec!.id, { mounts: usr });
    try {
      await removeImage(store, rec!.id);
      expect((await store.gc()).removedLayers).toEqual([]);
      expect((await sb.exec(['/bin/cat', '/data/dir/new'])).stdout).toBe('new\n');
    } finally {
      await sb.close();
    }
    expect((await store.gc()).removedLayers.length).toBe(2);
    expect(await storeIsEmpty(store)).toEqual(EMPTY);
  });

  it('imports one image twice at once: one copy of each layer, one record', async () => {
    const dir = join(t.dir, 'img');
    writeDockerSave(dir, { layers: [BASE, TOP] });
    const [a, b] = await Promise.all([importImage(store, dir), importImage(store, dir)]);
    expect(a![0]!.id).toBe(b![0]!.id);
    expect((await store.list()).length).toBe(2);
    expect((await listImages(store)).length).toBe(1);
  });

  it('refuses a tampered layer (diffID mismatch) and removes the layers it had stored', async () => {
    await refused(
      // One byte of a file's content: every header stays valid, only the digest can tell.
      { layers: [BASE, TOP], tamper: (i, b) => (i === 1 ? Buffer.from(b.toString('latin1').replace('new\n', 'NEW\n'), 'latin1') : b) },
      'docker',
      /diffID\) is [0-9a-f]{64}, not [0-9a-f]{64} as the image config says/,
    );
  });

  it('refuses an OCI blob whose digest is not its name', async () => {
    await refused({ layers: [BASE], tamper: (_i, b) => Buffer.concat([b, Buffer.alloc(1)]) }, 'oci', /blob sha256 is [0-9a-f]{64}, not [0-9a-f]{64}/);
  });

  it('refuses an index with only another architecture, naming the platforms present', async () => {
    await refused({ layers: [BASE] }, 'oci', new RegExp(`no image for this machine \\(linux/${hostArch}\\); it has linux/${otherArch}`), [`linux/${otherArch}`]);
  });

  it('refuses an image whose config is for another architecture', async () => {
    await refused({ layers: [BASE], architecture: otherArch }, 'docker', new RegExp(`is for linux/${otherArch}, and this machine is linux/${hostArch}`));
  });

  it("refuses a layer with '../' entries", async () => {
    await refused({ layers: [BASE, [{ name: 'data/../../evil', data: 'x' }]] }, 'docker', /member data\/\.\.\/\.\.\/evil has a '\.\.' component/);
  });

  it('refuses a device node', async () => {
    await refused({ layers: [[{ name: 'dev/', type: '5' }, { name: 'dev/sda', type: '3' }]] }, 'docker', /member dev\/sda has unsupported type '3'/);
  });

  it('refuses a hard link to outside the layer', async () => {
    await refused({ layers: [[{ name: 'x', type: '1', link: '../../etc/shadow' }]] }, 'docker', /hard link target \.\.\/\.\.\/etc\/shadow has a '\.\.' component/);
  });

  it('refuses a corrupted config', async () => {
    const dir = join(t.dir, 'img');
    const { id } = writeDockerSave(dir, { layers: [BASE] });
    execFileSync('sed', ['-i', 's/"os":"linux"/"os":"linux","x":1/', join(dir, `${id}.json`)]);
    const err = await importImage(store, dir).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ImageError);
    expect((err as Error).message).toMatch(new RegExp(`config sha256:${id} has sha256 [0-9a-f]{64}: it was altered or damaged`));
    expect(await storeIsEmpty(store)).toEqual(EMPTY);
  });

  it.skipIf(!idRangeSupport().ok)("keeps the image's owners (as the caller's ids: 'range' sandboxes see them)", async () => {
    const dir = join(t.dir, 'img');
    writeDockerSave(dir, { layers: [BASE, [{ name: 'data/owned', data: 'o\n', uid: 1234, gid: 4321 }]] });
    const [rec] = await importImage(store, dir);
    expect(rec!.owners).toBe(process.getuid?.() === 0 ? 'kept' : 'range');
    expect((await runImage(store, rec!.id, ['/bin/stat', '-c', '%u:%g', '/data/owned'], { mounts: usr })).stdout).toBe('1234:4321\n');
  });

  it.skipIf(!idRangeSupport().ok)('lists a tree from an ids: range sandbox exactly as the store lists it', async () => {
    const dir = join(t.dir, 'img');
    const { diffIds } = writeDockerSave(dir, { layers: [BASE, TOP] });
    await importImage(store, dir);
    for (const d of diffIds) {
      const layer = (await store.get(d))!;
      expect(await listInRange(layer.path)).toEqual((await treeListing(layer.path)).entries);
    }
  });

  it.skipIf(!idRangeSupport().ok)("stores and verifies files and directories of other users that only they may read (apt's partial/, a 0600 key)", async () => {
    const dir = join(t.dir, 'img');
    writeDockerSave(dir, {
      layers: [
        BASE,
        [
          { name: 'data/partial/', type: '5', mode: 0o700, uid: 42, gid: 0 },
          { name: 'data/partial/f', data: 'p\n', mode: 0o600, uid: 42, gid: 0 },
          { name: 'data/key', data: 'k\n', mode: 0o600, uid: 1000, gid: 1000 },
        ],
      ],
    });
    const [rec] = await importImage(store, dir);
    expect((await store.verify()).map((c) => c.status)).toEqual(['ok', 'ok']);
    expect((await runImage(store, rec!.id, ['/bin/sh', '-c', 'stat -c "%a %u %n" /data/partial /data/partial/f /data/key; cat /data/key'], { mounts: usr })).stdout).toBe(
      '700 42 /data/partial\n600 42 /data/partial/f\n600 1000 /data/key\nk\n',
    );
    await removeImage(store, rec!.id);
    expect((await store.gc()).removedLayers.length).toBe(2);
  });
});
