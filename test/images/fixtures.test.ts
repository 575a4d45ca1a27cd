/**
 * The image fixtures are what the image tests rely on (test/images/fixtures.ts,
 * made by scripts/test-images.sh): a wrong fixture fails here, loudly,
 * instead of making those tests pass or skip for the wrong reason. Each
 * group skips with the reason when its fixture is absent, except under
 * .ci/run (MSBX_IMAGE_FIXTURES=required), which made them and checked that
 * this user can use Docker: there, absence fails.
 *
 * Archives are read with GNU tar (tar -xOf MEMBER | tar -tv): the same
 * tool the library unpacks trees with, and independent of the importer
 * under test.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { beforeEach, describe, expect, it } from 'vitest';
import { APP, IMAGES, REGISTRY, dockerRun, imageFixtures, skipWith } from './fixtures.js';

const f = imageFixtures();
// Under .ci/run a missing fixture is a failure, not a skip.
const skipArchives = f.required ? false : f.skip;
const skipDocker = f.required ? false : f.dockerSkip;
const skipRegistry = f.required ? false : f.registrySkip;

interface Entry {
  /** First character of `tar -tv`'s mode column: - d l h c b p. */
  type: string;
  mode: string;
  uid: number;
  gid: number;
  path: string;
}

function sh(script: string, ...args: string[]): Buffer {
  const r = spawnSync('bash', ['-c', `set -o pipefail; ${script}`, 'sh', ...args], { maxBuffer: 256 * 1024 * 1024 });
  if (r.status !== 0) throw new Error(`${script} ${args.join(' ')} failed (${r.status}): ${r.stderr.toString()}`);
  return r.stdout;
}

function member(archive: string, name: string): Buffer {
  return sh('tar -xOf "$1" "$2"', archive, name);
}

function json<T = any>(archive: string, name: string): T {
  return JSON.parse(member(archive, name).toString('utf8')) as T;
}

/** The entries of a layer tar stored in a `docker save` archive. */
function layerEntries(archive: string, layer: string): Entry[] {
  const out = sh('tar -xOf "$1" "$2" | tar -tv --numeric-owner -f -', archive, layer).toString('utf8');
  return out
    .split('\n')
    .filter(Boolean)
    .map((line) => {
      // drwxr-xr-x 0/0    0 2026-12-01 03:31 etc/   (symlinks: "a -> b", hard links: "a link to b")
      const m = /^(\S)(\S+)\s+(\d+)\/(\d+)\s+\S+\s+\S+\s+\S+\s+(.*)$/.exec(line);
      if (!m) throw new Error(`unexpected tar -tv line: ${line}`);
      const path = m[5]!.replace(/ (->|link to) .*$/, '').replace(/^\.\//, '').replace(/\/$/, '');
      return { type: m[1]!, mode: m[2]!, uid: Number(m[3]), gid: Number(m[4]), path };
    });
}

function layerDiffId(archive: string, layer: string): string {
  return `sha256:${sh('tar -xOf "$1" "$2" | sha256sum', archive, layer).toString().split(' ')[0]}`;
}

interface SavedImage {
  manifest: { Config: string; RepoTags: string[] | null; Layers: string[] };
  config: { config: Record<string, any>; rootfs: { type: string; diff_ids: string[] }; architecture: string; os: string };
  /** sha256:HEX of the config file, which is Docker's image id. */
  configDigest: string;
}

function saved(archive: string): SavedImage {
  const [manifest] = json<SavedImage['manifest'][]>(archive, 'manifest.json');
  if (!manifest) throw new Error(`${archive}: manifest.json lists no image`);
  return { manifest, config: json(archive, manifest.Config), configDigest: `sha256:${manifest.Config.replace(/\.json$/, '')}` };
}

describe(`docker save archives in ${f.dir}`, () => {
  beforeEach((ctx) => skipWith(ctx, skipArchives));

  it('app.tar: one image tagged msbx-test/app:1, the base layer under one top layer whose digest is its diffID', () => {
    const app = saved(f.app);
    expect(app.manifest.RepoTags).toEqual([IMAGES.app]);
    expect(app.manifest.Layers).toHaveLength(2);
    expect(app.config.rootfs.diff_ids).toHaveLength(2);
    expect(layerDiffId(f.app, app.manifest.Layers[1]!)).toBe(app.config.rootfs.diff_ids[1]);
    expect(app.config.os).toBe('linux');
  });

  it("app.tar's config: ENV, WORKDIR, USER and CMD as the Dockerfile sets them", () => {
    const { config } = saved(f.app).config;
    expect(config.Env).toEqual(expect.arrayContaining([`GREETING=${APP.env.GREETING}`, `PATH=${APP.env.PATH}`]));
    expect(config.WorkingDir).toBe(APP.workdir);
    expect(config.User).toBe(APP.user);
    expect(config.Cmd).toEqual(APP.cmd);
    expect(config.Entrypoint ?? null).toBeNull();
  });

  it("app.tar's top layer: a whiteout for /etc/issue, /usr/share/doc opaque with only README, dev's home owned by 1000, the venv", () => {
    const app = saved(f.app);
    const top = layerEntries(f.app, app.manifest.Layers[1]!);
    const byPath = new Map(top.map((e) => [e.path, e]));
    expect(byPath.get('etc/.wh.issue')?.type).toBe('-');
    expect(byPath.get('usr/share/doc/.wh..wh..opq')?.type).toBe('-');
    expect(top.filter((e) => e.path.startsWith('usr/share/doc/')).map((e) => e.path).sort()).toEqual([
      'usr/share/doc/.wh..wh..opq',
      'usr/share/doc/README',
    ]);
    expect(sh('tar -xOf "$1" "$2" | tar -xOf - usr/share/doc/README', f.app, app.manifest.Layers[1]!).toString()).toBe('replaced\n');
    expect(byPath.get('home/dev/project')).toMatchObject({ type: 'd', uid: APP.uid, gid: APP.gid });
    expect(byPath.get('opt/venv/pyvenv.cfg')?.type).toBe('-');
    expect(byPath.get('opt/venv/bin/python3')?.type).toBe('l');
    // Nothing the importer must refuse: no device nodes, no absolute or `..` paths.
    expect(top.filter((e) => e.type === 'c' || e.type === 'b' || e.path.startsWith('/') || e.path.split('/').includes('..'))).toEqual([]);
  });

  it("the base layer: Debian's python3, git and patch, the deleted /etc/issue, an empty /dev (no device nodes)", () => {
    const app = saved(f.app);
    const base = layerEntries(f.app, app.manifest.Layers[0]!);
    const paths = new Set(base.map((e) => e.path));
    for (const p of ['usr/bin/python3', 'usr/bin/git', 'usr/bin/patch', 'etc/issue', 'usr/share/doc/git', 'etc/debian_version']) {
      expect(paths, p).toContain(p);
    }
    expect(base.filter((e) => e.type === 'c' || e.type === 'b').map((e) => e.path)).toEqual([]);
    expect(base.filter((e) => e.path.startsWith('dev/'))).toEqual([]);
    expect(layerDiffId(f.app, app.manifest.Layers[0]!)).toBe(app.config.rootfs.diff_ids[0]);
  }, 120_000);

  it('app and app2 share the base layer diffID, which is base.tar\'s only layer; app2 adds only /opt/app2/marker', () => {
    const app = saved(f.app);
    const app2 = saved(f.app2);
    const base = saved(f.base);
    expect(base.manifest.RepoTags).toEqual([IMAGES.base]);
    expect(base.config.rootfs.diff_ids).toHaveLength(1);
    expect(app.config.rootfs.diff_ids[0]).toBe(base.config.rootfs.diff_ids[0]);
    expect(app2.config.rootfs.diff_ids[0]).toBe(base.config.rootfs.diff_ids[0]);
    expect(app2.config.rootfs.diff_ids).toHaveLength(2);
    expect(app2.manifest.RepoTags).toEqual([IMAGES.app2]);
    expect(layerEntries(f.app2, app2.manifest.Layers[1]!).map((e) => e.path)).toEqual(['opt', 'opt/app2', 'opt/app2/marker']);
    // The config of app2 is the base's plus that layer: same Env, no USER/WORKDIR of its own.
    expect(app2.config.config.Env).toEqual(base.config.config.Env);
    expect(app2.config.config.User ?? '').toBe('');
  });

  it(`the OCI layout ${join(f.dir, 'app-oci')}: tag "app", the same diffIDs, blobs present and matching their digests`, () => {
    const index = JSON.parse(readFileSync(join(f.appOci, 'index.json'), 'utf8'));
    expect(JSON.parse(readFileSync(join(f.appOci, 'oci-layout'), 'utf8')).imageLayoutVersion).toBe('1.0.0');
    const entry = index.manifests.find((m: any) => m.annotations?.['org.opencontainers.image.ref.name'] === f.appOciTag);
    expect(entry, 'index.json has a manifest tagged app').toBeDefined();
    const blob = (digest: string) => join(f.appOci, 'blobs', ...digest.split(':'));
    const manifest = JSON.parse(readFileSync(blob(entry.digest), 'utf8'));
    const config = JSON.parse(readFileSync(blob(manifest.config.digest), 'utf8'));
    expect(config.rootfs.diff_ids).toEqual(saved(f.app).config.rootfs.diff_ids);
    expect(config.config.User).toBe(APP.user);
    expect(manifest.layers).toHaveLength(2);
    const top = manifest.layers[1];
    expect(`sha256:${sh('sha256sum < "$1"', blob(top.digest)).toString().split(' ')[0]}`).toBe(top.digest);
    // skopeo stores the layers gzip-compressed: their uncompressed digest is the diffID.
    const unpack = /gzip$/.test(top.mediaType) ? 'gzip -dc < "$1" | sha256sum' : 'sha256sum < "$1"';
    expect(`sha256:${sh(unpack, blob(top.digest)).toString().split(' ')[0]}`).toBe(config.rootfs.diff_ids[1]);
  });
});

describe(`docker run of the test images (as ${process.getuid?.() === 0 ? 'root' : 'an unprivileged user'})`, () => {
  beforeEach((ctx) => skipWith(ctx, skipDocker));

  it('app:1 runs as dev (uid 1000) in /home/dev/project with its ENV, and its CMD prints app', async () => {
    const r = await dockerRun(IMAGES.app, ['sh', '-c', 'id -u; id -g; pwd; echo "$GREETING"; echo "$PATH"']);
    expect(r.stderr).toBe('');
    expect(r.exitCode).toBe(0);
    expect(r.stdout).toBe(`${APP.uid}\n${APP.gid}\n${APP.workdir}\nhello\n${APP.env.PATH}\n`);
    expect(await dockerRun(IMAGES.app)).toEqual({ stdout: 'app\n', stderr: '', exitCode: 0 });
  });

  it('app:1: /etc/issue is gone, /usr/share/doc holds only README, python3 is the venv\'s, git and patch are there', async () => {
    const r = await dockerRun(IMAGES.app, [
      'sh',
      '-c',
      'test ! -e /etc/issue && ls -A /usr/share/doc && cat /usr/share/doc/README && python3 -c "import sys; print(sys.prefix)" && git --version >/dev/null && patch --version >/dev/null && echo ok',
    ]);
    expect(r).toEqual({ stdout: 'README\nreplaced\n/opt/venv\nok\n', stderr: '', exitCode: 0 });
  });

  it('app2:1 has the marker and the base\'s /etc/issue; exit codes pass through', async () => {
    const r = await dockerRun(IMAGES.app2, ['sh', '-c', `cat ${APP.app2Marker} && test -e /etc/issue && id -u && exit 7`]);
    expect(r).toEqual({ stdout: 'app2\n0\n', stderr: '', exitCode: 7 });
  });

  it('dockerRun: input reaches stdin, no network unless asked for', async () => {
    expect(await dockerRun(IMAGES.app, ['cat'], { input: 'typed\n' })).toEqual({ stdout: 'typed\n', stderr: '', exitCode: 0 });
    const ifaces = await dockerRun(IMAGES.app, ['ls', '/sys/class/net']);
    expect(ifaces.stdout.split('\n').filter(Boolean)).toEqual(['lo']);
  });
});

describe(`the registry on ${REGISTRY}`, () => {
  beforeEach((ctx) => skipWith(ctx, skipRegistry));

  const accept = 'application/vnd.docker.distribution.manifest.v2+json';
  const get = async (path: string, headers: Record<string, string> = {}) => {
    const res = await fetch(`http://${REGISTRY}/v2/${path}`, { headers });
    expect(res.status, `GET /v2/${path}`).toBe(200);
    return res.json() as Promise<any>;
  };

  it('holds app:1 and app2:1 as pushed from Docker: configs of the saved images, the base layer blob shared', async () => {
    const app = await get('msbx-test/app/manifests/1', { accept });
    const app2 = await get('msbx-test/app2/manifests/1', { accept });
    if (!skipArchives) {
      expect(app.config.digest).toBe(saved(f.app).configDigest);
      expect(app2.config.digest).toBe(saved(f.app2).configDigest);
    }
    expect(app.layers).toHaveLength(2);
    expect(app2.layers).toHaveLength(2);
    expect(app2.layers[0].digest).toBe(app.layers[0].digest);
    expect(app2.layers[1].digest).not.toBe(app.layers[1].digest);
    const config = await get(`msbx-test/app/blobs/${app.config.digest}`);
    expect(config.config.User).toBe(APP.user);
  });
});

it.skipIf(!f.required)('under .ci/run every fixture is there and usable by this user', () => {
  expect({ skip: f.skip, dockerSkip: f.dockerSkip, registrySkip: f.registrySkip }).toEqual({ skip: undefined, dockerSkip: undefined, registrySkip: undefined });
});
