/**
 * The package root, apart from the addon's loader: the CLI's --version and
 * --help need it on a machine where the addon cannot load.
 */
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The package root, found from this file whether run from lib/ or dist/lib/. */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) || !existsSync(join(dir, 'binding.gyp'))) {
    const up = dirname(dir);
    if (up === dir) throw new Error('minisandbox: cannot find the package root (binding.gyp)');
    dir = up;
  }
  return dir;
}
