/**
 * Image references as Docker reads them (github.com/distribution/reference):
 * `ubuntu` is `docker.io/library/ubuntu:latest`, a first component with a
 * dot, a port or `localhost` is a registry, and `name[:tag][@digest]`.
 * Parsing is strict because a reference becomes a URL path and a file name.
 */
import { MinisandboxError } from '../errors.js';

/**
 * A registry refused, failed or sent something unusable. `registry` and
 * `repository` name where (`repository` is empty for a reference that
 * could not be parsed), `status` the HTTP status when there was one.
 */
export class RegistryError extends MinisandboxError {
  static override readonly code = 'MSBX_REGISTRY';
  readonly registry: string;
  readonly repository: string;
  readonly status: number | undefined;

  constructor(message: string, where: { registry?: string; repository?: string; status?: number; cause?: unknown } = {}) {
    super(message, 'cause' in where ? { cause: where.cause } : {});
    this.registry = where.registry ?? '';
    this.repository = where.repository ?? '';
    this.status = where.status;
  }
}

export interface ImageReference {
  /** The host (and port) the Registry API is reached at: Docker Hub is `registry-1.docker.io`. */
  registry: string;
  /** `library/ubuntu`, `msbx-test/app`. */
  repository: string;
  /** Absent when only a digest was given. */
  tag?: string;
  /** `sha256:<hex>`, when the reference pins a manifest. */
  digest?: string;
}

/** Docker Hub's names for itself, and the host its API answers on. */
const DOCKER_HUB_NAMES = new Set(['docker.io', 'index.docker.io', 'registry-1.docker.io']);
export const DOCKER_HUB_API = 'registry-1.docker.io';

// The grammar of distribution/reference's regexp.go.
const DOMAIN_COMPONENT = /^(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])$/;
const PATH_COMPONENT = /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$/;
const TAG = /^[\w][\w.-]{0,127}$/;
export const SHA256_DIGEST = /^sha256:[a-f0-9]{64}$/;
const ANY_DIGEST = /^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}$/;
const NAME_MAX = 255;

function refused(ref: string, why: string): RegistryError {
  return new RegistryError(`image reference ${JSON.stringify(ref)}: ${why}`);
}

/** `host`, `host:port`, `[v6]:port`: null when `s` is not a registry host. */
function parseDomain(s: string): { host: string; port?: number } | null {
  let host = s;
  let port: string | undefined;
  const v6 = /^\[([0-9a-fA-F:.]+)\](?::(\d+))?$/.exec(s);
  if (v6) {
    host = v6[1]!;
    port = v6[2];
  } else {
    const colon = s.lastIndexOf(':');
    if (colon >= 0) {
      host = s.slice(0, colon);
      port = s.slice(colon + 1);
      if (!/^\d+$/.test(port)) return null;
    }
    if (!host.split('.').every((c) => DOMAIN_COMPONENT.test(c))) return null;
  }
  if (port !== undefined && (Number(port) < 1 || Number(port) > 65535)) return null;
  return port === undefined ? { host } : { host, port: Number(port) };
}

/**
 * Split and normalise a reference as `docker pull` does. Throws a
 * RegistryError saying what is wrong with a malformed one.
 */
export function parseReference(ref: string): ImageReference {
  if (typeof ref !== 'string' || ref.trim() === '') throw refused(String(ref), 'empty');
  if (ref !== ref.trim() || /\s/.test(ref)) throw refused(ref, 'contains white space');

  let rest = ref;
  let digest: string | undefined;
  const at = rest.indexOf('@');
  if (at >= 0) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!ANY_DIGEST.test(digest)) throw refused(ref, `${JSON.stringify(digest)} is not a digest (sha256:<64 hex digits>)`);
    if (!digest.startsWith('sha256:')) throw refused(ref, `only sha256 digests are supported, not ${digest.slice(0, digest.indexOf(':'))}`);
    if (!SHA256_DIGEST.test(digest)) throw refused(ref, `${digest} is not a sha256 digest (64 lowercase hex digits)`);
  }

  let tag: string | undefined;
  const lastSlash = rest.lastIndexOf('/');
  const colon = rest.lastIndexOf(':');
  if (colon > lastSlash) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
    if (!TAG.test(tag)) throw refused(ref, `tag ${JSON.stringify(tag)} is not valid (letters, digits, _ . -, at most 128, not starting with . or -)`);
  }
  if (rest === '') throw refused(ref, 'no repository name');

  let registry = DOCKER_HUB_API;
  let path = rest;
  const slash = rest.indexOf('/');
  const first = slash >= 0 ? rest.slice(0, slash) : '';
  // Docker's rule: the first component is a registry when it looks like a host.
  if (slash >= 0 && (first.includes('.') || first.includes(':') || first === 'localhost' || first.startsWith('['))) {
    const domain = parseDomain(first);
    if (!domain) throw refused(ref, `${JSON.stringify(first)} is not a registry host[:port]`);
    registry = DOCKER_HUB_NAMES.has(first) ? DOCKER_HUB_API : first;
    path = rest.slice(slash + 1);
  }
  if (registry === DOCKER_HUB_API && !path.includes('/')) path = `library/${path}`;

  const components = path.split('/');
  for (const c of components) {
    if (c === '') throw refused(ref, 'empty path component (a doubled or trailing /)');
    if (c !== c.toLowerCase() && PATH_COMPONENT.test(c.toLowerCase())) throw refused(ref, `repository name must be lowercase: ${JSON.stringify(c)}`);
    if (!PATH_COMPONENT.test(c)) throw refused(ref, `${JSON.stringify(c)} is not a valid repository path component (lowercase letters and digits, separated by . _ __ or -)`);
  }
  if (registry.length + 1 + path.length > NAME_MAX) throw refused(ref, `the name is longer than ${NAME_MAX} characters`);

  if (tag === undefined && digest === undefined) tag = 'latest';
  return { registry, repository: path, ...(tag !== undefined ? { tag } : {}), ...(digest !== undefined ? { digest } : {}) };
}

/** `registry/repository:tag@digest`, the canonical text of a parsed reference. */
export function formatReference(r: ImageReference): string {
  return `${r.registry}/${r.repository}${r.tag !== undefined ? `:${r.tag}` : ''}${r.digest !== undefined ? `@${r.digest}` : ''}`;
}

/** The registry's host name (brackets of an IPv6 literal removed) and port, if any. */
export function registryHost(registry: string): { host: string; port?: number } {
  const d = parseDomain(registry);
  if (!d) throw new RegistryError(`registry ${JSON.stringify(registry)}: not a host[:port]`, { registry });
  return d;
}
