/**
 * The extraction baseline unpacks a layer's kept archive for each sandbox:
 * an archive changed on disk after it was stored (here: swapped for
 * another, valid one) must be refused before anything is unpacked, and
 * `store verify` must say so.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createExtractedEnvSandbox } from '../../lib/env/extractBaseline.js';
import { createEnvSandbox, packAsLayer, type Env } from '../../lib/env/index.js';
import { packDirectory } from '../../lib/files/index.js';
import { openStore, type LayerStore } from '../../lib/layers/index.js';
import { tempDir } from '../helpers.js';

const CLI = fileURLToPath(new URL('../../dist/lib/cli/main.js', import.meta.url));
const fileSha = (file: string) => execFileSync('sha256sum', [file], { encoding: 'utf8' }).split(' ')[0]!;

describe('the extraction baseline checks the archive against the layer digest', () => {
  const tmp = tempDir('msbx-envdigest-');
  const state = path.join(tmp.path, 'state');
  let store: LayerStore;
  let env: Env;
  let archive: string;

  beforeAll(async () => {
    store = await openStore({ root: path.join(tmp.path, 'store') });
    const src = path.join(tmp.path, 'venv-src');
    execFileSync('sh', ['-c', `mkdir -p ${src}/bin && echo good > ${src}/marker`]);
    const packed = await packAsLayer(src, store, { name: 'tiny venv' });
    archive = packed.archive!;
    // A hand-made env around one layer; the system Python under /usr needs no mount.
    env = {
      id: 'env-00000000000000000000000d',
      venv: packed.layer,
      python: { path: '/usr/bin/python3', version: '3', prefix: '/usr' },
      venvPath: '/opt/venv',
      storeRoot: store.root,
      archives: { venv: archive },
      manifest: {
        version: 1,
        id: 'env-00000000000000000000000d',
        created: new Date().toISOString(),
        python: { path: '/usr/bin/python3', version: '3', prefix: '/usr' },
        venvPath: '/opt/venv',
        venv: { digest: packed.layer.digest, archive: path.relative(path.join(store.root, 'envs'), archive), archiveBytes: packed.archiveBytes, repoPrefixFiles: [] },
        steps: [],
      },
    };
  });
  afterAll(() => tmp.remove());

  it('unpacks the archive as stored', async () => {
    await using sb = await createExtractedEnvSandbox(env, { stateDir: state });
    expect((await sb.exec('cat /opt/venv/marker')).stdout).toBe('good\n');
  });

  it('refuses a swapped archive, naming it and both digests, and leaves nothing unpacked', async () => {
    const evilSrc = path.join(tmp.path, 'evil-src');
    execFileSync('sh', ['-c', `mkdir -p ${evilSrc}/bin && echo evil > ${evilSrc}/marker`]);
    rmSync(archive);
    await packDirectory(evilSrc, archive);
    const evil = fileSha(archive);
    expect(evil).not.toBe(env.venv.digest);
    await expect(createExtractedEnvSandbox(env, { stateDir: state })).rejects.toThrow(
      `layer archive ${archive}: sha256 is ${evil}, not the expected ${env.venv.digest}: the archive changed after it was stored; nothing was unpacked`,
    );
    expect(readdirSync(state)).toEqual([]);
    // The store's own tree is untouched, so an overlay sandbox still gets the real layer.
    await using sb = await createEnvSandbox(env, { stateDir: state });
    expect((await sb.exec('cat /opt/venv/marker')).stdout).toBe('good\n');
  });

  it('store verify reports the archive with both digests and exits 1; the layer itself is fine', () => {
    const r = spawnSync(process.execPath, [CLI, 'store', 'verify', '--store', store.root], { encoding: 'utf8', timeout: 20_000 });
    expect(r.status, r.stderr).toBe(1);
    expect(r.stdout).toContain(`ok       layer ${env.venv.digest}`);
    expect(r.stdout).toContain(`  archive ${archive}: sha256 ${fileSha(archive)}, expected ${env.venv.digest} (its layer's digest)\n`);
    const json = JSON.parse(spawnSync(process.execPath, [CLI, 'store', 'verify', env.venv.digest.slice(0, 12), '--store', store.root, '--json'], { encoding: 'utf8' }).stdout) as {
      ok: boolean;
      archives: { path: string; status: string }[];
    };
    expect(json.ok).toBe(false);
    expect(json.archives).toEqual([expect.objectContaining({ path: archive, status: 'mismatch' })]);
  });
});
