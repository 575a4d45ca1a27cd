/**
 * The real test images (scripts/test-images.sh; test/images/fixtures.ts):
 * `docker save` of msbx-test/app:1 imported with the CLI, then the same
 * commands print the same in `docker run` and in an image sandbox; the OCI
 * layout and app2 share its layers; root inside edits its view of the image
 * and never the store; gc collects the layers once the images are gone.
 */
import { spawnSync } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createImageSandbox, getImage, importImage, listImages, removeImage, runImage } from '../../lib/images/index.js';
import type { LayerStore } from '../../lib/layers/index.js';
import { cli } from '../cli/helpers.js';
import { APP, IMAGES, dockerRun, imageFixtures, skipWith } from './fixtures.js';
import { EMPTY, storeIsEmpty, tempStore } from './helpers.js';

const f = imageFixtures();

describe.skipIf(f.skip)('the app image (docker save), imported', () => {
  let t: Awaited<ReturnType<typeof tempStore>>;
  let store: LayerStore;
  let storeDir: string;

  beforeAll(async () => {
    t = await tempStore();
    store = t.store;
    storeDir = store.root;
    const r = cli(['image', 'import', f.app, '--store', storeDir], { timeout: 180_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^imported [0-9a-f]{12} +msbx-test\/app:1 +2 layers/);
    // Progress went to stderr, one line per layer outside a terminal.
    expect(r.stderr).toMatch(/storing layer 2\/2 [0-9a-f]{12}: done/);
  }, 240_000);

  afterAll(async () => {
    await t?.remove();
  });

  it('records the config: Env, WorkingDir, User, Cmd (image inspect)', () => {
    const r = cli(['image', 'inspect', IMAGES.app, '--store', storeDir]);
    expect(r.status, r.stderr).toBe(0);
    const rec = JSON.parse(r.stdout);
    expect(rec.names).toEqual([IMAGES.app]);
    expect(rec.layers).toHaveLength(2);
    expect(rec.config).toEqual({ Env: [`PATH=${APP.env.PATH}`, `GREETING=${APP.env.GREETING}`], WorkingDir: APP.workdir, User: APP.user, Cmd: APP.cmd });
    expect(rec.owners).toBe(process.getuid?.() === 0 ? 'kept' : 'range');
    expect(cli(['image', 'ls', '--store', storeDir]).stdout).toContain(IMAGES.app);
  });

  const same: Array<[string, string[]]> = [
    ['its Cmd', []],
    ['python3 -c', ['python3', '-c', 'import sys, os; print(sys.prefix, sys.version_info[:2], os.environ["GREETING"])']],
    ['ls of the deleted /etc/issue', ['ls', '-l', APP.deleted]],
    ['ls of the opaque /usr/share/doc', ['sh', '-c', `ls -A ${APP.opaqueDir}; stat -c '%a %u %g %s %Y %n' ${APP.opaqueDir}/README; cat ${APP.opaqueDir}/README`]],
    ['pwd', ['pwd']],
    ['id', ['id']],
    ['git --version', ['git', '--version']],
    ['owners and modes of image files', ['stat', '-c', '%a %u %g %n', '/home/dev', APP.workdir, '/etc/shadow', '/etc/gshadow', '/usr/share/doc']],
    ['an exit code', ['sh', '-c', 'echo out; echo err >&2; exit 5']],
  ];
  for (const [what, argv] of same) {
    it(`prints what docker run prints: ${what}`, async (ctx) => {
      skipWith(ctx, f.dockerSkip);
      const [ours, docker] = await Promise.all([runImage(store, IMAGES.app, argv.length > 0 ? argv : undefined), dockerRun(IMAGES.app, argv)]);
      expect({ stdout: ours.stdout, stderr: ours.stderr, exitCode: ours.exitCode }).toEqual(docker);
    });
  }

  it('prints what docker run prints: env (but HOSTNAME, and the LANG every sandbox sets)', async (ctx) => {
    skipWith(ctx, f.dockerSkip);
    const lines = (s: string) => s.split('\n').filter((l) => l && !/^(HOSTNAME|LANG)=/.test(l)).sort();
    const [ours, docker] = await Promise.all([runImage(store, IMAGES.app, ['env']), dockerRun(IMAGES.app, ['env'])]);
    expect(lines(ours.stdout)).toEqual(lines(docker.stdout));
  });

  it('image run passes the exit code through and applies --user, --workdir, --env', () => {
    const r = cli(['image', 'run', '--store', storeDir, '--user', 'root', '--workdir', '/made/here', '--env', 'X=1', IMAGES.app, '--', 'sh', '-c', 'id -u; pwd; echo $X $GREETING; exit 7']);
    expect(r.stdout).toBe('0\n/made/here\n1 hello\n');
    expect(r.status).toBe(7);
    expect(cli(['image', 'run', '--store', storeDir, 'msbx-test/nope:1']).status).toBe(125);
  });

  it('root inside a sandbox of the image can rm, chmod and chown its files; the store does not change', async () => {
    const sb = await createImageSandbox(store, IMAGES.app, { user: 'root' });
    try {
      const r = await sb.exec(['sh', '-c', 'set -e; chmod 600 /usr/share/doc/README; rm /etc/passwd-; rm -r /home/dev/project; chown 0:0 /home/dev; echo x >> /etc/shadow; stat -c "%a %u %n" /usr/share/doc/README /home/dev; ls /etc/passwd- 2>&1 || true']);
      expect(r.stderr).toBe('');
      expect(r.stdout).toBe("600 0 /usr/share/doc/README\n755 0 /home/dev\nls: cannot access '/etc/passwd-': No such file or directory\n");
      // Its commands run as the image's user otherwise.
      expect((await createImageSandbox(store, IMAGES.app).then(async (s) => { try { return (await s.exec(['id', '-un'])).stdout; } finally { await s.close(); } }))).toBe('dev\n');
    } finally {
      await sb.close();
    }
    expect((await store.verify()).map((c) => c.status)).toEqual(['ok', 'ok']);
    expect((await runImage(store, IMAGES.app, ['stat', '-c', '%a %n', '/usr/share/doc/README', '/etc/passwd-'])).stdout).toBe('644 /usr/share/doc/README\n644 /etc/passwd-\n');
  });

  it('store du counts the image layers, and says which directories it could not read', async () => {
    const du = await store.du();
    expect(du.layers).toBe(2);
    expect(du.apparentBytes).toBeGreaterThan(50 * 1024 * 1024);
    // A directory an image user owns and keeps to itself maps, for an
    // unprivileged caller, to a subordinate id the caller cannot list as:
    // du skips and counts exactly what find(1) cannot read either.
    const layers = (await store.list()).map((l) => l.path);
    const denied = spawnSync('find', layers, { encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 }).stderr.split('\n').filter((l) => /Permission denied/.test(l)).length;
    expect(du.unreadableDirs).toBe(denied);
    if (process.getuid?.() === 0) expect(du.unreadableDirs).toBe(0);
  });

  it('the OCI layout of the same image reuses its layers; app2 stores only its own layer', async () => {
    const before = (await store.list()).map((l) => l.digest);
    const oci = await importImage(store, f.appOci, { names: ['app-oci:1'] });
    expect(oci[0]!.layers).toEqual((await getImage(store, IMAGES.app)).layers);
    expect((await store.list()).map((l) => l.digest)).toEqual(before);
    const [app2] = await importImage(store, f.app2);
    expect(app2!.layers.slice(0, 1)).toEqual((await getImage(store, IMAGES.app)).layers.slice(0, 1));
    expect((await store.list()).length).toBe(3);
    expect((await runImage(store, IMAGES.app2, ['cat', APP.app2Marker])).exitCode).toBe(0);
  }, 120_000);

  it('gc keeps the layers while images use them and collects them after image rm', async () => {
    expect((await store.gc()).removedLayers).toEqual([]);
    for (const r of await listImages(store)) for (const n of r.names.length > 0 ? r.names : [r.id]) await removeImage(store, n);
    expect(cli(['image', 'ls', '--store', storeDir]).stdout).toBe('no images\n');
    const r = cli(['store', 'gc', '--store', storeDir], { timeout: 60_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(/^removed 3 unused layer/);
    expect(await storeIsEmpty(store)).toEqual(EMPTY);
  }, 120_000);
});
