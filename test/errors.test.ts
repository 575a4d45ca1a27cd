/**
 * One error base across the library: every error class any module of lib/
 * exports is a MinisandboxError, and each has the code docs/architecture.md
 * lists for it, so the table users read stays the truth.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import { MinisandboxError, adopt } from '../lib/errors.js';
import { FileError } from '../lib/files/index.js';
import { LayerError } from '../lib/layers/index.js';
import { ConfigError, SandboxError, SetupError } from '../lib/sandbox/errors.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

function sources(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? sources(join(dir, e.name)) : e.name.endsWith('.ts') ? [join(dir, e.name)] : [],
  );
}

/** Every exported class that is an Error, by name (the CLI's entry point runs the command when imported: left out). */
async function exportedErrorClasses(): Promise<Map<string, typeof Error>> {
  const found = new Map<string, typeof Error>();
  for (const file of sources(join(ROOT, 'lib'))) {
    if (relative(ROOT, file) === join('lib', 'cli', 'main.ts')) continue;
    const mod = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
    for (const value of Object.values(mod)) {
      if (typeof value === 'function' && (value === Error || value.prototype instanceof Error)) found.set(value.name, value as typeof Error);
    }
  }
  return found;
}

/** The rows of the table under "## Errors" in docs/architecture.md: class -> its code cell. */
function documentedCodes(): Map<string, string> {
  const doc = readFileSync(join(ROOT, 'docs', 'architecture.md'), 'utf8');
  const section = doc.slice(doc.indexOf('\n## Errors'));
  const rows = new Map<string, string>();
  for (const m of section.matchAll(/^\| `(\w+)` \| ([^|]+) \|/gm)) rows.set(m[1]!, m[2]!.trim());
  return rows;
}

describe('errors', () => {
  it('every exported error class is a MinisandboxError with the code docs/architecture.md gives it', async () => {
    const classes = await exportedErrorClasses();
    const documented = documentedCodes();
    expect([...classes.keys()].filter((name) => !(classes.get(name)!.prototype instanceof MinisandboxError) && name !== 'MinisandboxError')).toEqual([]);
    expect([...classes.keys()].sort()).toEqual([...documented.keys()].sort());
    const codes = new Map<string, string>();
    for (const [name, cls] of classes) {
      const cell = documented.get(name)!;
      if ((cls as unknown) === SetupError || cls.prototype instanceof SetupError) {
        expect(cell, name).toBe('the errno name');
        continue;
      }
      const code = (cls as unknown as typeof MinisandboxError).code;
      expect(code, name).toMatch(/^MSBX_[A-Z_]+$/);
      expect(cell, name).toContain(`\`${code}\``);
      expect(codes.get(code), `${name} and ${codes.get(code)} share ${code}`).toBeUndefined();
      codes.set(code, name);
    }
  });

  it('an instance carries its class code, its name, and a failed system call its errno name', () => {
    const config = new ConfigError('mounts[0].source: bind source /x does not exist', 'mounts[0].source');
    expect(config).toBeInstanceOf(MinisandboxError);
    expect([config.name, config.code, config.option]).toEqual(['ConfigError', 'MSBX_CONFIG', 'mounts[0].source']);
    const setup = new SetupError('bind /data -> /mnt: source: ENOENT', 'mount', 2);
    expect([setup.code, setup.errno]).toEqual(['ENOENT', 2]);
  });

  it("adopt() makes another room's error the caller's, keeping message and cause; bugs pass through", () => {
    const low = new FileError('layer archive /a.tar: member ../x escapes the layer');
    const adopted = adopt(low, LayerError) as LayerError;
    expect(adopted).toBeInstanceOf(LayerError);
    expect([adopted.message, adopted.code, adopted.cause]).toEqual([low.message, 'MSBX_LAYER', low]);
    const own = new LayerError('x');
    expect(adopt(own, LayerError)).toBe(own);
    const bug = new TypeError('x is undefined');
    expect(adopt(bug, SandboxError)).toBe(bug);
  });
});
