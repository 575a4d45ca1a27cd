/**
 * HTTP plumbing of the server on plain node:http: bounded body reading,
 * JSON replies, API-key checking and the X-Request-ID replay cache.
 * Nothing here knows about sandboxes or SWE-ReX models.
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { MinisandboxError } from '../errors.js';

/** A reply decided before or instead of a handler's normal result. */
export class HttpError extends MinisandboxError {
  static override readonly code = 'MSBX_HTTP';
  constructor(
    readonly status: number,
    /** The JSON body, FastAPI-style: `{"detail": ...}` unless given whole. */
    readonly body: unknown,
    readonly headers: Record<string, string> = {},
  ) {
    super(typeof body === 'object' && body !== null && 'detail' in body ? JSON.stringify((body as { detail: unknown }).detail) : String(status));
  }

  static detail(status: number, detail: unknown, headers: Record<string, string> = {}): HttpError {
    return new HttpError(status, { detail }, headers);
  }
}

/** A response as stored in the replay cache: already serialized. */
export interface JsonReply {
  status: number;
  body: string;
  headers?: Record<string, string>;
}

export function jsonReply(status: number, value: unknown, headers?: Record<string, string>): JsonReply {
  return { status, body: JSON.stringify(value), headers };
}

export function sendReply(res: ServerResponse, reply: JsonReply): void {
  if (res.headersSent || res.destroyed) return;
  const body = Buffer.from(reply.body, 'utf8');
  res.writeHead(reply.status, {
    'content-type': 'application/json',
    'content-length': String(body.length),
    ...reply.headers,
  });
  res.end(body);
}

/**
 * The whole request body, refused with 413 past `limit` bytes: first from
 * Content-Length (before reading anything), then while streaming, since
 * chunked requests announce no length.
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  const announced = Number(req.headers['content-length']);
  if (Number.isFinite(announced) && announced > limit) {
    return Promise.reject(tooLarge(limit));
  }
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let refused = false;
    req.on('data', (chunk: Buffer) => {
      if (refused) return; // keep draining so the 413 reply can be read by the client
      size += chunk.length;
      if (size > limit) {
        refused = true;
        chunks.length = 0;
        reject(tooLarge(limit));
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => {
      if (!refused) resolve(Buffer.concat(chunks));
    });
    req.on('error', (e) => {
      if (!refused) reject(e);
    });
  });
}

function tooLarge(limit: number): HttpError {
  // Closing the connection stops a client that keeps sending a huge body.
  return HttpError.detail(413, `request body larger than ${limit} bytes`, { connection: 'close' });
}

/**
 * Why `token` could never be matched, or null. HTTP parsers strip spaces and
 * tabs around a header value and no client can send a line break or other
 * control character in one: such a token would lock every client out.
 */
export function authTokenProblem(token: string): string | null {
  if (/[\x00-\x08\x0a-\x1f\x7f]/.test(token)) return 'it contains a line break or another control character, which an HTTP header cannot carry';
  if (/^[ \t]|[ \t]$/.test(token)) return 'it starts or ends with whitespace, which HTTP strips from header values';
  return null;
}

/**
 * X-API-Key check with SWE-ReX's answers: no header 403 (FastAPI's
 * APIKeyHeader), a wrong one 401. Both sides are hashed first so the
 * comparison takes the same time whatever the key's length or content.
 */
export class ApiKeyCheck {
  readonly #expected: Buffer | null;

  constructor(token: string) {
    // SWE-ReX: an empty token disables authentication.
    this.#expected = token ? digest(token) : null;
  }

  /** Throws the HttpError to send, or returns when the request may proceed. */
  verify(req: IncomingMessage): void {
    if (!this.#expected) return;
    const given = req.headers['x-api-key'];
    if (given === undefined) throw HttpError.detail(403, 'Not authenticated');
    const value = Array.isArray(given) ? given.join(',') : given;
    if (!timingSafeEqual(digest(value), this.#expected)) throw HttpError.detail(401, 'Invalid API Key');
  }
}

function digest(s: string): Buffer {
  return createHash('sha256').update(s, 'utf8').digest();
}

/**
 * Replay of recent non-GET responses by X-Request-ID (the Python client
 * sends a fresh uuid4 per call and the same one on its retries). SWE-ReX
 * keeps only the last pair; a bounded LRU keeps working when many clients
 * interleave. The promise is stored, so a retry that arrives while the
 * first attempt still runs waits for it instead of running it again.
 */
export class ReplayCache {
  readonly #entries = new Map<string, { reply: Promise<JsonReply>; bytes: number }>();
  #bytes = 0;

  constructor(
    private readonly maxEntries = 1024,
    /** Big outputs are the norm (test logs): bound memory as well as count. */
    private readonly maxBytes = 64 * 1024 * 1024,
  ) {}

  get size(): number {
    return this.#entries.size;
  }

  /** The cached reply of `key`, or the one `produce` gives, remembered under `key`. */
  run(key: string, produce: () => Promise<JsonReply>): Promise<JsonReply> {
    const hit = this.#entries.get(key);
    if (hit) {
      // Refresh its place in the LRU order.
      this.#entries.delete(key);
      this.#entries.set(key, hit);
      return hit.reply;
    }
    const entry = { reply: produce(), bytes: 0 };
    this.#entries.set(key, entry);
    entry.reply.then(
      (r) => {
        if (this.#entries.get(key) !== entry) return;
        entry.bytes = r.body.length;
        this.#bytes += entry.bytes;
        this.#evict();
      },
      // A handler that threw (not a reply) is not worth replaying.
      () => {
        if (this.#entries.get(key) === entry) this.#entries.delete(key);
      },
    );
    this.#evict();
    return entry.reply;
  }

  #evict(): void {
    for (const [key, entry] of this.#entries) {
      if (this.#entries.size <= this.maxEntries && this.#bytes <= this.maxBytes) break;
      this.#entries.delete(key);
      this.#bytes -= entry.bytes;
    }
  }
}
