/**
 * The machine's local package indexes (/opt/pypi, /opt/pypi-more), served
 * over HTTP on loopback so that an environment's install commands can reach
 * them from inside the build sandbox (and a `docker build`), where /opt is
 * not shown.
 *
 * Why HTTP and not a bind: `prepare` builds venvs in a sandbox whose root
 * is the host's /usr and a few /etc entries; a task's recipe is only shell
 * commands, with no way to ask for a mount. With `installNetwork: 'host'`
 * the build shares the host's network, so a server on 127.0.0.1 reaches it,
 * and the same URL serves `docker build --network host`.
 *
 * Each process serves on a port of its own (listen on 0): the install
 * commands name no index, pip finds it in PIP_INDEX_URL and
 * PIP_EXTRA_INDEX_URL, given to the install step as variables that are not
 * part of the venv's recipe key (TaskEnvs' installVariables, a docker build
 * ARG), so a venv built under one port is reused under another.
 */
import { createReadStream, existsSync, statSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { join, normalize } from 'node:path';
import { SweError } from '../../lib/swe/errors.js';

/** The served roots: URL prefix -> directory holding `simple/` and `files/`. */
export const INDEX_ROOTS: Record<string, string> = { pypi: '/opt/pypi', 'pypi-more': '/opt/pypi-more' };

/** Where the wheels the workload takes its sources from may be. */
export const WHEEL_DIRS = ['/opt/pypi/files', '/opt/pypi-more/files', '/opt/wheels'];

/** Why the local indexes cannot be used, or undefined when they can. */
export function indexesMissing(): string | undefined {
  const missing = Object.values(INDEX_ROOTS).filter((dir) => !existsSync(join(dir, 'simple')));
  return missing.length ? `the local package indexes are missing (${missing.map((d) => `${d}/simple`).join(', ')})` : undefined;
}

/** The variables that make pip install from the indexes served at `url` only. */
export function pipIndexVariables(url: string): Record<string, string> {
  const [first, ...rest] = Object.keys(INDEX_ROOTS);
  return { PIP_INDEX_URL: `${url}/${first}/simple`, PIP_EXTRA_INDEX_URL: rest.map((r) => `${url}/${r}/simple`).join(' ') };
}

export interface ServedIndex {
  url: string;
  /** For the install step's environment: pipIndexVariables(url). */
  variables: Record<string, string>;
  close(): Promise<void>;
}

/** Serves the indexes read-only, on a free loopback port, until close(). */
export async function serveIndexes(): Promise<ServedIndex> {
  const why = indexesMissing();
  if (why) throw new SweError(`cannot serve the package indexes: ${why}`);
  const server: Server = createServer((req, res) => {
    const [, prefix, ...rest] = decodeURIComponent(new URL(req.url ?? '/', 'http://index').pathname).split('/');
    const root = prefix !== undefined ? INDEX_ROOTS[prefix] : undefined;
    const relative = normalize(rest.join('/'));
    if (!root || relative.startsWith('..') || relative.includes('\0')) return void res.writeHead(404).end();
    let file = join(root, relative);
    try {
      if (statSync(file).isDirectory()) file = join(file, 'index.html');
      const size = statSync(file).size;
      res.writeHead(200, { 'content-length': size, 'content-type': file.endsWith('.html') ? 'text/html' : 'application/octet-stream' });
      if (req.method === 'HEAD') return void res.end();
      createReadStream(file).on('error', () => res.destroy()).pipe(res);
    } catch {
      res.writeHead(404).end();
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => resolve());
  });
  // Never what keeps a benchmark process alive.
  server.unref();
  const url = `http://127.0.0.1:${(server.address() as { port: number }).port}`;
  return {
    url,
    variables: pipIndexVariables(url),
    close: () => new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}
