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
 * Child processes (fork) cannot import .ts on Node 20, so transpile the
 * layer store and what it imports (lib/errors.ts, lib/files, lib/layers)
 * once into plain ESM .js (imports already end in .js). Returns the
 * transpiled lib/ directory.
 */
export function transpiledLayers(outRoot: string): string {
  const out = path.join(outRoot, 'lib');
  mkdirSync(outRoot, { recursive: true });
  writeFileSync(path.join(outRoot, 'package.json'), '{"type":"module"}\n');
  for (const rel of ['errors.ts', 'files', 'layers']) {
    const src = path.join(repoRoot, 'lib', rel);
    const files = rel.endsWith('.ts') ? [src] : readdirSync(src).filter((f) => f.endsWith('.ts')).map((f) => path.join(src, f));
    for (const file of files) {
      const js = ts.transpileModule(readFileSync(file, 'utf8'), {
        compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
      }).outputText;
      const dest = path.join(out, path.relative(path.join(repoRoot, 'lib'), file).replace(/\.ts$/, '.js'));
      mkdirSync(path.dirname(dest), { recursive: true });
      writeFileSync(dest, js);
    }
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
