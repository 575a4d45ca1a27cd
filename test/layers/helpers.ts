import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync, mkdirSync, chmodSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

/** A fresh temp dir; removed (after making it writable) by the returned cleanup. */
export function tmpDir(tag: string): { dir: string; cleanup: () => void } {
  const dir = mkdtempSync(path.join(os.tmpdir(), `msb-layers-${tag}-`));
  return {
    dir,
    cleanup: () => {
      try {
        execFileSync('chmod', ['-R', 'u+w', dir]);
      } catch {
        /* ignore */
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/**
 * Child processes (fork) cannot import .ts on Node 20, so transpile
 * lib/layers/*.ts once into plain ESM .js (imports already end in .js).
 */
export function transpiledLayers(outRoot: string): string {
  const src = path.join(repoRoot, 'lib', 'layers');
  const out = path.join(outRoot, 'lib', 'layers');
  mkdirSync(out, { recursive: true });
  writeFileSync(path.join(outRoot, 'package.json'), '{"type":"module"}\n');
  for (const f of readdirSync(src)) {
    if (!f.endsWith('.ts')) continue;
    const js = ts.transpileModule(readFileSync(path.join(src, f), 'utf8'), {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
    }).outputText;
    writeFileSync(path.join(out, f.replace(/\.ts$/, '.js')), js);
  }
  return out;
}

/** Debian's python3 for building test archives (readable by any user, unlike pyenv under /root). */
export const sysPython = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

export function py(script: string, args: string[] = []): string {
  return execFileSync(sysPython, ['-c', script, ...args], { encoding: 'utf8' });
}

export function writeTree(root: string, files: Record<string, string | { content: string; mode: number }>): void {
  for (const [rel, v] of Object.entries(files)) {
    const abs = path.join(root, rel);
    mkdirSync(path.dirname(abs), { recursive: true });
    const content = typeof v === 'string' ? v : v.content;
    writeFileSync(abs, content);
    if (typeof v !== 'string') chmodSync(abs, v.mode);
  }
}
