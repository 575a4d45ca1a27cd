/**
 * `startServer()`: a SWE-ReX-compatible HTTP server over MiniSandbox.
 *
 * Routes (all behind X-API-Key):
 * - `POST /sandboxes`, `GET /sandboxes`, `GET|DELETE /sandboxes/<id>`: management.
 * - `/sandboxes/<id>/<endpoint>`: the SWE-ReX endpoints of that sandbox.
 * - `/<endpoint>` at the root: the same on a default sandbox, created by the
 *   first request that needs it, so an unmodified client pointed at
 *   `http://host:port` just works.
 *
 * Every handler is asynchronous (sandboxed processes, pty sessions), so a
 * long command in one session never delays another request.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { availableParallelism } from 'node:os';
import { ClusterError } from '../cluster/errors.js';
import { Placement, type PlacementOptions } from '../cluster/placement.js';
import { ImageError } from '../images/errors.js';
import { ConfigError } from '../sandbox/errors.js';
import type { SandboxCreateOptions } from '../sandbox/index.js';
import { SwerexError } from '../shell/errors.js';
import { DEFAULT_MAX_OUTPUT_BYTES, MIN_OUTPUT_BYTES } from '../shell/index.js';
import { ApiKeyCheck, HttpError, authTokenProblem, ReplayCache, jsonReply, readBody, sendReply, type JsonReply } from './http.js';
import {
  parseAction,
  parseCloseSession,
  parseCommand,
  parseCreateSandbox,
  parseCreateSession,
  parseJsonBody,
  parseReadFile,
  parseUploadForm,
  parseWriteFile,
  validationError,
} from './models.js';
import { multipartBoundary, parseMultipart } from './multipart.js';
import { PythonError } from './python.js';
import { SandboxRegistry, type ManagedSandbox } from './registry.js';
import * as swerex from './swerex.js';

export interface ServerOptions {
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 8000; 0 picks a free port. */
  port?: number;
  /** Required X-API-Key value; '' disables authentication (as SWE-ReX). */
  authToken: string;
  /** Most sandboxes alive at once, the default one included (default: no limit). */
  maxSandboxes?: number;
  /** Largest JSON body (default 16 MiB). */
  maxBodyBytes?: number;
  /** Largest /upload body (default 512 MiB). */
  maxUploadBytes?: number;
  /** Largest total size a zip upload may unpack to (default 2 GiB). */
  maxUnzippedBytes?: number;
  /** Options every sandbox is created with; POST /sandboxes fields override them. */
  sandboxDefaults?: SandboxCreateOptions;
  /** The layer store whose images `POST /sandboxes {"image": ...}` may name (default: the default store). */
  imageStore?: string;
  /**
   * Most bytes of one output stream a request keeps: stdout and stderr of
   * /execute each, the terminal output of one session run. Past it the
   * middle is dropped for a `[... N bytes truncated ...]` marker and the
   * command runs on. Default 1 MiB, the shell session's own default: about
   * ten times the 100 000 characters SWE-agent shows a model, and a flood
   * then costs the server tens of MiB. At least 16 KiB.
   */
  maxOutputBytes?: number;
  /** Remembered X-Request-ID replies (default 1024). */
  replayCacheEntries?: number;
  /**
   * Called with one line per request once it is answered: time, method,
   * path, status, duration (`serve` writes them to stderr). Default: none.
   */
  log?: (line: string) => void;
  /**
   * Join a cluster of `serve` nodes placing sandboxes among each other
   * through Redis (docs/cluster.md, "Interactive sandboxes"). Every node must share the
   * same authToken: nodes forward creates to each other with it.
   */
  cluster?: ClusterOptions;
}

export interface ClusterOptions extends Pick<PlacementOptions, 'queue' | 'redis' | 'heartbeatTtlMs' | 'goneMemoryMs' | 'redisTimeoutMs'> {
  /** This node's URL for clients and the other nodes (default: the URL it listens on; required when that is a wildcard address). */
  advertise?: string;
  /** Sandboxes this node takes (default: maxSandboxes, else the number of CPUs). */
  slots?: number;
  /** Told about heartbeat failures and recoveries (`serve` writes them to stderr). */
  warn?: (message: string) => void;
}

export interface RunningServer {
  /** `http://host:port`, the base URL of the default sandbox. */
  url: string;
  port: number;
  readonly registry: SandboxRegistry;
  /** The node's membership of its cluster (`cluster` option), else undefined. */
  readonly placement?: Placement;
  /** Stops accepting requests and closes every sandbox. */
  close(): Promise<void>;
}

/** The SWE-ReX endpoints ('' is `GET /`). */
const SWEREX_ROUTES = new Set(['', 'is_alive', 'create_session', 'run_in_session', 'close_session', 'execute', 'read_file', 'write_file', 'upload', 'close']);

interface Context {
  registry: SandboxRegistry;
  baseUrl: string;
  maxBodyBytes: number;
  maxUploadBytes: number;
  zipLimits: { maxEntries: number; maxUncompressedBytes: number };
  output: swerex.OutputLimit;
  /** Set once the node joined its cluster. */
  placement?: Placement;
  /** Sent as X-API-Key when a create is forwarded to another node (every node shares it). */
  authToken: string;
}

/** Marks a create another node placed here, its slot already reserved: it is not placed again. */
const PLACED_HEADER = 'x-minisandbox-placed';
/** A create forwarded to a node that has not answered by then is given up (a sandbox takes seconds at most). */
const FORWARD_TIMEOUT_MS = 120_000;
/** Nodes tried for one create before the client hears the failure. */
const MAX_PLACEMENT_TRIES = 3;

function methodNotAllowed(): HttpError {
  return HttpError.detail(405, 'Method Not Allowed');
}

function notFound(): HttpError {
  return HttpError.detail(404, 'Not Found');
}

/** Any failure of a SWE-ReX endpoint is an HTTP 511 the Python client re-raises. */
function swerexReply(e: unknown): JsonReply {
  if (e instanceof HttpError) return jsonReply(e.status, e.body, e.headers);
  let exc: SwerexError;
  if (e instanceof SwerexError) exc = e;
  else if (e instanceof ConfigError) exc = new PythonError('builtins.ValueError', e.message);
  else exc = new PythonError('builtins.RuntimeError', e instanceof Error ? `${e.name}: ${e.message}` : String(e));
  if (!(e instanceof SwerexError) && e instanceof Error && e.stack) Object.assign(exc, { stack: e.stack });
  return jsonReply(511, { swerexception: exc.toSwerexException() });
}

async function jsonBody(req: IncomingMessage, ctx: Context): Promise<unknown> {
  return parseJsonBody(await readBody(req, ctx.maxBodyBytes));
}

/** One SWE-ReX endpoint on `target` (null: the default sandbox, not created yet). */
async function handleSwerex(
  endpoint: string,
  req: IncomingMessage,
  ctx: Context,
  target: () => Promise<ManagedSandbox>,
  existing: ManagedSandbox | null,
): Promise<JsonReply> {
  const method = req.method ?? 'GET';
  const wantGet = endpoint === '' || endpoint === 'is_alive';
  if (wantGet !== (method === 'GET' || method === 'HEAD')) throw methodNotAllowed();
  // Liveness and hello never create the default sandbox: probes poll them.
  if (endpoint === '') return jsonReply(200, { message: 'hello world' });
  if (endpoint === 'is_alive') return jsonReply(200, swerex.isAlive(existing));
  if (endpoint === 'close') {
    // The client sends no body; drain whatever came.
    await readBody(req, ctx.maxBodyBytes);
    return jsonReply(200, await swerex.close(existing));
  }
  try {
    let result: Record<string, unknown>;
    if (endpoint === 'upload') {
      const boundary = multipartBoundary(req.headers['content-type']);
      const form = parseUploadForm(parseMultipart(await readBody(req, ctx.maxUploadBytes), boundary));
      result = await swerex.upload(await target(), form, ctx.zipLimits);
    } else {
      const body = await jsonBody(req, ctx);
      switch (endpoint) {
        case 'create_session':
          result = await swerex.createSession(await target(), parseCreateSession(body), ctx.output);
          break;
        case 'run_in_session':
          result = await swerex.runInSession(await target(), parseAction(body));
          break;
        case 'close_session':
          result = await swerex.closeSession(await target(), parseCloseSession(body));
          break;
        case 'execute':
          result = await swerex.execute(await target(), parseCommand(body), ctx.output);
          break;
        case 'read_file':
          result = await swerex.readFile(await target(), parseReadFile(body));
          break;
        case 'write_file':
          result = await swerex.writeFile(await target(), parseWriteFile(body));
          break;
        default:
          throw notFound();
      }
    }
    return jsonReply(200, result);
  } catch (e) {
    return swerexReply(e);
  }
}

async function handleManagement(rest: string[], trailingSlash: boolean, req: IncomingMessage, ctx: Context): Promise<JsonReply> {
  const method = req.method ?? 'GET';
  if (rest.length === 0) {
    if (method === 'GET') return jsonReply(200, { sandboxes: ctx.registry.list().map((m) => m.describe(ctx.baseUrl)) });
    if (method !== 'POST') throw methodNotAllowed();
    const raw = await readBody(req, ctx.maxBodyBytes);
    // Validated here first: a malformed request never costs a slot or a hop.
    const request = parseCreateSandbox(raw.toString('utf8').trim() === '' ? undefined : parseJsonBody(raw));
    const token = req.headers[PLACED_HEADER];
    if (ctx.placement && typeof token !== 'string') return placeSandbox(ctx.placement, raw, request, req, ctx);
    return createHere(request, ctx, typeof token === 'string' ? token : undefined);
  }
  const managed = await lookup(decodeURIComponent(rest[0]!), req, ctx);
  // `<base>/` is the SWE-ReX root (hello world); `<base>` without the slash inspects.
  if (rest.length === 1 && trailingSlash) return handleSwerex('', req, ctx, async () => managed, managed);
  if (rest.length === 1) {
    if (method === 'GET') return jsonReply(200, managed.describe(ctx.baseUrl));
    if (method !== 'DELETE') throw methodNotAllowed();
    await ctx.registry.delete(managed.id);
    return jsonReply(200, { id: managed.id, closed: true });
  }
  if (rest.length !== 2 || !SWEREX_ROUTES.has(rest[1]!)) throw notFound();
  return handleSwerex(rest[1]!, req, ctx, async () => managed, managed);
}

/** Creates a sandbox on this node; `slotToken`: the slot a placement reserved for it. */
async function createHere(request: ReturnType<typeof parseCreateSandbox>, ctx: Context, slotToken: string | undefined): Promise<JsonReply> {
  let managed: ManagedSandbox;
  try {
    managed = await ctx.registry.create(request, false, slotToken);
  } catch (e) {
    if (e instanceof ConfigError) {
      throw validationError([{ type: 'value_error', loc: ['body', ...(e.option ?? '').split('.').filter(Boolean)], msg: e.message, input: null }]);
    }
    // An image the store does not have, or cannot run: the request's image is at fault.
    if (e instanceof ImageError && request.image !== undefined) {
      throw validationError([{ type: 'value_error', loc: ['body', 'image'], msg: e.message, input: request.image }]);
    }
    throw e;
  }
  return jsonReply(200, { id: managed.id, url: `${ctx.baseUrl}/sandboxes/${managed.id}`, ...(ctx.placement ? { node: ctx.baseUrl } : {}) });
}

/**
 * POST /sandboxes in a cluster: a slot is reserved on the node with the
 * most free slots; this node creates the sandbox itself when it is that
 * node, and otherwise forwards the create there (with the cluster's token)
 * and answers with that node's reply: `url` is the sandbox's base URL on
 * the node that runs it, which the client then uses directly. A node that
 * does not answer (died within its heartbeat TTL) gets its slot back and
 * the next best node is tried.
 */
async function placeSandbox(placement: Placement, raw: Buffer, request: ReturnType<typeof parseCreateSandbox>, req: IncomingMessage, ctx: Context): Promise<JsonReply> {
  const failed: string[] = [];
  const unreachable: string[] = [];
  for (let attempt = 0; attempt < MAX_PLACEMENT_TRIES; attempt++) {
    const placed = await placement.place(failed).catch(clusterUnavailable);
    if (placed.node === null) {
      const why = unreachable.length ? `; tried and failed: ${unreachable.join('; ')}` : '';
      throw HttpError.detail(429, `no free slot in cluster ${placement.target.queueName}: its ${placed.nodes} live nodes use ${placed.used} of ${placed.slots} slots${why}`, { 'retry-after': '1' });
    }
    if (placed.self) {
      try {
        return await createHere(request, ctx, placed.token);
      } finally {
        // Claimed by now, unless the creation failed first: then this frees the slot.
        await placement.drop(placed.node, placed.token).catch(() => {});
      }
    }
    const headers: Record<string, string> = { 'content-type': 'application/json', [PLACED_HEADER]: placed.token };
    if (ctx.authToken) headers['x-api-key'] = ctx.authToken;
    const requestId = req.headers['x-request-id'];
    if (typeof requestId === 'string') headers['x-request-id'] = requestId;
    let res: Response;
    try {
      res = await fetch(`${placed.node}/sandboxes`, { method: 'POST', headers, body: new Uint8Array(raw), signal: AbortSignal.timeout(FORWARD_TIMEOUT_MS), redirect: 'manual' });
    } catch (e) {
      await placement.drop(placed.node, placed.token).catch(() => {});
      failed.push(placed.node);
      const err = e as Error & { cause?: { code?: string } };
      unreachable.push(`${placed.node} (${err.cause?.code ?? err.message})`);
      continue;
    }
    const body = await res.text();
    if (!res.ok) await placement.drop(placed.node, placed.token).catch(() => {});
    if (res.status === 429 || res.status === 503) {
      // Full or shutting down after all (its count in Redis lagged): the next node may not be.
      failed.push(placed.node);
      unreachable.push(`${placed.node} (${res.status})`);
      continue;
    }
    const headersOut: Record<string, string> = {};
    const retryAfter = res.headers.get('retry-after');
    if (retryAfter) headersOut['retry-after'] = retryAfter;
    return { status: res.status, body, headers: headersOut };
  }
  throw HttpError.detail(503, `no node of cluster ${placement.target.queueName} could take the sandbox: ${unreachable.join('; ')}`, { 'retry-after': '1' });
}

/** Redis unreachable or refusing: the cluster cannot place, which is not the request's fault. */
function clusterUnavailable(e: unknown): never {
  if (e instanceof ClusterError) throw HttpError.detail(503, e.message, { 'retry-after': '1' });
  throw e;
}

/**
 * The sandbox `id` of this node. In a cluster, an id this node does not
 * hold is looked up: a sandbox of another live node is a 307 to it (the
 * request is the same there), one whose node stopped or died is a 410 that
 * names the node, at once, so that a client never waits on a dead address.
 */
async function lookup(id: string, req: IncomingMessage, ctx: Context): Promise<ManagedSandbox> {
  try {
    return ctx.registry.get(id);
  } catch (e) {
    if (!ctx.placement || !(e instanceof HttpError) || e.status !== 404) throw e;
    const where = await ctx.placement.locate(id).catch(clusterUnavailable);
    if (!where || (where.node === ctx.placement.url && where.alive)) throw e;
    if (where.alive) {
      const location = `${where.node}${req.url ?? ''}`;
      throw new HttpError(307, { detail: `sandbox ${id} lives on node ${where.node}`, node: where.node }, { location });
    }
    throw new HttpError(410, {
      detail: `sandbox ${id} was on node ${where.node}, which is gone (stopped, or no heartbeat for ${ctx.placement.ttlMs / 1000}s): the sandbox and its files are lost`,
      node: where.node,
      sandbox: id,
    });
  }
}

async function route(req: IncomingMessage, ctx: Context): Promise<JsonReply> {
  const path = new URL(req.url ?? '/', 'http://x').pathname;
  const parts = path.split('/').filter((p) => p !== '');
  if (parts.length === 1 && parts[0] === 'cluster' && ctx.placement) {
    if ((req.method ?? 'GET') !== 'GET') throw methodNotAllowed();
    const p = ctx.placement;
    return jsonReply(200, { cluster: p.target.queueName, redis: p.target.display, self: p.url, heartbeat_ttl: p.ttlMs / 1000, nodes: await p.nodes().catch(clusterUnavailable) });
  }
  if (parts[0] === 'sandboxes') return handleManagement(parts.slice(1), path.endsWith('/'), req, ctx);
  const endpoint = parts.join('/');
  if (!SWEREX_ROUTES.has(endpoint)) throw notFound();
  const existing = ctx.registry.list().find((m) => m.isDefault) ?? null;
  return handleSwerex(endpoint, req, ctx, () => ctx.registry.default(), existing);
}

export async function startServer(options: ServerOptions): Promise<RunningServer> {
  if (typeof options.authToken !== 'string') throw new TypeError('startServer: authToken is required (use "" to disable authentication)');
  const tokenProblem = authTokenProblem(options.authToken);
  if (tokenProblem) throw new ConfigError(`authToken: no client could send this token: ${tokenProblem}`, 'authToken');
  const maxOutputBytes = options.maxOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
  if (!Number.isSafeInteger(maxOutputBytes) || maxOutputBytes < MIN_OUTPUT_BYTES) {
    // Below this a session's end-of-command marker may not fit in what it keeps.
    throw new ConfigError(`maxOutputBytes: expected an integer >= ${MIN_OUTPUT_BYTES}, got ${String(options.maxOutputBytes)}`, 'maxOutputBytes');
  }
  const host = options.host ?? '127.0.0.1';
  const cluster = options.cluster;
  // A node never holds more than its slots, whatever Redis says.
  const slots = cluster ? (cluster.slots ?? options.maxSandboxes ?? availableParallelism()) : undefined;
  const maxSandboxes = slots !== undefined ? Math.min(slots, options.maxSandboxes ?? slots) : options.maxSandboxes;
  let placement: Placement | undefined;
  const registry = new SandboxRegistry({
    maxSandboxes,
    sandboxDefaults: options.sandboxDefaults,
    ...(options.imageStore ? { imageStore: options.imageStore } : {}),
    ...(cluster
      ? {
          // Every sandbox is counted; the default one takes a slot only if one is free.
          admit: async (slotToken: string | undefined) => {
            const p = placement!;
            if (!(await p.claim(slotToken).catch(clusterUnavailable))) {
              throw HttpError.detail(429, `node ${p.url} has no free slot (${p.slots} in use or reserved); DELETE /sandboxes/<id> one first`, { 'retry-after': '1' });
            }
            return () => p.uncount();
          },
          onAdded: (m: ManagedSandbox) => placement!.adopt(m.id).catch(clusterUnavailable),
          onRemoved: (m: ManagedSandbox) => placement!.forget(m.id).catch(() => {}),
        }
      : {}),
  });
  const auth = new ApiKeyCheck(options.authToken);
  const replay = new ReplayCache(options.replayCacheEntries ?? 1024);
  const ctx: Context = {
    registry,
    baseUrl: '',
    maxBodyBytes: options.maxBodyBytes ?? 16 * 1024 * 1024,
    maxUploadBytes: options.maxUploadBytes ?? 512 * 1024 * 1024,
    zipLimits: { maxEntries: 100_000, maxUncompressedBytes: options.maxUnzippedBytes ?? 2 * 1024 ** 3 },
    output: { maxOutputBytes },
    authToken: options.authToken,
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const started = performance.now();
    let reply: JsonReply;
    try {
      auth.verify(req);
      const requestId = req.headers['x-request-id'];
      const method = req.method ?? 'GET';
      if (typeof requestId === 'string' && requestId !== '' && method !== 'GET' && method !== 'HEAD') {
        // The key includes the route: ids are the client's, not ours to trust as globally unique.
        reply = await replay.run(`${method} ${req.url} ${requestId}`, () => route(req, ctx).catch(errorReply));
        // A replayed answer never read this request's body: drain it.
        if (!req.readableEnded) req.resume();
      } else {
        reply = await route(req, ctx);
      }
    } catch (e) {
      reply = errorReply(e);
    }
    sendReply(res, reply);
    options.log?.(`${new Date().toISOString()} ${req.method ?? '-'} ${req.url ?? '-'} ${reply.status} ${(performance.now() - started).toFixed(1)}ms`);
  };

  const server: Server = createServer({ requestTimeout: 60 * 60 * 1000 }, (req, res) => void handle(req, res));
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 8000, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
  ctx.baseUrl = url;
  if (cluster) {
    try {
      placement = await Placement.start({
        queue: cluster.queue,
        ...(cluster.redis ? { redis: cluster.redis } : {}),
        advertise: cluster.advertise ?? url,
        slots: slots!,
        ...(cluster.heartbeatTtlMs !== undefined ? { heartbeatTtlMs: cluster.heartbeatTtlMs } : {}),
        ...(cluster.goneMemoryMs !== undefined ? { goneMemoryMs: cluster.goneMemoryMs } : {}),
        ...(cluster.redisTimeoutMs !== undefined ? { redisTimeoutMs: cluster.redisTimeoutMs } : {}),
        // Creations in flight hold their slot already.
        localCount: () => registry.size + registry.pending,
        localIds: () => registry.list().map((m) => m.id),
        ...(cluster.warn ? { warn: cluster.warn } : {}),
      });
    } catch (e) {
      server.close();
      throw e;
    }
    ctx.placement = placement;
    // Sandbox URLs are the ones clients and other nodes reach.
    ctx.baseUrl = placement.url;
  }
  let closing: Promise<void> | null = null;
  return {
    url: ctx.baseUrl,
    port,
    registry,
    ...(placement ? { placement } : {}),
    close: () =>
      (closing ??= (async () => {
        const stopped = new Promise<void>((resolve) => server.close(() => resolve()));
        // Out of placement first: no create is sent here while the sandboxes close.
        await placement?.stop();
        await registry.closeAll();
        server.closeAllConnections();
        await stopped;
      })()),
  };
}

/** Errors outside a SWE-ReX handler: HTTP errors as they are, anything else a 500. */
function errorReply(e: unknown): JsonReply {
  if (e instanceof HttpError) return jsonReply(e.status, e.body, e.headers);
  const message = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  return jsonReply(500, { detail: message });
}
