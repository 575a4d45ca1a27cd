/**
 * Test client for the server: requests shaped like the Python client's
 * `model_dump()` output (every field present, discriminators included).
 */
import { spawn, spawnSync } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { startServer, type RunningServer, type ServerOptions } from '../../lib/server/index.js';

export const TOKEN = 'test-token-' + Math.random().toString(36).slice(2);

export function start(opts: Partial<ServerOptions> = {}): Promise<RunningServer> {
  return startServer({ port: 0, authToken: TOKEN, ...opts });
}

export interface Reply {
  status: number;
  body: any;
  ms: number;
}

export async function call(
  url: string,
  method: string,
  body?: unknown,
  headers: Record<string, string> = { 'x-api-key': TOKEN },
): Promise<Reply> {
  const t0 = performance.now();
  const init: RequestInit = { method, headers: { ...headers } };
  if (body !== undefined) {
    init.body = typeof body === 'string' || body instanceof Uint8Array ? (body as string) : JSON.stringify(body);
    (init.headers as Record<string, string>)['content-type'] ??= 'application/json';
  }
  const r = await fetch(url, init);
  const text = await r.text();
  return { status: r.status, body: text ? JSON.parse(text) : null, ms: performance.now() - t0 };
}

export const post = (url: string, body?: unknown, headers?: Record<string, string>) => call(url, 'POST', body, headers);
export const get = (url: string, headers?: Record<string, string>) => call(url, 'GET', undefined, headers);

// ---- model_dump() shapes (swerex.runtime.abstract, v1.4)

export const createSessionReq = (o: Partial<{ startup_source: string[]; session: string; startup_timeout: number }> = {}) => ({
  startup_source: [],
  session: 'default',
  session_type: 'bash',
  startup_timeout: 1.0,
  ...o,
});

export const bashAction = (
  command: string,
  o: Partial<{ session: string; timeout: number | null; check: string; error_msg: string; expect: string[]; is_interactive_command: boolean; is_interactive_quit: boolean }> = {},
) => ({
  command,
  session: 'default',
  timeout: null,
  is_interactive_command: false,
  is_interactive_quit: false,
  check: 'raise',
  error_msg: '',
  expect: [],
  action_type: 'bash',
  ...o,
});

export const interruptAction = (o: Partial<{ session: string; timeout: number; n_retry: number; expect: string[] }> = {}) => ({
  session: 'default',
  timeout: 0.2,
  n_retry: 3,
  expect: [],
  action_type: 'bash_interrupt',
  ...o,
});

export const closeSessionReq = (session = 'default') => ({ session, session_type: 'bash' });

export const commandReq = (
  command: string | string[],
  o: Partial<{ timeout: number | null; shell: boolean; check: boolean; error_msg: string; env: Record<string, string> | null; cwd: string | null; merge_output_streams: boolean }> = {},
) => ({
  command,
  timeout: null,
  shell: false,
  check: false,
  error_msg: '',
  env: null,
  cwd: null,
  merge_output_streams: false,
  ...o,
});

export const readFileReq = (path: string, encoding: string | null = null, errors: string | null = null) => ({ path, encoding, errors });
export const writeFileReq = (path: string, content: string) => ({ content, path });

/** multipart/form-data as aiohttp's FormData sends it for RemoteRuntime.upload. */
export function uploadForm(file: Buffer, targetPath: string, unzip: boolean, filename = 'zipped_transfer.zip'): FormData {
  const form = new FormData();
  form.append('file', new Blob([new Uint8Array(file)], { type: unzip ? 'application/zip' : 'application/octet-stream' }), filename);
  form.append('target_path', targetPath);
  form.append('unzip', unzip ? 'true' : 'false');
  return form;
}

export async function upload(url: string, form: FormData, headers: Record<string, string> = { 'x-api-key': TOKEN }): Promise<Reply> {
  const t0 = performance.now();
  const r = await fetch(`${url}/upload`, { method: 'POST', body: form, headers });
  return { status: r.status, body: await r.json(), ms: performance.now() - t0 };
}

// ---- `minisandbox serve` as users run it: the built CLI in its own process

const CLI = fileURLToPath(new URL('../../dist/lib/cli/main.js', import.meta.url));

export interface ServeProcess {
  url: string;
  pid: number;
  /** What the server wrote to stderr so far. */
  stderr(): string;
  /** SIGTERM, then wait for the exit (the server closes its sandboxes). */
  stop(): Promise<void>;
}

/** Our environment without the token variable, so a test sets it only where it means to. */
export function cleanEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const { MINISANDBOX_AUTH_TOKEN: _, ...env } = process.env;
  return { ...env, ...extra };
}

/** Starts `minisandbox serve --port 0 ARGS` and resolves once it listens. */
export function startServe(args: string[], env: NodeJS.ProcessEnv = cleanEnv()): Promise<ServeProcess> {
  const child = spawn(process.execPath, [CLI, 'serve', '--port', '0', ...args], { env, stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return new Promise((resolve, reject) => {
    child.stderr.on('data', (d: Buffer) => {
      err += d.toString();
      const m = /listening on (\S+)/.exec(err);
      if (m) {
        resolve({
          url: m[1]!,
          pid: child.pid!,
          stderr: () => err,
          stop: async () => {
            child.kill('SIGTERM');
            await exited;
          },
        });
      }
    });
    child.once('exit', (code) => reject(new Error(`serve exited (${code}) before listening: ${err}`)));
  });
}

/** Runs `minisandbox serve ARGS` to completion: for usage errors and --help, which return at once. */
export function serveSync(args: string[], env: NodeJS.ProcessEnv = cleanEnv()): { status: number | null; stdout: string; stderr: string } {
  const r = spawnSync(process.execPath, [CLI, 'serve', '--port', '0', ...args], { env, encoding: 'utf8', timeout: 20_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** Starts a new peak: VmHWM drops to the current RSS (proc(5), clear_refs "5"). */
export function resetPeakRss(pid: number): void {
  writeFileSync(`/proc/${pid}/clear_refs`, '5');
}

/** Peak resident memory of a process (VmHWM), in MiB. */
export function peakRssMiB(pid: number): number {
  const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m![1]) / 1024;
}
