/**
 * The README stays true to the package: its examples parse as they are on
 * this Node (no `await using`, which Node 20 does not parse), and what it
 * says Node and glibc must be is what package.json and the prebuilds say.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { tempDir } from '../helpers.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const README = readFileSync(join(ROOT, 'README.md'), 'utf8');
const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { engines: { node: string } };
const manifest = JSON.parse(readFileSync(join(ROOT, 'prebuilds/manifest.json'), 'utf8')) as { targets: Record<string, { glibc: string }> };

describe('README', () => {
  const blocks = [...README.matchAll(/```(\w*)\n([\s\S]*?)```/g)].map((m) => ({ lang: m[1]!, code: m[2]! }));

  it('has its API examples as JavaScript that parses as a module on this Node', () => {
    const js = blocks.filter((b) => b.lang === 'js');
    expect(js.length).toBeGreaterThanOrEqual(3);
    expect(blocks.filter((b) => b.lang === 'ts' || b.lang === 'typescript')).toEqual([]);
    const dir = tempDir('msbx-readme-');
    try {
      js.forEach((b, i) => {
        const file = join(dir.path, `example${i}.mjs`);
        writeFileSync(file, b.code);
        const r = spawnSync(process.execPath, ['--check', file], { encoding: 'utf8' });
        expect(r.status, `${b.code}\n${r.stderr}`).toBe(0);
        expect(b.code).not.toMatch(/\bawait using\b|^\s*using\s/m);
      });
    } finally {
      dir.remove();
    }
  });

  it('asks for the Node that engines asks for, and the glibc the prebuilds need', () => {
    const engines = /^>=\s*(\d+\.\d+)$/.exec(pkg.engines.node)?.[1];
    expect(engines).toBeDefined();
    expect(README).toContain(`- Node >= ${engines} `);
    const newest = Object.values(manifest.targets)
      .map((t) => t.glibc)
      .sort((a, b) => Number(a.split('.')[1]) - Number(b.split('.')[1]))
      .at(-1);
    expect(README).toContain(`glibc ${newest} or later`);
  });
});
