/**
 * The one way lib/cluster (and the server's placement) reaches Redis: a queue
 * URL read into ioredis options, credentials from the URL, a file or the
 * environment, and a client whose connection errors are reported, not lost.
 */
import { isIP } from 'node:net';
import { closeSync, constants, fstatSync, openSync, readFileSync } from 'node:fs';
import { Redis, type RedisOptions } from 'ioredis';
import { ClusterError } from './errors.js';

/** The environment variable a Redis password may come from; removed once read, so children never see it. */
export const REDIS_PASSWORD_ENV = 'MINISANDBOX_REDIS_PASSWORD';

export interface RedisClientOptions {
  /** The password (ACL user's, or `requirepass`); also from the URL, `passwordFile` or MINISANDBOX_REDIS_PASSWORD: give one. */
  password?: string;
  /** A file holding the password (one line). If it is the caller's own, it must be private (mode 0600), as ssh wants of a key. */
  passwordFile?: string;
  /** The ACL user; also from the URL. */
  username?: string;
  /**
   * TLS even for a `redis://` URL (`rediss://` implies it). `ca`, `cert`,
   * `key` are PEM text, as node:tls takes them (the CLI reads `--redis-ca
   * FILE`); `rejectUnauthorized: false` is for tests only.
   */
  tls?: boolean | { ca?: string; cert?: string; key?: string; rejectUnauthorized?: boolean };
}

export interface QueueTarget {
  /** The URL without its password, for messages. */
  display: string;
  queueName: string;
  connection: RedisOptions;
}

const QUEUE_NAME = /^[A-Za-z0-9._-]+$/;
/** A password is one line; a bigger file is the wrong file. */
const MAX_PASSWORD_FILE_BYTES = 4096;

function reason(e: unknown): string {
  const err = e as NodeJS.ErrnoException;
  if (err?.code === 'ENOENT') return 'no such file';
  if (err?.code === 'EACCES' || err?.code === 'EPERM') return 'permission denied';
  if (err?.code === 'EISDIR') return 'a directory, not a file';
  return err?.message ?? String(e);
}

function readPasswordFile(path: string, fail: (why: string) => ClusterError): string {
  let fd: number;
  try {
    // O_NONBLOCK: opening a FIFO nobody writes to would wait forever.
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (e) {
    throw fail(`password file ${path}: ${reason(e)}`);
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw fail(`password file ${path}: not a regular file${st.isFIFO() ? ` (for a password a command prints, set ${REDIS_PASSWORD_ENV}=$(command))` : ''}`);
    // ssh's rule for private keys (as serve --auth-token-file): a file of
    // ours must be private; one another user owns (a secret mounted for
    // this service's user) is as its owner set it up.
    if (st.uid === process.getuid?.() && (st.mode & 0o077) !== 0) {
      const mode = (st.mode & 0o777).toString(8).padStart(4, '0');
      throw fail(`password file ${path}: mode ${mode} lets group or others read or replace the password; chmod 600 ${path}`);
    }
    if (st.size > MAX_PASSWORD_FILE_BYTES) throw fail(`password file ${path}: ${st.size} bytes is too much for a password (at most ${MAX_PASSWORD_FILE_BYTES}); is it the right file?`);
    const password = readFileSync(fd, 'utf8').replace(/\r?\n$/, '');
    if (password === '') throw fail(`password file ${path}: the file is empty`);
    return password;
  } catch (e) {
    if (e instanceof ClusterError) throw e;
    throw fail(`password file ${path}: ${reason(e)}`);
  } finally {
    closeSync(fd);
  }
}

/**
 * `redis://[user:pass@]HOST:PORT/NAME` or `rediss://...` (TLS). NAME is the
 * queue's name (required, [A-Za-z0-9._-]+). Password also from passwordFile
 * (ssh's mode rule, as serve --auth-token-file) or MINISANDBOX_REDIS_PASSWORD
 * (deleted from the environment once read). Errors: ClusterError naming the
 * URL and the reason.
 */
export function parseQueueUrl(url: string, opts: RedisClientOptions = {}): QueueTarget {
  // Read (and drop) the environment's password first, whatever follows: a
  // refused URL must not leave it for the sandboxes this process starts.
  const fromEnv = process.env[REDIS_PASSWORD_ENV];
  delete process.env[REDIS_PASSWORD_ENV];

  let u: URL;
  try {
    u = new URL(url);
  } catch {
    // The raw text may hold a password: show only what precedes any '@'.
    throw new ClusterError(`queue URL ${JSON.stringify(url.replace(/\/\/[^@/]*@/, '//***@'))}: not a URL (expected redis://HOST:PORT/NAME or rediss://HOST:PORT/NAME)`);
  }
  const secure = u.protocol === 'rediss:';
  const user = decodeURIComponent(u.username) || opts.username;
  const shown = `${u.protocol}//${user ? `${encodeURIComponent(user)}@` : ''}${u.host}${u.pathname}`;
  const fail = (why: string) => new ClusterError(`queue URL ${shown}: ${why}`);
  if (u.protocol !== 'redis:' && !secure) throw fail(`the scheme must be redis:// or rediss:// (TLS), not ${u.protocol}//`);
  if (u.hostname === '') throw fail('no host');
  if (u.search !== '' || u.hash !== '') throw fail('a queue URL takes no ?query or #fragment');
  if (u.username && opts.username && decodeURIComponent(u.username) !== opts.username) throw fail(`the URL's user and the username option differ; give one`);
  const queueName = u.pathname.replace(/^\//, '');
  if (queueName === '') throw fail('no queue name (redis://HOST:PORT/NAME: NAME names the queue)');
  if (!QUEUE_NAME.test(queueName)) throw fail(`queue name ${JSON.stringify(queueName)}: only letters, digits, '.', '_' and '-'`);

  const sources: [string, () => string][] = [];
  if (u.password) sources.push(['the URL', () => decodeURIComponent(u.password)]);
  if (opts.password !== undefined) sources.push(['the password option', () => opts.password!]);
  if (opts.passwordFile !== undefined) sources.push(['--redis-password-file', () => readPasswordFile(opts.passwordFile!, fail)]);
  if (fromEnv !== undefined) sources.push([REDIS_PASSWORD_ENV, () => fromEnv]);
  if (sources.length > 1) throw fail(`${sources.map((s) => s[0]).join(' and ')} both give the password; give one`);
  let password: string | undefined;
  if (sources.length === 1) {
    password = sources[0]![1]();
    // An empty variable or option must not silently mean "no password".
    if (password === '') throw fail(`${sources[0]![0]} gives an empty password`);
  }

  const port = u.port === '' ? 6379 : Number(u.port);
  const connection: RedisOptions = {
    host: u.hostname.replace(/^\[(.*)\]$/, '$1'),
    port,
    // BullMQ's blocking connections must wait for Redis, not fail a command
    // after N retries; it refuses a connection that sets a limit.
    maxRetriesPerRequest: null,
  };
  if (user) connection.username = user;
  if (password !== undefined) connection.password = password;
  if (secure || opts.tls) {
    const t = typeof opts.tls === 'object' ? opts.tls : {};
    connection.tls = {
      // SNI names a host, never an address (RFC 6066; Node warns, DEP0123).
      ...(isIP(connection.host ?? '') === 0 ? { servername: connection.host } : {}),
      ...(t.ca !== undefined ? { ca: t.ca } : {}),
      ...(t.cert !== undefined ? { cert: t.cert } : {}),
      ...(t.key !== undefined ? { key: t.key } : {}),
      ...(t.rejectUnauthorized !== undefined ? { rejectUnauthorized: t.rejectUnauthorized } : {}),
    };
  }
  return { display: shown, queueName, connection };
}

/** The last connection error of each client connectRedis made, for the message of a later failure. */
const lastErrors = new WeakMap<Redis, Error>();

/**
 * A client for `target` (maxRetriesPerRequest: null, as BullMQ needs). ioredis
 * emits connection errors as events and retries; an 'error' listener keeps
 * the last one so that they are neither printed as unhandled nor lost:
 * `redisProblem(client)` says why the client is not connected, and
 * `waitForRedis` turns a Redis that stays unreachable into a ClusterError.
 */
export function connectRedis(target: QueueTarget): Redis {
  const client = new Redis({ ...target.connection, maxRetriesPerRequest: null, lazyConnect: false });
  client.on('error', (err: Error) => lastErrors.set(client, err));
  return client;
}

/** Why `client` is not usable now (its last connection error), or undefined. */
export function redisProblem(client: Redis): string | undefined {
  const err = lastErrors.get(client);
  if (!err) return undefined;
  const code = (err as NodeJS.ErrnoException).code;
  return code && !err.message.includes(code) ? `${code}: ${err.message}` : err.message;
}

/** Resolves once `client` answers PING; a ClusterError naming the URL and the last reason after `timeoutMs`. */
export async function waitForRedis(client: Redis, target: QueueTarget, timeoutMs = 10_000): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      reject(new ClusterError(`Redis at ${target.display}: no answer within ${timeoutMs / 1000}s${redisProblem(client) ? ` (${redisProblem(client)})` : ''}`));
    }, timeoutMs);
  });
  try {
    await Promise.race([client.ping(), timeout]);
  } catch (e) {
    if (e instanceof ClusterError) throw e;
    throw new ClusterError(`Redis at ${target.display}: ${(e as Error).message}`, { cause: e });
  } finally {
    clearTimeout(timer);
  }
}
