/**
 * `minisandbox serve`: run the SWE-ReX-compatible server until SIGINT or
 * SIGTERM, then close every sandbox it created.
 */
import { closeSync, constants, fstatSync, openSync, readFileSync } from 'node:fs';
import { ArgReader, UsageError } from '../cli/args.js';
import { ConfigError, describeErrno } from '../sandbox/errors.js';
import type { Limits } from '../sandbox/index.js';
import { parseSize } from '../sandbox/limits.js';
import { MIN_OUTPUT_BYTES } from '../shell/index.js';
import { authTokenProblem } from './http.js';
import { startServer, type ServerOptions } from './server.js';

export const AUTH_TOKEN_ENV = 'MINISANDBOX_AUTH_TOKEN';

export const SERVE_HELP = `Usage: minisandbox serve --auth-token-file FILE [OPTIONS]
       ${AUTH_TOKEN_ENV}=TOKEN minisandbox serve [OPTIONS]
       minisandbox serve --auth-token TOKEN [OPTIONS]

Serves the SWE-ReX remote-runtime protocol (what swerex-remote serves), so
SWE-agent, SWE-ReX's RemoteRuntime and RL trainers drive MiniSandbox
sandboxes unchanged. The root paths (/is_alive, /run_in_session, ...) use a
default sandbox created on first use; POST /sandboxes creates more, each
served under /sandboxes/<id>/. See docs/server.md.

The token clients send as X-API-Key comes from exactly one of:
  --auth-token-file FILE   the file's content, without its trailing newline.
                           A file you own must not be accessible to group or
                           others (chmod 600), as ssh asks of private keys
  ${AUTH_TOKEN_ENV}   the environment; removed from the server's own
                           environment once read, so nothing it starts
                           inherits it
  --auth-token TOKEN       the command line, as swerex-remote takes it: every
                           local user can read it with ps while the server
                           starts. '' turns authentication off
Prefer the file or the variable.

Options:
  --host HOST            address to listen on (default 127.0.0.1)
  --port PORT            port (default 8000; 0 picks a free one)
  --max-sandboxes N      most sandboxes alive at once (default: no limit)
  --max-body-bytes N     largest JSON request body (default 16 MiB)
  --max-upload-bytes N   largest /upload body (default 512 MiB)
  --max-output SIZE      most output kept per request and stream (/execute's
                         stdout and stderr each, a session run's output), as
                         bytes or 512k, 8m (default 1m, at least 16k); past it
                         the middle is replaced by '[... N bytes truncated ...]'
  --memory SIZE          memory limit of every sandbox (e.g. 2g)
  --pids N               process limit of every sandbox
  --cpu CORES            CPU limit of every sandbox (e.g. 1.5)
  --network none|host    network of every sandbox (default none)
  --quiet                no log line per request (time, method, path, status,
                         duration) on stderr`;

/** Where the token came from: the CLI hides an --auth-token value from ps. */
export type TokenSource = '--auth-token' | '--auth-token-file' | typeof AUTH_TOKEN_ENV;

export interface ServeArgs {
  options: ServerOptions;
  tokenSource: TokenSource;
}

/** A token is one line; a bigger file is the wrong file. */
const MAX_TOKEN_FILE_BYTES = 4096;

function fsReason(e: unknown): string {
  const err = e as NodeJS.ErrnoException;
  if (err.code === 'ENOENT') return 'no such file';
  if (err.code === 'EACCES') return 'permission denied';
  return typeof err.errno === 'number' ? describeErrno(Math.abs(err.errno)) : String(err.message);
}

function readTokenFile(path: string): string {
  const fail = (why: string) => new UsageError(`--auth-token-file ${path}: ${why}`);
  let fd: number;
  try {
    // O_NONBLOCK: opening a FIFO that nobody writes to would wait forever.
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (e) {
    throw fail(fsReason(e));
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) {
      throw fail(`not a regular file${st.isFIFO() ? ` (for a token a command prints, set ${AUTH_TOKEN_ENV}=$(command))` : ''}`);
    }
    // ssh's rule for private keys: a file of ours must be private. One that
    // another user owns (a secret root mounted for this service's user) is
    // as its owner set it up, and we could not chmod it anyway.
    if (st.uid === process.getuid?.() && (st.mode & 0o077) !== 0) {
      const mode = (st.mode & 0o777).toString(8).padStart(4, '0');
      throw fail(`mode ${mode} lets group or others read or replace the token; chmod 600 ${path}`);
    }
    if (st.size > MAX_TOKEN_FILE_BYTES) throw fail(`${st.size} bytes is too much for a token (at most ${MAX_TOKEN_FILE_BYTES}); is it the right file?`);
    return readFileSync(fd, 'utf8').replace(/\r?\n$/, '');
  } catch (e) {
    if (e instanceof UsageError) throw e;
    throw fail(fsReason(e));
  } finally {
    closeSync(fd);
  }
}

/**
 * The token from its one source. A token from a file or the environment
 * may not be empty: an empty file or an unset variable expanded to '' must
 * not silently turn authentication off.
 */
function resolveToken(flag: string | undefined, file: string | undefined, fromEnv: string | undefined): { token: string; source: TokenSource } {
  const given: string[] = [];
  if (flag !== undefined) given.push('--auth-token');
  if (file !== undefined) given.push('--auth-token-file');
  if (fromEnv !== undefined) given.push(AUTH_TOKEN_ENV);
  if (given.length > 1) {
    const names = given.length === 2 ? `${given[0]} and ${given[1]} both` : `${given.slice(0, -1).join(', ')} and ${given.at(-1)} all`;
    throw new UsageError(`${names} give the auth token; give exactly one`);
  }
  let token: string;
  let source: TokenSource;
  if (flag !== undefined) [token, source] = [flag, '--auth-token'];
  else if (file !== undefined) {
    [token, source] = [readTokenFile(file), '--auth-token-file'];
    if (token === '') throw new UsageError(`--auth-token-file ${file}: the file is empty (to turn authentication off, pass --auth-token '')`);
  } else if (fromEnv !== undefined) {
    [token, source] = [fromEnv, AUTH_TOKEN_ENV];
    if (token === '') throw new UsageError(`${AUTH_TOKEN_ENV} is set but empty (to turn authentication off, pass --auth-token '')`);
  } else {
    // As swerex-remote: the token must be chosen explicitly, even if empty.
    throw new UsageError(`an auth token is required: --auth-token-file FILE, ${AUTH_TOKEN_ENV}, or --auth-token TOKEN ('' turns authentication off)`);
  }
  const problem = authTokenProblem(token);
  if (problem) throw new UsageError(`${source === '--auth-token-file' ? `--auth-token-file ${file}` : source}: no client could send this token: ${problem}`);
  return { token, source };
}

function positiveInt(option: string, value: string, min = 1): number {
  const n = Number(value);
  if (!Number.isInteger(n) || n < min) throw new UsageError(`${option}: expected an integer >= ${min}, got '${value}'`);
  return n;
}

/**
 * Reads `serve`'s arguments. The token variable is removed from `env`
 * whatever happens next, so no child of this process inherits it.
 */
export function parseServeArgs(args: string[], env: NodeJS.ProcessEnv = process.env): ServeArgs {
  const fromEnv = env[AUTH_TOKEN_ENV];
  delete env[AUTH_TOKEN_ENV];
  const r = new ArgReader(args);
  let flagToken: string | undefined;
  let tokenFile: string | undefined;
  const opts: Omit<ServerOptions, 'authToken'> = {};
  const limits: Limits = {};
  let network: 'none' | 'host' | undefined;
  let quiet = false;
  while (!r.done) {
    const arg = r.next();
    switch (arg) {
      case '--auth-token':
        if (flagToken !== undefined) throw new UsageError('--auth-token given twice');
        flagToken = r.value(arg);
        break;
      case '--auth-token-file':
        if (tokenFile !== undefined) throw new UsageError('--auth-token-file given twice');
        tokenFile = r.value(arg);
        break;
      case '--host':
        opts.host = r.value(arg);
        break;
      case '--port':
        opts.port = positiveInt(arg, r.value(arg), 0);
        if (opts.port > 65535) throw new UsageError(`--port: ${opts.port} is not a port number`);
        break;
      case '--max-sandboxes':
        opts.maxSandboxes = positiveInt(arg, r.value(arg));
        break;
      case '--max-body-bytes':
        opts.maxBodyBytes = positiveInt(arg, r.value(arg));
        break;
      case '--max-upload-bytes':
        opts.maxUploadBytes = positiveInt(arg, r.value(arg));
        break;
      case '--max-output': {
        const v = r.value(arg);
        let n: number;
        try {
          n = parseSize(arg, v);
        } catch (e) {
          throw new UsageError(e instanceof ConfigError ? e.message : String(e));
        }
        if (n < MIN_OUTPUT_BYTES) throw new UsageError(`${arg}: ${v} is below the minimum of ${MIN_OUTPUT_BYTES} bytes (16k): a session needs room for its markers`);
        opts.maxOutputBytes = n;
        break;
      }
      case '--memory':
        limits.memory = r.value(arg);
        break;
      case '--pids':
        limits.pids = positiveInt(arg, r.value(arg));
        break;
      case '--cpu': {
        const v = r.value(arg);
        const cpu = Number(v);
        if (!(cpu > 0)) throw new UsageError(`--cpu: expected a positive number of cores, got '${v}'`);
        limits.cpu = cpu;
        break;
      }
      case '--network': {
        const v = r.value(arg);
        if (v !== 'none' && v !== 'host') throw new UsageError(`--network: expected none or host, got '${v}'`);
        network = v;
        break;
      }
      case '--quiet':
        quiet = true;
        break;
      default:
        throw new UsageError(`unknown option '${arg}'`);
    }
  }
  const { token: authToken, source: tokenSource } = resolveToken(flagToken, tokenFile, fromEnv);
  if (!quiet) opts.log = (line) => process.stderr.write(`${line}\n`);
  const sandboxDefaults = { ...(Object.keys(limits).length ? { limits } : {}), ...(network ? { network } : {}) };
  return { options: { ...opts, authToken, sandboxDefaults }, tokenSource };
}

/**
 * /proc/<pid>/cmdline is readable by every local user. Node can rewrite it
 * (process.title overwrites the original argv), which hides an --auth-token
 * value from ps from now on; it was visible until here.
 */
function hideTokenFromPs(args: string[]): void {
  const shown = args.map((a, i) => (i > 0 && args[i - 1] === '--auth-token' && a !== '' ? '***' : a));
  process.title = [process.argv0, ...process.execArgv, process.argv[1] ?? '', 'serve', ...shown].join(' ');
}

export async function serveCommand(args: string[]): Promise<number> {
  const { options, tokenSource } = parseServeArgs(args);
  if (tokenSource === '--auth-token' && options.authToken !== '') hideTokenFromPs(args);
  const server = await startServer(options);
  if (options.authToken === '') process.stderr.write('minisandbox serve: warning: authentication disabled (empty --auth-token)\n');
  else if (tokenSource === '--auth-token') {
    process.stderr.write(
      `minisandbox serve: warning: --auth-token showed the token to every local user (ps) while the server started; use --auth-token-file or ${AUTH_TOKEN_ENV}\n`,
    );
  }
  process.stderr.write(`minisandbox serve: listening on ${server.url}\n`);
  await new Promise<void>((resolve) => {
    const stop = () => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      resolve();
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
  process.stderr.write('minisandbox serve: closing sandboxes\n');
  await server.close();
  return 0;
}
