/**
 * POST /sandboxes with an image: the sandbox's root is the image of the
 * server's store (test fixture msbx-test/app:1), driven through the SWE-ReX
 * endpoints like any other; an image the store lacks is a 422 naming it,
 * and DELETE releases the image's layers (image rm + gc then collect them).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { importImage, removeImage } from '../../lib/images/index.js';
import type { RunningServer } from '../../lib/server/index.js';
import { APP, IMAGES, imageFixtures } from '../images/fixtures.js';
import { tempStore } from '../images/helpers.js';
import { bashAction, call, commandReq, createSessionReq, get, post, start } from './helpers.js';

const fx = imageFixtures();
if (fx.skip) console.warn(`[server image] SKIP: ${fx.skip}`);

describe.skipIf(fx.skip !== undefined)('POST /sandboxes with an image', () => {
  let server: RunningServer;
  let store: Awaited<ReturnType<typeof tempStore>>;

  beforeAll(async () => {
    store = await tempStore();
    await importImage(store.store, fx.app);
    server = await start({ imageStore: store.store.root });
  }, 180_000);

  afterAll(async () => {
    await server?.close();
    await store?.remove();
  });

  it("runs the image's files with its Env and working directory, as root, and DELETE lets gc take its layers", async () => {
    const created = await post(`${server.url}/sandboxes`, { image: IMAGES.app, env: { EXTRA: 'yes' } });
    expect(created.status, JSON.stringify(created.body)).toBe(200);
    const url: string = `${server.url}/sandboxes/${created.body.id}`;
    expect((await get(url)).body.image).toBe(IMAGES.app);

    const ex = await post(`${url}/execute`, commandReq('pwd; id -u; echo $GREETING $EXTRA; ls /etc/issue; cat /usr/share/doc/README; command -v python3', { shell: true, timeout: 30 }));
    expect(ex.status, JSON.stringify(ex.body)).toBe(200);
    expect(ex.body.stdout).toBe(`${APP.workdir}\n0\nhello yes\nreplaced\n/opt/venv/bin/python3\n`);
    expect(ex.body.stderr).toMatch(/'\/etc\/issue': No such file/);

    // A session: root may edit the image's files (its own view of them).
    expect((await post(`${url}/create_session`, createSessionReq())).status).toBe(200);
    const run = await post(`${url}/run_in_session`, bashAction('echo edited > /etc/hostname.bak && rm /etc/debian_version && ls /etc/debian_version 2>&1 | head -1'));
    expect(run.status, JSON.stringify(run.body)).toBe(200);
    expect(run.body.output).toMatch(/No such file/);

    // While it runs, the image's layers are held: gc after image rm keeps them.
    await removeImage(store.store, IMAGES.app);
    await store.store.gc();
    expect((await store.store.list()).length).toBeGreaterThan(0);
    expect((await call(url, 'DELETE')).status).toBe(200);
    await store.store.gc();
    expect(await store.store.list()).toEqual([]);
  }, 120_000);

  it('an image the store does not have is a 422 naming it, and no sandbox is left', async () => {
    const r = await post(`${server.url}/sandboxes`, { image: 'no/such:image' });
    expect(r.status).toBe(422);
    expect(r.body.detail[0].loc).toEqual(['body', 'image']);
    expect(r.body.detail[0].msg).toMatch(/image no\/such:image: no such image/);
    expect((await get(`${server.url}/sandboxes`)).body.sandboxes).toEqual([]);
  });
});
