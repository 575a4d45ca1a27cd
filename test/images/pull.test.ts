/**
 * `image pull` from the loopback registry of the fixtures: the image runs
 * as imported; a second image on the same base fetches and stores only its
 * own layer; a `docker save` of the same image then adds no layer.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { getImage, importImage, pullImage, runImage, type ImageRecord } from '../../lib/images/index.js';
import type { PullProgress } from '../../lib/images/registry.js';
import type { LayerStore } from '../../lib/layers/index.js';
import { cli } from '../cli/helpers.js';
import { imageFixtures } from './fixtures.js';
import { tempStore } from './helpers.js';

const f = imageFixtures();

describe.skipIf(f.registrySkip)('image pull from the loopback registry', () => {
  let t: Awaited<ReturnType<typeof tempStore>>;
  let store: LayerStore;
  const app = `${f.registry}/msbx-test/app:1`;
  const app2 = `${f.registry}/msbx-test/app2:1`;

  beforeAll(async () => {
    t = await tempStore();
    store = t.store;
  });
  afterAll(async () => {
    await t?.remove();
  });

  it('pulls an image (CLI), which then runs its Cmd', async () => {
    const r = cli(['image', 'pull', '--insecure', '--store', store.root, app], { timeout: 180_000 });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).toMatch(new RegExp(`^pulled [0-9a-f]{12} +${app.replace(/[.]/g, '\\.')} +2 layers`));
    const rec = await getImage(store, app);
    expect(rec.manifestDigest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect((await runImage(store, app)).stdout).toBe('app\n');
  }, 240_000);

  it('fetches and stores only the new layer of an image on the same base', async () => {
    const before = (await store.list()).length;
    const progress: PullProgress[] = [];
    const rec: ImageRecord = await pullImage(store, app2, { insecure: true, onProgress: (p) => progress.push(p) });
    expect(rec.layers).toHaveLength(2);
    expect(progress.at(-1)?.totalLayers).toBe(1);
    expect((await store.list()).length).toBe(before + 1);
    expect((await runImage(store, app2, ['cat', '/opt/app2/marker'])).exitCode).toBe(0);
  }, 120_000);

  it.skipIf(f.skip)('shares its layers with the same image from docker save', async () => {
    const before = (await store.list()).length;
    const [rec] = await importImage(store, f.app);
    expect(rec!.layers).toEqual((await getImage(store, app)).layers);
    expect((await store.list()).length).toBe(before);
  }, 120_000);
});
