/**
 * The machine's local package indexes (pip's `extra-index-url
 * file:///opt/pypi/simple ...`), served over HTTP on loopback so that an
 * environment's install commands can reach them from inside the build
 * sandbox (and a `docker build`), where /opt is not shown.
 *
 * Why HTTP and not a bind: `prepare` builds venvs in a sandbox whose root
 * is the host's /usr and a few /etc entries; a task's recipe is only shell
 * commands, with no way to ask for a mount. With `installNetwork: 'host'`
 * the build shares the host's network, so a server on 127.0.0.1 reaches it,
 * and the same URL serves `docker build --network host`. The port is fixed
 * because the URL is part of the install commands, and so of the recipe
 * key under which the store reuses a venv.
 */
import { createReadStream, existsSync, statSync } from 'node:fs';
import { createServer, get, type Server } from 'node:http';
import { join, normalize } from 'node:path';
import { SweError } from '../../lib/swe/errors.js';

export const INDEX_PORT = 38517;
export const INDEX_URL = `http://127.0.0.1:${INDEX_PORT}`;
const MARKER_PATH = '/msbx-suite-index';
const MARKER = 'minisandbox bench-suite package index\n';

/** The served roots: URL prefix -> directory holding `simple/` and `files/`. */
export const INDEX_ROOTS: Record<string, string> = { pypi: '/opt/pypi', 'pypi-more': '/opt/pypi-more' };

/** Where the wheels the workload takes its sources from may be. */
export const WHEEL_DIRS = ['/opt/pypi/files', '/opt/pypi-more/files', '/opt/wheels'];

/** Why the local indexes cannot be used, or undefined when they can. */
export function indexesMissing(): string | undefined {
  const missing = Object.values(INDEX_ROOTS).filter((dir) => !existsSync(join(dir, 'simple')));
  return missing.length ? `the local package indexes are missing (${missing.map((d) => `${d}/simple`).join(', ')})` : undefined;
}

/** pip arguments that install from the served indexes only. */
export function pipIndexArgs(): string {
  const [first, ...rest] = Object.keys(INDEX_ROOTS);
  return [`--index-url ${INDEX_URL}/${first}/simple`, ...rest.map((r) => `--extra-index-url ${INDEX_URL}/${r}/simple`)].join(' ');
}

export interface ServedIndex {
  url: string;
  /** False when another process (another builder, the runner) was already serving it. */
  ours: boolean;
  close(): Promise<void>;
}

function probe(): Promise<boolean> {
  return new Promise((resolve) => {
    const req = get(`${INDEX_URL}${MARKER_PATH}`, { timeout: 2000 }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (d: string) => (body += d));
      res.on('end', () => resolve(body === MARKER));
    });
    req.on('error', () => resolve(false));
    req.on('timeout', () => req.destroy());
  });
}

/**
 * Serves the indexes read-only until close(). When the port is taken by
 * another process serving the same indexes, that one is used; anything else
 * on the port is an error naming it.
 */
export async function serveIndexes(): Promise<ServedIndex> {
  const why = indexesMissing();
  if (why) throw new SweError(`cannot serve the package indexes: ${why}`);
  const server: Server = createServer((req, res) => {
    const url = new URL(req.url ?? '/', INDEX_URL);
    if (url.pathname === MARKER_PATH) return void res.end(MARKER);
    const [, prefix, ...rest] = decodeURIComponent(url.pathname).split('/');
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
  const listening = await new Promise<boolean>((resolve, reject) => {
    server.once('error', (err: NodeJS.ErrnoException) => (err.code === 'EADDRINUSE' ? resolve(false) : reject(err)));
    server.listen(INDEX_PORT, '127.0.0.1', () => resolve(true));
  });
  if (!listening) {
    if (await probe()) return { url: INDEX_URL, ours: false, close: async () => {} };
    throw new SweError(`cannot serve the package indexes on 127.0.0.1:${INDEX_PORT}: the port is taken by something else`);
  }
  // Never what keeps a benchmark process alive.
  server.unref();
  return {
    url: INDEX_URL,
    ours: true,
    close: () => new Promise<void>((resolve) => {
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}
