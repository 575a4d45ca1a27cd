/**
 * `minisandbox serve`: run the SWE-ReX-compatible server until SIGINT or
 * SIGTERM, then close every sandbox it created.
 */
import { closeSync, constants, fstatSync, openSync, readFileSync } from 'node:fs';
import { getSystemErrorMap } from 'node:util';
import type { Limits } from '../../sandbox/index.js';
import { parseSize } from '../../sandbox/limits.js';
import { authTokenProblem } from '../../server/http.js';
import { startServer, type ServerOptions } from '../../server/index.js';
import { MIN_OUTPUT_BYTES } from '../../shell/index.js';
import { CommandError, UsageError, cores, fsReason, oneOf, port, positiveInt, seconds, type Args, type Command, type ValueCheck } from '../args.js';
import { STORE_OPTION } from '../options.js';
import { REDIS_FLAGS, redisClientOptions, redisOptions, refuseWithoutQueue } from '../redis.js';

export const AUTH_TOKEN_ENV = 'MINISANDBOX_AUTH_TOKEN';

const DEFAULT_PORT = 8000;
const DEFAULT_HOST = '127.0.0.1';

/** A size (bytes, or 512k, 8m), as the sandbox limits read it. */
function size(min = 1, why = ''): ValueCheck<number> {
  return (v, name) => {
    let n: number;
    try {
      n = parseSize(name, v);
    } catch (e) {
      throw new UsageError((e as Error).message);
    }
    if (n < min) throw new UsageError(`${name}: ${v} is below the minimum of ${min} bytes${why}`);
    return n;
  };
}

/** Where the token came from: an --auth-token value is hidden from ps. */
type TokenSource = '--auth-token' | '--auth-token-file' | typeof AUTH_TOKEN_ENV;

/** A token is one line; a bigger file is the wrong file. */
const MAX_TOKEN_FILE_BYTES = 4096;

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

const AUTH = `Auth token (exactly one of these, or ${AUTH_TOKEN_ENV})`;
const SANDBOXES = 'Every sandbox';
const CLUSTER = 'Cluster (placement across serve nodes, docs/cluster.md, "Interactive sandboxes")';

const spec: Command['spec'] = {
  name: 'serve',
  usage: [`minisandbox serve --auth-token-file FILE [OPTIONS]`, `${AUTH_TOKEN_ENV}=TOKEN minisandbox serve [OPTIONS]`, `minisandbox serve --auth-token TOKEN [OPTIONS]`],
  about: `Serves the SWE-ReX remote-runtime protocol (what swerex-remote serves), so
SWE-agent, SWE-ReX's RemoteRuntime and RL trainers drive MiniSandbox
sandboxes unchanged. The root paths (/is_alive, /run_in_session, ...) use a
default sandbox created on first use; POST /sandboxes creates more, each
served under /sandboxes/<id>/. See docs/server.md.

The token clients send as X-API-Key comes from exactly one of
--auth-token-file FILE, ${AUTH_TOKEN_ENV} (the environment; removed from
the server's own environment once read, so nothing it starts inherits it)
or --auth-token TOKEN. Prefer the file or the variable.`,
  options: {
    '--auth-token-file': {
      values: ['FILE'],
      section: AUTH,
      help: `The file's content, without its trailing newline. A file you own
must not be accessible to group or others (chmod 600), as ssh asks
of private keys`,
    },
    '--auth-token': {
      values: ['TOKEN'],
      section: AUTH,
      help: `The command line, as swerex-remote takes it: every local user can
read it with ps while the server starts. '' turns authentication off`,
    },
    '--host': { values: ['HOST'], default: DEFAULT_HOST, help: 'Address to listen on' },
    '--port': { values: ['PORT'], check: port, default: String(DEFAULT_PORT), help: 'Port; 0 picks a free one' },
    '--max-sandboxes': { values: ['N'], check: positiveInt, help: 'Most sandboxes alive at once (default: no limit)' },
    '--max-body-bytes': { values: ['N'], check: positiveInt, help: 'Largest JSON request body (default 16 MiB)' },
    '--max-upload-bytes': { values: ['N'], check: positiveInt, help: 'Largest /upload body (default 512 MiB)' },
    '--max-output': {
      values: ['SIZE'],
      check: size(MIN_OUTPUT_BYTES, ' (16k): a session needs room for its markers'),
      help: `Most output kept per request and stream (/execute's stdout and
stderr each, a session run's output), as bytes or 512k, 8m (default 1m,
at least 16k); past it, the middle is replaced by a note of how many bytes
were cut`,
    },
    '--memory': { values: ['SIZE'], check: size(), section: SANDBOXES, help: 'Memory limit of every sandbox (e.g. 2g)' },
    '--pids': { values: ['N'], check: positiveInt, section: SANDBOXES, help: 'Process limit of every sandbox' },
    '--cpu': { values: ['CORES'], check: cores, section: SANDBOXES, help: 'CPU limit of every sandbox (e.g. 1.5)' },
    '--network': { values: ['none|host'], check: oneOf('none', 'host'), section: SANDBOXES, help: 'Network of every sandbox (default none)' },
    '--store': { ...STORE_OPTION, section: SANDBOXES, help: 'The layer store whose images POST /sandboxes {"image": ...} may name' },
    '--quiet': { section: SANDBOXES, help: 'No log line per request (time, method, path, status, duration) on stderr' },
    '--queue': {
      values: ['URL'],
      section: CLUSTER,
      help: `redis://[USER@]HOST:PORT/NAME (rediss:// for TLS): join the cluster NAME.
The node registers its URL and free slots there, and POST /sandboxes on
any node creates the sandbox on the node with the most free slots. Every
node must have the same auth token`,
    },
    '--advertise': { values: ['URL'], section: CLUSTER, help: 'This node\'s URL for clients and other nodes (default: http://HOST:PORT it listens on)' },
    '--slots': { values: ['N'], check: positiveInt, section: CLUSTER, help: 'Sandboxes this node takes (default: --max-sandboxes, else the number of CPUs)' },
    '--heartbeat-ttl': {
      values: ['SECONDS'],
      check: seconds,
      section: CLUSTER,
      help: 'A node that has not sent a heartbeat for this long leaves placement, and its sandboxes are reported gone (default 15)',
    },
    ...redisOptions(CLUSTER),
  },
  exitCodes: `Exit code: 0 after SIGINT or SIGTERM (every sandbox closed); 1 when the
server cannot start (the port is taken...); 2 on usage errors.`,
};

/** The server's options from the command line and the token from its one source. */
function serverOptions(args: Args, fromEnv: string | undefined): { options: ServerOptions; tokenSource: TokenSource } {
  const { token: authToken, source: tokenSource } = resolveToken(args.get('--auth-token'), args.get('--auth-token-file'), fromEnv);
  const limits: Limits = {};
  const memory = args.get<number>('--memory');
  if (memory !== undefined) limits.memory = memory;
  const pids = args.get<number>('--pids');
  if (pids !== undefined) limits.pids = pids;
  const cpu = args.get<number>('--cpu');
  if (cpu !== undefined) limits.cpu = cpu;
  const network = args.get<'none' | 'host'>('--network');
  const optional = <K extends keyof ServerOptions>(key: K, flag: string) => {
    const v = args.get<ServerOptions[K]>(flag);
    return v === undefined ? {} : { [key]: v };
  };
  return {
    tokenSource,
    options: {
      authToken,
      host: args.get('--host')!,
      port: args.get<number>('--port')!,
      ...optional('maxSandboxes', '--max-sandboxes'),
      ...optional('maxBodyBytes', '--max-body-bytes'),
      ...optional('maxUploadBytes', '--max-upload-bytes'),
      ...optional('maxOutputBytes', '--max-output'),
      ...(args.has('--quiet') ? {} : { log: (line: string) => process.stderr.write(`${line}\n`) }),
      sandboxDefaults: { ...(Object.keys(limits).length ? { limits } : {}), ...(network ? { network } : {}) },
      imageStore: args.get('--store')!,
      ...clusterOptions(args),
    },
  };
}

const CLUSTER_ONLY = ['--advertise', '--slots', '--heartbeat-ttl', ...REDIS_FLAGS];

/** The cluster options, or none without --queue (whose companions then mean nothing: refused, not ignored). */
function clusterOptions(args: Args): Pick<ServerOptions, 'cluster'> {
  refuseWithoutQueue(args, CLUSTER_ONLY);
  const queue = args.get('--queue');
  if (queue === undefined) return {};
  const redis = redisClientOptions(args);
  const ttl = args.get<number>('--heartbeat-ttl');
  const advertise = args.get('--advertise');
  const slots = args.get<number>('--slots');
  return {
    cluster: {
      queue,
      redis,
      ...(advertise !== undefined ? { advertise } : {}),
      ...(slots !== undefined ? { slots } : {}),
      ...(ttl !== undefined ? { heartbeatTtlMs: Math.round(ttl * 1000) } : {}),
      warn: (message: string) => process.stderr.write(`minisandbox serve: ${message}\n`),
    },
  };
}

/** A listen error in terms of the flag behind it: `--port 8000: address already in use`. */
function listenError(e: unknown, args: Args): unknown {
  const err = e as NodeJS.ErrnoException;
  if (err.syscall !== 'listen' && err.syscall !== 'getaddrinfo') return e;
  const onPort = err.code === 'EADDRINUSE' || err.code === 'EACCES';
  const flag = onPort ? '--port' : '--host';
  const value = args.get(flag);
  const said = args.has(flag) ? `${flag} ${value}` : `${flag} ${value} (the default)`;
  const reason = err.code === 'ENOTFOUND' ? 'no such host' : ((typeof err.errno === 'number' && getSystemErrorMap().get(err.errno)?.[1]) || err.message);
  const hint = err.code === 'EACCES' && Number(value) < 1024 ? ' (ports below 1024 need privileges)' : '';
  return new CommandError(`${said}: ${reason}${hint}`, { cause: e });
}

/**
 * /proc/<pid>/cmdline is readable by every local user. Node can rewrite it
 * (process.title overwrites the original argv), which hides an --auth-token
 * value and a password in a --queue URL from ps from now on; they were
 * visible until here.
 */
function hideSecretsFromPs(args: readonly string[]): void {
  const queuePassword = (a: string) => a.replace(/^(rediss?:\/\/[^:@/]*):[^@/]*@/, '$1:***@');
  const shown = args.map((a, i) => {
    if (a.startsWith('--auth-token=')) return '--auth-token=***';
    if (a.startsWith('--queue=')) return `--queue=${queuePassword(a.slice('--queue='.length))}`;
    if (i > 0 && args[i - 1] === '--queue') return queuePassword(a);
    return i > 0 && args[i - 1] === '--auth-token' && a !== '' ? '***' : a;
  });
  if (shown.some((a, i) => a !== args[i])) process.title = [process.argv0, ...process.execArgv, process.argv[1] ?? '', 'serve', ...shown].join(' ');
}

const serveCommand: Command = {
  spec,
  async run(args) {
    // Read once and removed, so that nothing this process starts inherits it.
    const fromEnv = process.env[AUTH_TOKEN_ENV];
    delete process.env[AUTH_TOKEN_ENV];
    const { options, tokenSource } = serverOptions(args, fromEnv);
    hideSecretsFromPs(args.argv);
    const server = await startServer(options).catch((e: unknown) => {
      throw listenError(e, args);
    });
    if (options.authToken === '') process.stderr.write('minisandbox serve: warning: authentication disabled (empty --auth-token)\n');
    else if (tokenSource === '--auth-token') {
      process.stderr.write(
        `minisandbox serve: warning: --auth-token showed the token to every local user (ps) while the server started; use --auth-token-file or ${AUTH_TOKEN_ENV}\n`,
      );
    }
    process.stderr.write(`minisandbox serve: listening on ${server.url}\n`);
    if (server.placement) {
      const p = server.placement;
      process.stderr.write(`minisandbox serve: node ${p.url} joined cluster ${p.target.queueName} at ${p.target.display} with ${p.slots} slots\n`);
    }
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
  },
};

export const commands = [serveCommand];
