/**
 * The Redis connection's options, for every command that reaches a Redis
 * (serve --queue, worker, eval --queue, prepare --queue): the flags, their
 * help, and their reading into lib/cluster's RedisClientOptions, declared
 * once so that every command takes the same flags and explains them alike.
 */
import { readFileSync } from 'node:fs';
// lib/cluster/redis.ts, not its index: serve loads it anyway, the index would add BullMQ to serve's start.
import { REDIS_PASSWORD_ENV, type RedisClientOptions } from '../cluster/redis.js';
import { fsReason, readableFile, UsageError, type Args, type OptionSpec } from './args.js';

/** The connection flags, listed under `section` of the command's --help (the one its --queue is in). */
export function redisOptions(section: string): Record<string, OptionSpec> {
  return {
    '--redis-password-file': {
      values: ['FILE'],
      section,
      help: `Redis's password (or the ACL user's), one line; also from the URL
(visible to ps) or ${REDIS_PASSWORD_ENV}: give one. A file you own must be
chmod 600`,
    },
    '--redis-user': { values: ['USER'], section, help: 'Redis ACL user (also USER@ in the URL)' },
    '--redis-tls': { section, help: 'TLS to Redis with a redis:// URL (rediss:// implies it)' },
    '--redis-ca': {
      values: ['FILE'],
      check: readableFile,
      section,
      help: "PEM CA certificate(s) that Redis's certificate must chain to (implies TLS; default: the system CAs)",
    },
    '--redis-cert': { values: ['FILE'], check: readableFile, section, help: 'PEM client certificate, for a Redis that asks for one (with --redis-key)' },
    '--redis-key': { values: ['FILE'], check: readableFile, section, help: 'PEM private key of --redis-cert' },
  };
}

/** The connection flags' names, for the commands that refuse them without --queue. */
export const REDIS_FLAGS: readonly string[] = Object.keys(redisOptions(''));

/** The connection the flags describe, as parseQueueUrl and startServer's cluster take it. */
export function redisClientOptions(args: Args): RedisClientOptions {
  if (args.has('--redis-cert') !== args.has('--redis-key')) throw new UsageError('--redis-cert and --redis-key go together');
  const pem = (flag: '--redis-ca' | '--redis-cert' | '--redis-key') => {
    const file = args.get(flag);
    if (file === undefined) return {};
    try {
      return { [flag.slice('--redis-'.length)]: readFileSync(file, 'utf8') };
    } catch (e) {
      throw new UsageError(`${flag} ${file}: ${fsReason(e)}`);
    }
  };
  const tlsFiles = { ...pem('--redis-ca'), ...pem('--redis-cert'), ...pem('--redis-key') };
  const tls = Object.keys(tlsFiles).length > 0 ? tlsFiles : args.has('--redis-tls') ? true : undefined;
  const passwordFile = args.get('--redis-password-file');
  const username = args.get('--redis-user');
  return { ...(passwordFile !== undefined ? { passwordFile } : {}), ...(username !== undefined ? { username } : {}), ...(tls ? { tls } : {}) };
}

/** Options that mean something only with --queue are refused without it, not ignored. */
export function refuseWithoutQueue(args: Args, flags: readonly string[]): void {
  if (args.has('--queue')) return;
  const stray = flags.filter((f) => args.has(f));
  if (stray.length) throw new UsageError(`${stray.join(', ')} ${stray.length === 1 ? 'needs' : 'need'} --queue redis://HOST:PORT/NAME`);
}
