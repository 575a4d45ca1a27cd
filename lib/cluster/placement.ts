/**
 * Placement of interactive sandboxes across `serve` nodes, on Redis.
 *
 * Every node registers a hash `<prefix>node:<url>` (its advertised URL, an
 * instance id, its slots, how many sandboxes it holds) that lives only as
 * long as its heartbeat keeps renewing the TTL, so a node that dies drops
 * out of placement by itself, with nobody to notice. `place()` reserves a
 * slot on the node with the most free slots in one Lua script: Redis runs a
 * script alone, so concurrent creates on any number of nodes can never hand
 * out more slots than a node has. A reservation is a token in the node's
 * `<prefix>resv:<url>` sorted set, scored by when it lapses: the node
 * claims it when the create arrives (the token leaves the set and the
 * node's count grows in one step), a failed create drops it (dropping twice
 * is harmless), and one whose placer died lapses by itself, so no slot
 * leaks. Each sandbox also gets `<prefix>sbx:<id>`
 * (its node and that node's instance id), renewed by its node's heartbeat
 * while it lives and deleted when it is closed: any node can tell a request
 * about another node's sandbox where it lives, or that its node is gone.
 *
 * Keys are built inside the scripts from the prefix, which suits one Redis
 * server (as BullMQ's queues do), not Redis Cluster.
 */
import { randomBytes } from 'node:crypto';
import type { Redis } from 'ioredis';
import { ClusterError } from './errors.js';
import { connectRedis, parseQueueUrl, redisProblem, waitForRedis, type QueueTarget, type RedisClientOptions } from './redis.js';

export interface PlacementOptions {
  /** `redis://[user:pass@]HOST:PORT/NAME`: NAME names the cluster (nodes placing among each other). */
  queue: string;
  /** Password, TLS and user for Redis, as lib/cluster/redis.ts reads them. */
  redis?: RedisClientOptions;
  /** This node's URL as the other nodes and the clients reach it. */
  advertise: string;
  /** Sandboxes this node takes at most. */
  slots: number;
  /**
   * How long a node stays in placement after its last heartbeat (default
   * 15 s; heartbeats go every third of it). It bounds how long a dead node
   * can still be picked, and how long creates aimed at it then fail over.
   */
  heartbeatTtlMs?: number;
  /**
   * How long a sandbox's entry outlives its node's last heartbeat (default
   * 24 h): within it, requests about the sandbox hear that its node is gone;
   * after it, only that no such sandbox exists.
   */
  goneMemoryMs?: number;
  /** Most time a Redis call may take before the request it serves fails (default 5 s). */
  redisTimeoutMs?: number;
  /** How long a reservation waits to be claimed before it lapses (default 2 min: a create takes seconds). */
  reservationMs?: number;
  /** Sandboxes this node holds now (re-registration after a lost key starts from it). */
  localCount: () => number;
  /** The ids of this node's sandboxes, whose entries each heartbeat renews. */
  localIds: () => string[];
  /** Told about heartbeats that failed (Redis unreachable); default: nothing. */
  warn?: (message: string) => void;
}

export interface NodeInfo {
  url: string;
  slots: number;
  /** Sandboxes it holds. */
  used: number;
  /** Slots reserved for creates on their way to it. */
  reserved: number;
  free: number;
  self: boolean;
}

/** Where a sandbox that is not here lives: its node, and whether that node is still registered. */
export interface SandboxLocation {
  id: string;
  node: string;
  alive: boolean;
}

/** The outcome of a placement: the chosen node and the token of the slot reserved there, or why none could be. */
export type Placed =
  | { node: string; token: string; self: boolean; free: number }
  | { node: null; nodes: number; slots: number; used: number };

// Redis's clock in ms, so that every node's reservations lapse on one clock.
const NOW = `local t = redis.call('TIME') local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

// KEYS[1] nodes set. ARGV[1] prefix, ARGV[2] this node's URL, ARGV[3] token,
// ARGV[4] how long the reservation holds (ms), ARGV[5..] nodes to skip. Free is
// slots - held sandboxes - live reservations. Most free wins; among equals the
// first in URL order, unless this node is among them (no hop). Nodes whose hash
// expired are dropped from the set here.
const PLACE = `
${NOW}
local skip = {}
for i = 5, #ARGV do skip[ARGV[i]] = true end
local urls = redis.call('SMEMBERS', KEYS[1])
table.sort(urls)
local best, bestFree = false, 0
local nodes, slots, used = 0, 0, 0
for _, url in ipairs(urls) do
  local v = redis.call('HMGET', ARGV[1] .. 'node:' .. url, 'slots', 'used')
  if not v[1] then
    redis.call('SREM', KEYS[1], url)
  else
    local resv = ARGV[1] .. 'resv:' .. url
    redis.call('ZREMRANGEBYSCORE', resv, '-inf', now)
    local s, u = tonumber(v[1]), tonumber(v[2] or '0') + redis.call('ZCARD', resv)
    nodes, slots, used = nodes + 1, slots + s, used + u
    local free = s - u
    if not skip[url] and (free > bestFree or (free == bestFree and free > 0 and url == ARGV[2])) then
      best, bestFree = url, free
    end
  end
end
if best then
  local resv = ARGV[1] .. 'resv:' .. best
  redis.call('ZADD', resv, now + tonumber(ARGV[4]), ARGV[3])
  redis.call('PEXPIRE', resv, 2 * tonumber(ARGV[4]))
  return {best, bestFree}
end
return {false, nodes, slots, used}
`;

// KEYS[1] this node's hash, KEYS[2] its reservations. ARGV[1] instance, ARGV[2]
// a token place() gave ('' for this node's own use: its default sandbox, taken
// only if a slot is free). -1: the hash is gone (rejoin first).
const CLAIM = `
${NOW}
local v = redis.call('HMGET', KEYS[1], 'instance', 'slots', 'used')
if v[1] ~= ARGV[1] then return -1 end
if ARGV[2] == '' then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if tonumber(v[3] or '0') + redis.call('ZCARD', KEYS[2]) >= tonumber(v[2]) then return 0 end
else
  redis.call('ZREM', KEYS[2], ARGV[2])
end
redis.call('HINCRBY', KEYS[1], 'used', 1)
return 1
`;

// KEYS[1] this node's hash. ARGV[1] instance. One sandbox fewer.
const UNCOUNT = `
local v = redis.call('HMGET', KEYS[1], 'instance', 'used')
if v[1] == ARGV[1] and tonumber(v[2] or '0') > 0 then redis.call('HINCRBY', KEYS[1], 'used', -1) end
return 0
`;

// KEYS[1] this node's hash, KEYS[2] nodes set. ARGV: url, instance, slots, ttl ms,
// used (the node's own count, for a hash that is missing), mode ('register' refuses
// a hash of another live instance: two nodes cannot advertise one URL).
const HEARTBEAT = `
local current = redis.call('HGET', KEYS[1], 'instance')
if current and current ~= ARGV[2] then
  if ARGV[6] == 'register' then return current end
end
local answer = 'ok'
if current ~= ARGV[2] then
  if ARGV[6] ~= 'register' then answer = 'rejoined' end
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[1], 'url', ARGV[1], 'instance', ARGV[2], 'used', ARGV[5])
end
redis.call('HSET', KEYS[1], 'slots', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('SADD', KEYS[2], ARGV[1])
return answer
`;

const DEFAULT_TTL_MS = 15_000;
const DEFAULT_RESERVATION_MS = 120_000;
const DEFAULT_GONE_MEMORY_MS = 24 * 3600_000;

/** A node's membership in a cluster: registration, heartbeat, slot reservations, the sandbox map. */
export class Placement {
  readonly target: QueueTarget;
  readonly url: string;
  readonly slots: number;
  readonly instance = randomBytes(8).toString('hex');
  readonly ttlMs: number;
  readonly #goneMemoryMs: number;
  readonly #timeoutMs: number;
  readonly #prefix: string;
  readonly #redis: Redis;
  readonly #opts: PlacementOptions;
  #timer: NodeJS.Timeout | undefined;
  #beating: Promise<void> | null = null;
  #warned = false;
  #stopped = false;

  private constructor(opts: PlacementOptions, target: QueueTarget, redis: Redis) {
    this.#opts = opts;
    this.target = target;
    this.#redis = redis;
    this.url = opts.advertise.replace(/\/+$/, '');
    this.slots = opts.slots;
    this.ttlMs = opts.heartbeatTtlMs ?? DEFAULT_TTL_MS;
    this.#goneMemoryMs = opts.goneMemoryMs ?? DEFAULT_GONE_MEMORY_MS;
    this.#timeoutMs = opts.redisTimeoutMs ?? 5000;
    this.#prefix = `msbx:serve:${target.queueName}:`;
  }

  /** Connects, registers this node (refusing a URL another live node advertises) and starts the heartbeat. */
  static async start(opts: PlacementOptions): Promise<Placement> {
    if (!Number.isSafeInteger(opts.slots) || opts.slots < 1) throw new ClusterError(`placement: slots must be a positive integer, got ${String(opts.slots)}`);
    const ttl = opts.heartbeatTtlMs ?? DEFAULT_TTL_MS;
    if (!Number.isFinite(ttl) || ttl < 300) throw new ClusterError(`placement: the heartbeat TTL must be at least 300 ms, got ${String(ttl)}`);
    let advertised: URL;
    try {
      advertised = new URL(opts.advertise);
    } catch {
      throw new ClusterError(`placement: advertised URL ${JSON.stringify(opts.advertise)} is not a URL (expected http://HOST:PORT)`);
    }
    if (advertised.protocol !== 'http:' && advertised.protocol !== 'https:') throw new ClusterError(`placement: advertised URL ${opts.advertise}: expected http:// or https://`);
    // A wildcard address is where a server listens, not where anyone can reach it.
    if (['0.0.0.0', '[::]'].includes(advertised.hostname)) {
      throw new ClusterError(`placement: advertised URL ${opts.advertise} names a wildcard address that other nodes cannot reach; give --advertise http://THIS-NODE:PORT`);
    }
    const target = parseQueueUrl(opts.queue, opts.redis);
    const redis = connectRedis(target);
    const p = new Placement(opts, target, redis);
    try {
      await waitForRedis(redis, target, opts.redisTimeoutMs ?? 10_000);
      const answer = await p.#heartbeat('register', 0);
      if (answer !== 'ok') throw new ClusterError(`placement on ${target.display}: node ${p.url} is already registered by another live server (instance ${answer}); give each node its own --advertise URL`);
    } catch (e) {
      redis.disconnect();
      throw e;
    }
    // Three beats per TTL: one lost or late beat does not drop a live node.
    p.#timer = setInterval(() => void p.#beat(), Math.max(100, Math.floor(p.ttlMs / 3)));
    p.#timer.unref();
    return p;
  }

  #key(kind: 'node' | 'sbx' | 'resv', name: string): string {
    return `${this.#prefix}${kind}:${name}`;
  }

  /** A Redis call that fails with the URL and the reason instead of waiting on a Redis that does not answer. */
  async #call<T>(what: string, run: () => Promise<T>): Promise<T> {
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        const why = redisProblem(this.#redis);
        reject(new ClusterError(`placement: ${what}: Redis at ${this.target.display} did not answer within ${this.#timeoutMs / 1000}s${why ? ` (${why})` : ''}`));
      }, this.#timeoutMs);
    });
    try {
      return await Promise.race([run(), timeout]);
    } catch (e) {
      if (e instanceof ClusterError) throw e;
      throw new ClusterError(`placement: ${what}: Redis at ${this.target.display}: ${(e as Error).message}`, { cause: e });
    } finally {
      clearTimeout(timer);
    }
  }

  #heartbeat(mode: 'register' | 'beat', used: number): Promise<unknown> {
    return this.#call('heartbeat', () =>
      this.#redis.eval(HEARTBEAT, 2, this.#key('node', this.url), `${this.#prefix}nodes`, this.url, this.instance, this.slots, this.ttlMs, used, mode),
    );
  }

  async #beat(): Promise<void> {
    if (this.#beating || this.#stopped) return;
    this.#beating = (async () => {
      try {
        const answer = await this.#heartbeat('beat', this.#opts.localCount());
        if (answer === 'rejoined') {
          // Its hash expired: Redis was away, or this process was too busy to beat within the TTL.
          this.#opts.warn?.(`placement: node ${this.url} had left placement (no heartbeat for ${this.ttlMs / 1000}s) and joined again with ${this.#opts.localCount()} of ${this.slots} slots in use`);
        }
        const ids = this.#opts.localIds();
        if (ids.length > 0) {
          const multi = this.#redis.multi();
          for (const id of ids) multi.pexpire(this.#key('sbx', id), this.#goneMemoryMs);
          await this.#call('renewing sandbox entries', () => multi.exec());
        }
        if (this.#warned) this.#opts.warn?.(`placement: heartbeat to ${this.target.display} works again`);
        this.#warned = false;
      } catch (e) {
        // Said once per outage: a beat every few seconds would flood the log.
        if (!this.#warned) this.#opts.warn?.(`${(e as Error).message}; this node leaves placement once its last heartbeat is ${this.ttlMs / 1000}s old`);
        this.#warned = true;
      } finally {
        this.#beating = null;
      }
    })();
    await this.#beating;
  }

  /**
   * Reserves a slot on the node with the most free slots (this node among
   * equals), skipping `exclude` (nodes that just failed to answer or were
   * full). The create sent there carries the token, which that node claims;
   * if the create fails, drop() gives the slot back.
   */
  async place(exclude: readonly string[] = []): Promise<Placed> {
    const token = randomBytes(12).toString('hex');
    const r = (await this.#call('placing a sandbox', () =>
      this.#redis.eval(PLACE, 1, `${this.#prefix}nodes`, this.#prefix, this.url, token, this.#opts.reservationMs ?? DEFAULT_RESERVATION_MS, ...exclude),
    )) as [string | null, ...unknown[]];
    if (r[0]) return { node: r[0], token, free: Number(r[1]), self: r[0] === this.url };
    return { node: null, nodes: Number(r[1]), slots: Number(r[2]), used: Number(r[3]) };
  }

  /** Gives back a reservation that no sandbox took (again is harmless: the token is gone). */
  async drop(node: string, token: string): Promise<void> {
    await this.#call(`releasing a slot of ${node}`, () => this.#redis.zrem(this.#key('resv', node), token));
  }

  /**
   * Counts a sandbox this node starts creating: under the token another
   * node (or this one) reserved for it, or, without one, only if a slot is
   * free. Returns false when none is.
   */
  async claim(token = ''): Promise<boolean> {
    const run = () =>
      this.#call('claiming a slot', () => this.#redis.eval(CLAIM, 2, this.#key('node', this.url), this.#key('resv', this.url), this.instance, token));
    const r = Number(await run());
    if (r === -1) {
      // The node's hash expired (Redis away, or this process starved past the TTL):
      // join again from our own count, which includes this creation already.
      await this.#heartbeat('beat', this.#opts.localCount());
      return true;
    }
    return r === 1;
  }

  /** One sandbox of this node fewer (its creation failed, or it was closed). */
  async uncount(): Promise<void> {
    await this.#call('freeing a slot', () => this.#redis.eval(UNCOUNT, 1, this.#key('node', this.url), this.instance));
  }

  /** Records that sandbox `id` lives here, for requests that reach another node. */
  async adopt(id: string): Promise<void> {
    const key = this.#key('sbx', id);
    await this.#call(`recording sandbox ${id}`, () => this.#redis.multi().hset(key, 'node', this.url, 'instance', this.instance).pexpire(key, this.#goneMemoryMs).exec());
  }

  /** Sandbox `id` of this node was closed: its entry goes and its slot is free again. */
  async forget(id: string): Promise<void> {
    await this.#call(`forgetting sandbox ${id}`, () => this.#redis.del(this.#key('sbx', id)));
    await this.uncount();
  }

  /** Where sandbox `id` lives, or null when no node recorded it (or its entry expired). */
  async locate(id: string): Promise<SandboxLocation | null> {
    const [node, instance] = await this.#call(`locating sandbox ${id}`, () => this.#redis.hmget(this.#key('sbx', id), 'node', 'instance'));
    if (!node) return null;
    const live = await this.#call(`locating sandbox ${id}`, () => this.#redis.hget(this.#key('node', node), 'instance'));
    // The same URL registered by a new instance is a restarted server: the sandbox died with the old one.
    return { id, node, alive: live !== null && live === instance };
  }

  /** The registered nodes and their slots, in URL order. */
  async nodes(): Promise<NodeInfo[]> {
    const urls = (await this.#call('listing nodes', () => this.#redis.smembers(`${this.#prefix}nodes`))).sort();
    const out: NodeInfo[] = [];
    for (const url of urls) {
      const [slots, used] = await this.#call('listing nodes', () => this.#redis.hmget(this.#key('node', url), 'slots', 'used'));
      if (slots === null) continue;
      const reserved = await this.#call('listing nodes', () => this.#redis.zcount(this.#key('resv', url), `(${Date.now()}`, '+inf'));
      const n = { slots: Number(slots), used: Number(used ?? 0), reserved };
      out.push({ url, ...n, free: n.slots - n.used - n.reserved, self: url === this.url });
    }
    return out;
  }

  /**
   * Leaves placement at once (no waiting for the TTL). The sandbox entries
   * stay, so requests about them hear that this node is gone.
   */
  async stop(): Promise<void> {
    if (this.#stopped) return;
    this.#stopped = true;
    clearInterval(this.#timer);
    await this.#beating;
    try {
      await this.#call('leaving placement', () => this.#redis.eval(`if redis.call('HGET', KEYS[1], 'instance') == ARGV[1] then redis.call('DEL', KEYS[1]) end return 0`, 1, this.#key('node', this.url), this.instance));
    } catch (e) {
      // Redis away: the TTL removes the node instead.
      this.#opts.warn?.((e as Error).message);
    }
    this.#redis.disconnect();
  }
}
