/**
 * The HTTP side of the Registry API v2 for one repository: TLS by default,
 * plain HTTP only where asked and only on loopback, the token and Basic
 * challenges, redirects that never carry the registry's credentials to
 * another origin, idle timeouts and an AbortSignal on every request.
 *
 * node:http rather than fetch: it gives an idle timeout on the socket (a
 * stalled registry is the common failure, a slow one is not), a `lookup`
 * hook to hold `localhost` to loopback addresses, and redirects we follow
 * ourselves.
 */
import http from 'node:http';
import https from 'node:https';
import dns from 'node:dns';
import net from 'node:net';
import tls from 'node:tls';
import { RegistryError, registryHost } from './registry-ref.js';

export interface Credentials {
  username: string;
  password: string;
}

export interface HttpOptions {
  insecure?: boolean;
  auth?: Credentials;
  /** No byte from the registry for this long fails the request. */
  timeoutMs: number;
  signal?: AbortSignal;
  /** Certificates (PEM) trusted besides Node's bundle, for a registry with its own CA. */
  ca?: string | Buffer;
}

const REDIRECTS = new Set([301, 302, 303, 307, 308]);
const MAX_REDIRECTS = 5;
/** Error bodies and token replies are small; anything bigger is not read whole. */
const SMALL_BODY = 1 << 20;

const LOOPBACK = new net.BlockList();
LOOPBACK.addSubnet('127.0.0.0', 8, 'ipv4');
LOOPBACK.addAddress('::1', 'ipv6');
LOOPBACK.addSubnet('::ffff:127.0.0.0', 104, 'ipv6');

/** 127.0.0.0/8, ::1 (any spelling, and IPv4-mapped 127.x), or the name localhost. */
export function isLoopback(host: string): boolean {
  const h = host.toLowerCase().replace(/^\[|\]$/g, '');
  if (h === 'localhost') return true;
  const kind = net.isIP(h);
  return kind !== 0 && LOOPBACK.check(h, kind === 4 ? 'ipv4' : 'ipv6');
}

/** A `lookup` for plain-HTTP connections: a name must resolve to loopback only. */
function loopbackLookup(hostname: string, options: dns.LookupOptions, callback: (...args: any[]) => void): void {
  dns.lookup(hostname, { ...options, all: true }, (err, addresses) => {
    if (err) return callback(err);
    const list = addresses as dns.LookupAddress[];
    const outside = list.find((a) => !isLoopback(a.address));
    if (outside) return callback(new Error(`${hostname} resolves to ${outside.address}, not a loopback address, so plain HTTP is refused`));
    if (options.all) return callback(null, list);
    callback(null, list[0]!.address, list[0]!.family);
  });
}

/** `key=value` and `key="value"` pairs of a challenge's parameters. */
export function parseChallenge(header: string): { scheme: string; params: Record<string, string> } {
  const m = /^\s*(\S+)\s*(.*)$/s.exec(header) ?? [];
  const params: Record<string, string> = {};
  for (const p of (m[2] ?? '').matchAll(/([\w-]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]*))/g)) params[p[1]!.toLowerCase()] = p[2] !== undefined ? p[2].replace(/\\(.)/g, '$1') : p[3]!;
  return { scheme: (m[1] ?? '').toLowerCase(), params };
}

function statusText(res: http.IncomingMessage): string {
  const code = res.statusCode ?? 0;
  return `${code} ${res.statusMessage || http.STATUS_CODES[code] || ''}`.trim();
}

/** Read a small body whole (at most `limit` bytes; more is an error). */
export function readBody(res: http.IncomingMessage, limit: number, what: string): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let n = 0;
    res.on('data', (c: Buffer) => {
      n += c.length;
      if (n > limit) {
        res.destroy(new Error(`${what} is larger than ${limit} bytes`));
        return;
      }
      chunks.push(c);
    });
    res.on('end', () => resolve(Buffer.concat(chunks)));
    res.on('error', reject);
    res.on('aborted', () => reject(new Error(`${what}: connection closed before the end`)));
  });
}

/** The registry's own explanation in an error body (`{"errors":[{"code","message"}]}`), if any. */
function registryReason(body: Buffer): string {
  try {
    const errors = (JSON.parse(body.toString('utf8')) as { errors?: { code?: string; message?: string }[] }).errors;
    if (Array.isArray(errors) && errors.length > 0) return errors.map((e) => [e.code, e.message].filter(Boolean).join(': ')).join('; ');
  } catch {
    // not JSON: a proxy's page, say
  }
  const text = body.toString('utf8').replace(/\s+/g, ' ').trim();
  return text.length > 200 ? `${text.slice(0, 200)}...` : text;
}

export class RegistryHttp {
  readonly base: URL;
  readonly #agent: http.Agent;
  #authorization: string | undefined;

  /**
   * `label` prefixes every error (the reference being pulled);
   * `registry` and `repository` are what the API paths are made of.
   */
  constructor(
    readonly label: string,
    readonly registry: string,
    readonly repository: string,
    readonly opts: HttpOptions,
  ) {
    const { host } = registryHost(registry);
    if (opts.insecure && !isLoopback(host)) {
      throw this.error(
        `plain HTTP (insecure) is allowed only for a loopback registry (127.0.0.0/8, ::1, localhost), and ${registry} is not one: use HTTPS`,
      );
    }
    this.base = new URL(`${opts.insecure ? 'http' : 'https'}://${registry}/`);
    this.#agent = opts.insecure
      ? new http.Agent({ keepAlive: true })
      : new https.Agent({ keepAlive: true, ...(opts.ca ? { ca: [...tls.rootCertificates, String(opts.ca)] } : {}) });
  }

  error(message: string, extra: { status?: number; cause?: unknown } = {}): RegistryError {
    return new RegistryError(`${this.label}: ${message}`, { registry: this.registry, repository: this.repository, ...extra });
  }

  close(): void {
    this.#agent.destroy();
  }

  /**
   * GET `path` (under /v2/<repository>/) and return the 2xx response, its
   * body unread. Follows redirects, answers an auth challenge once.
   */
  async get(path: string, headers: Record<string, string>, what: string): Promise<http.IncomingMessage> {
    const start = new URL(`/v2/${this.repository}/${path}`, this.base);
    let challenged = false;
    for (;;) {
      const res = await this.#follow(start, headers, what, (url) => (url.origin === this.base.origin ? this.#authorization : undefined));
      if (res.statusCode === 401 && res.url.origin === this.base.origin) {
        const challenge = res.res.headers['www-authenticate'];
        res.res.resume();
        if (challenged || !challenge) throw this.#unauthorized(what, res.res, !challenge);
        challenged = true;
        await this.#answer(challenge, what);
        continue;
      }
      if (res.statusCode >= 200 && res.statusCode < 300) return res.res;
      throw await this.#failed(what, res.res);
    }
  }

  #unauthorized(what: string, res: http.IncomingMessage, noChallenge: boolean): RegistryError {
    const why = noChallenge
      ? 'and sent no WWW-Authenticate challenge to answer'
      : this.opts.auth
        ? `after authenticating as ${this.opts.auth.username}: the credentials were refused or do not allow pulling ${this.repository}`
        : 'without credentials: the registry needs a username and password (auth)';
    return this.error(`${what}: ${statusText(res)} ${why}`, { status: 401 });
  }

  async #failed(what: string, res: http.IncomingMessage): Promise<RegistryError> {
    const body = await readBody(res, SMALL_BODY, 'error body').catch(() => Buffer.alloc(0));
    const reason = registryReason(body);
    return this.error(`${what}: ${statusText(res)}${reason ? ` (${reason})` : ''}`, { status: res.statusCode ?? 0 });
  }

  /** Get a token for a Bearer challenge, or use the credentials for a Basic one. */
  async #answer(header: string, what: string): Promise<void> {
    const { scheme, params } = parseChallenge(header);
    if (scheme === 'basic') {
      if (!this.opts.auth) throw this.error(`${what}: 401 Unauthorized without credentials: the registry asks for Basic auth (a username and password)`, { status: 401 });
      this.#authorization = basic(this.opts.auth);
      return;
    }
    if (scheme !== 'bearer') throw this.error(`${what}: the registry asks for ${scheme || 'an unnamed'} authentication, which is not supported (Bearer and Basic are)`, { status: 401 });
    if (!params.realm) throw this.error(`${what}: the registry's Bearer challenge names no realm (token server)`, { status: 401 });
    let realm: URL;
    try {
      realm = new URL(params.realm);
    } catch {
      throw this.error(`${what}: the token realm ${JSON.stringify(params.realm)} is not a URL`);
    }
    this.#checkScheme(realm, 'token realm');
    if (params.service !== undefined) realm.searchParams.set('service', params.service);
    realm.searchParams.append('scope', params.scope ?? `repository:${this.repository}:pull`);
    const credentials = this.opts.auth ? basic(this.opts.auth) : undefined;
    const res = await this.#follow(realm, { accept: 'application/json' }, `token from ${realm.origin}`, (url) => (url.origin === realm.origin ? credentials : undefined));
    if (res.statusCode === 401 || res.statusCode === 403) {
      res.res.resume();
      throw this.error(
        `token from ${realm.origin}${realm.pathname}: ${statusText(res.res)}: ${this.opts.auth ? `the credentials for ${this.opts.auth.username} were refused` : 'anonymous access refused: the registry needs a username and password (auth)'}`,
        { status: res.statusCode },
      );
    }
    if (res.statusCode < 200 || res.statusCode >= 300) throw await this.#failed(`token from ${realm.origin}${realm.pathname}`, res.res);
    const body = await readBody(res.res, SMALL_BODY, 'token reply');
    let token: unknown;
    try {
      const json = JSON.parse(body.toString('utf8')) as { token?: unknown; access_token?: unknown };
      token = json.token ?? json.access_token;
    } catch {
      token = undefined;
    }
    if (typeof token !== 'string' || token === '') throw this.error(`token from ${realm.origin}${realm.pathname}: the reply holds no token`);
    this.#authorization = `Bearer ${token}`;
  }

  /** HTTPS always; HTTP only when insecure and on loopback (redirects and realms included). */
  #checkScheme(url: URL, what: string): void {
    if (url.protocol === 'https:') return;
    if (url.protocol === 'http:' && this.opts.insecure && isLoopback(url.hostname)) return;
    if (url.protocol === 'http:') {
      throw this.error(`${what} ${url.origin}: plain HTTP is allowed only with insecure and only for a loopback host (127.0.0.0/8, ::1, localhost)`);
    }
    throw this.error(`${what} ${url.href}: unsupported scheme ${url.protocol}`);
  }

  /** One GET with redirects; `authFor` says what Authorization, if any, a URL may get. */
  async #follow(
    first: URL,
    headers: Record<string, string>,
    what: string,
    authFor: (url: URL) => string | undefined,
  ): Promise<{ res: http.IncomingMessage; url: URL; statusCode: number }> {
    let url = first;
    for (let hops = 0; ; hops++) {
      const auth = authFor(url);
      const res = await this.#send(url, auth ? { ...headers, authorization: auth } : headers, what);
      const status = res.statusCode ?? 0;
      if (!REDIRECTS.has(status)) return { res, url, statusCode: status };
      res.resume();
      const location = res.headers.location;
      if (!location) throw this.error(`${what}: ${statusText(res)} without a Location`, { status });
      if (hops >= MAX_REDIRECTS) throw this.error(`${what}: more than ${MAX_REDIRECTS} redirects`, { status });
      const next = new URL(location, url);
      this.#checkScheme(next, `${what}: redirect to`);
      url = next;
    }
  }

  #send(url: URL, headers: Record<string, string>, what: string): Promise<http.IncomingMessage> {
    const { signal, timeoutMs } = this.opts;
    if (signal?.aborted) return Promise.reject(this.aborted(signal));
    return new Promise((resolve, reject) => {
      const plain = url.protocol === 'http:';
      const req = (plain ? http : https).request(url, {
        method: 'GET',
        headers: { 'user-agent': 'minisandbox', ...headers },
        // The agent is for the registry's origin; storage a blob redirects to gets a fresh connection.
        ...(url.origin === this.base.origin ? { agent: this.#agent } : {}),
        ...(plain ? { lookup: loopbackLookup as unknown as typeof dns.lookup } : {}),
        timeout: timeoutMs,
      });
      const onAbort = () => req.destroy(this.aborted(signal!));
      signal?.addEventListener('abort', onAbort, { once: true });
      req.on('timeout', () => req.destroy(this.error(`${what}: ${url.host} sent nothing for ${timeoutMs / 1000} s`)));
      req.on('error', (err) => {
        signal?.removeEventListener('abort', onAbort);
        reject(err instanceof RegistryError ? err : this.#connectError(url, what, err));
      });
      req.on('response', (res) => {
        signal?.removeEventListener('abort', onAbort);
        // The header wait is over; a stalled body is the reader's watchdog's business.
        req.setTimeout(0);
        resolve(res);
      });
      req.end();
    });
  }

  #connectError(url: URL, what: string, err: Error & { code?: string }): RegistryError {
    let hint = '';
    if (url.protocol === 'https:' && (err.code === 'EPROTO' || /wrong version number|packet length too long/i.test(err.message))) {
      hint = isLoopback(url.hostname)
        ? ' (the registry does not speak TLS: for a plain-HTTP registry on loopback pass insecure)'
        : ' (the registry does not speak TLS there)';
    }
    if (/certificate|self.signed|unable to (get|verify)/i.test(err.message) || /^(CERT_|DEPTH_ZERO|SELF_SIGNED|UNABLE_TO)/.test(err.code ?? '')) {
      hint = ' (the registry\'s TLS certificate is not trusted: pass its CA as ca)';
    }
    return this.error(`${what}: cannot reach ${url.host}: ${err.message}${hint}`, { cause: err });
  }

  aborted(signal: AbortSignal): RegistryError {
    return this.error('aborted', { cause: signal.reason });
  }
}

function basic(c: Credentials): string {
  return `Basic ${Buffer.from(`${c.username}:${c.password}`).toString('base64')}`;
}
