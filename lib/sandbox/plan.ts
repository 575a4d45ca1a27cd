/**
 * Options -> validated native plan. Every check that can be made before a
 * fork is made here, so a bad option is a ConfigError naming the option and
 * the reason, and never a half-made sandbox.
 */
import { existsSync, realpathSync, statSync } from 'node:fs';
import { posix } from 'node:path';
import type { NamespaceName, NativeOp, NativePlan, NativeStdio, PreparedOps } from '../native/index.js';
import { native } from '../native/index.js';
import { ConfigError } from './errors.js';
import type { Mount, ProcessOptions, SandboxOptions, SpawnOptions, StdioOption } from './options.js';
import {
  CAPABILITIES,
  DEFAULT_PATH,
  DEFAULT_PIDS,
  TMPFS_SIZES,
  WORK_DIR,
  ROOT_TMPFS,
  devOps,
  hostRoot,
  hostSourceFlags,
  identityFileOps,
  procOps,
  rootIdRange,
  callerIdRange,
  RANGE_IDS,
  type IdRange,
} from './policy.js';
import { seccompProgram } from './seccomp.js';

const SANDBOX_KEYS = [
  'root', 'mounts', 'workDir', 'proc', 'dev', 'tmp', 'readOnlyRoot', 'hostname', 'network',
  'namespaces', 'mapUser', 'rootSwitch', 'seccomp', 'nesting', 'ids',
] as const;
const PROCESS_KEYS = [
  'argv', 'env', 'inheritEnv', 'cwd', 'user', 'rlimits', 'capabilities', 'noNewPrivs', 'newSession',
  'dieWithParent', 'stdin', 'stdout', 'stderr', 'pty', 'fds', 'timeout', 'signal',
] as const;
const RUN_KEYS = ['input', 'maxBuffer', 'encoding'] as const;
export const KNOWN_OPTION_KEYS = new Set<string>([...SANDBOX_KEYS, ...PROCESS_KEYS, ...RUN_KEYS]);
export const PROCESS_OPTION_KEYS = new Set<string>([...PROCESS_KEYS, ...RUN_KEYS]);
const OPTIONAL_NAMESPACES = ['user', 'pid', 'ipc', 'uts', 'cgroup'] as const;

function fail(option: string, reason: string): never {
  throw new ConfigError(`${option}: ${reason}`, option);
}

/** An absolute, normalised path inside the sandbox ("/a/b", never "/a/../b"). */
export function checkSandboxPath(option: string, p: unknown): string {
  if (typeof p !== 'string' || p.length === 0) fail(option, 'must be a non-empty string');
  if (!p.startsWith('/')) fail(option, `'${p}' must be an absolute path`);
  if (p.includes('\0')) fail(option, 'contains a NUL byte');
  if (p.split('/').includes('..')) fail(option, `'${p}' must not contain '..'`);
  const norm = posix.normalize(p);
  return norm.length > 1 ? norm.replace(/\/$/, '') : norm;
}

/** A host path that must exist; returned with symlinks resolved. */
function hostPath(option: string, p: unknown, what: string): string {
  if (typeof p !== 'string' || p.length === 0) fail(option, 'must be a non-empty string');
  if (!p.startsWith('/')) fail(option, `${what} '${p}' must be an absolute path`);
  // realpath(3) in one call (the JavaScript realpathSync lstat()s each
  // component from Node), whose error also says whether the path exists.
  try {
    return realpathSync.native(p);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ENOTDIR') fail(option, `${what} ${p} does not exist`);
    if (code === 'ELOOP') fail(option, `${what} ${p} does not exist (a loop of symlinks)`);
    fail(option, `${what} ${p} cannot be resolved: ${(err as Error).message}`);
  }
}

function hostDir(option: string, p: unknown, what: string): string {
  const real = hostPath(option, p, what);
  if (!statSync(real).isDirectory()) fail(option, `${what} ${p} is not a directory`);
  return real;
}

function mode(option: string, m: unknown, fallback: number): number {
  if (m === undefined) return fallback;
  if (typeof m !== 'number' || !Number.isInteger(m) || m < 0 || m > 0o7777) fail(option, 'must be a permission mode like 0o755');
  return m;
}

function tmpfsData(option: string, size: unknown, m: number): string {
  let data = `mode=${m.toString(8).padStart(4, '0')}`;
  if (size !== undefined) {
    if (typeof size === 'number' && Number.isFinite(size) && size > 0) data += `,size=${Math.floor(size)}`;
    else if (typeof size === 'string' && /^\d+[kmg%]?$/i.test(size)) data += `,size=${size}`;
    else fail(option, `size '${String(size)}' must be bytes or a tmpfs size like '64m' or '10%'`);
  }
  return data;
}

/** A mount and the option it came from, for error messages (`mounts[2]`). */
export interface NamedMount {
  option: string;
  mount: Mount;
}

/** The directory holding both `a` and `b` (host paths, absolute, normalised). */
function commonDir(a: string, b: string): string {
  const pa = a.split('/');
  const pb = b.split('/');
  let i = 0;
  while (i < pa.length && i < pb.length && pa[i] === pb[i]) i++;
  return pa.slice(0, i).join('/') || '/';
}

/** Overlay in a user namespace needs user.* xattrs (kernel >= 5.11). */
function mountOps(m: Mount, at: string, id: Identity): NativeOp[] {
  if (typeof m !== 'object' || m === null) fail(at, 'must be an object');
  const target = checkSandboxPath(`${at}.target`, m.target);
  switch (m.type) {
    case 'bind': {
      if (m.optional && typeof m.source === 'string' && !existsSync(m.source)) return [];
      const src = hostPath(`${at}.source`, m.source, 'bind source');
      return [{ kind: 'bind', src, dst: target, readOnly: !!m.readOnly, nosuid: true, nodev: !m.devices, ...hostSourceFlags(src, id.range) }];
    }
    case 'tmpfs': {
      const data = tmpfsData(`${at}.size`, m.size, mode(`${at}.mode`, m.mode, 0o755));
      return [{ kind: 'tmpfs', dst: target, data, nosuid: true, nodev: true, readOnly: !!m.readOnly }];
    }
    case 'overlay': {
      if (!Array.isArray(m.lower) || m.lower.length === 0) fail(`${at}.lower`, 'needs at least one lower directory');
      const lower = m.lower.map((l, j) => hostDir(`${at}.lower[${j}]`, l, 'overlay lower dir'));
      if ((m.upper === undefined) !== (m.work === undefined)) fail(at, 'overlay upper and work must be given together');
      // Lower layers all idmapped or none: the store's layers are root's.
      const { cloneInParent, idmap } = hostSourceFlags(lower[0]!, id.range);
      const op: NativeOp = { kind: 'overlay', dst: target, lower, nosuid: true, nodev: true, userxattr: id.userns, cloneInParent, idmap };
      if (m.upper !== undefined && m.work !== undefined) {
        const upper = hostDir(`${at}.upper`, m.upper, 'overlay upper dir');
        const work = hostDir(`${at}.work`, m.work, 'overlay work dir');
        if (statSync(upper).dev !== statSync(work).dev) fail(at, `overlay upper ${m.upper} and work ${m.work} must be on the same filesystem`);
        if (upper === work) fail(at, 'overlay upper and work must be different directories');
        const base = commonDir(upper, work);
        if (base === upper || base === work) fail(at, `overlay upper ${m.upper} and work ${m.work} must be separate directories, neither inside the other`);
        // Cloned as one mount (overlayfs wants upper and work on one), shown
        // under a neutral path inside.
        Object.assign(op, { upperBase: base, upper: posix.relative(base, upper), work: posix.relative(base, work) });
        if (id.range) op.upperIdmap = hostSourceFlags(base, id.range).idmap;
      }
      return [op];
    }
    case 'proc':
      return procOps(target);
    case 'dev':
      return devOps(target);
    case 'symlink':
      if (typeof m.linkTo !== 'string' || m.linkTo.length === 0) fail(`${at}.linkTo`, 'must be a non-empty string');
      return [{ kind: 'symlink', src: m.linkTo, dst: target }];
    case 'dir':
      return [{ kind: 'mkdir', dst: target, mode: mode(`${at}.mode`, m.mode, 0o755) }];
    case 'file':
      if (typeof m.content !== 'string') fail(`${at}.content`, 'must be a string');
      return [{ kind: 'write-file', dst: target, data: m.content, mode: mode(`${at}.mode`, m.mode, 0o644) }];
    default:
      fail(`${at}.type`, `unknown mount type '${String((m as { type: unknown }).type)}' (bind, tmpfs, overlay, proc, dev, symlink, dir, file)`);
  }
}

/** Two mounts of the user's on one target would silently hide the first. */
function checkConflicts(mounts: NamedMount[]): void {
  const seen = new Map<string, string>();
  for (const { option, mount: m } of mounts) {
    if (typeof m !== 'object' || m === null) fail(option, 'must be an object');
    if (m.type === 'dir' || m.type === 'file' || m.type === 'symlink') continue;
    const t = checkSandboxPath(`${option}.target`, m.target);
    const prev = seen.get(t);
    if (prev !== undefined) fail(option, `conflicts with ${prev}: both mount on ${t}`);
    seen.set(t, option);
  }
}

export interface Identity {
  userns: boolean;
  uidMap?: string;
  gidMap?: string;
  denySetgroups: boolean;
  /** The ids the caller's processes have inside. */
  insideUid: number;
  insideGid: number;
  /**
   * A root caller's sandbox: ids 0..count-1 inside are this host range, so
   * its root is an unprivileged host id (see rootIdRange in policy.ts).
   */
  range?: IdRange;
  /** With a range: the ids every process of the sandbox takes first, the range's root. */
  initUser?: { uid: number; gid: number };
  /** How many ids are mapped inside, from 0 (a range) or insideUid alone (1). */
  idCount: number;
  /**
   * An unprivileged caller's `ids: 'range'`: the setuid helpers that write
   * the maps (uidMap/gidMap then only describe them, for sb.isolation).
   */
  uidMapper?: string[];
  gidMapper?: string[];
  /** Host uids mapped inside, as [start, count] runs (none: every id, no user namespace). */
  hostUids?: [number, number][];
}

/**
 * The host id range a sandbox with these options runs as, when the caller
 * is root (and keeps the user namespace); undefined otherwise.
 */
export function remappedRange(opts: SandboxOptions): IdRange | undefined {
  const root = (process.getuid?.() ?? 0) === 0;
  return root && (opts.namespaces?.user ?? true) ? rootIdRange() : undefined;
}

function identity(opts: SandboxOptions, ns: Set<NamespaceName>): Identity {
  const uid = process.getuid?.() ?? 0;
  const gid = process.getgid?.() ?? 0;
  const mapUser = opts.mapUser ?? 'root';
  if (mapUser !== 'root' && mapUser !== 'self') fail('mapUser', `'${String(mapUser)}' must be 'root' or 'self'`);
  const ids = opts.ids ?? 'single';
  if (ids !== 'single' && ids !== 'range') fail('ids', `'${String(ids)}' must be 'single' or 'range'`);
  if (!ns.has('user')) {
    if (uid !== 0) fail('namespaces.user', 'a non-root caller needs the user namespace');
    if (ids === 'range') fail('ids', "'range' maps ids in the sandbox's user namespace, and namespaces.user is false");
    return { userns: false, denySetgroups: false, insideUid: uid, insideGid: gid, idCount: 0 };
  }
  const range = remappedRange(opts);
  if (!range && ids === 'range') {
    // Podman's rootless layout: the caller is root inside, its subordinate
    // ids are 1-65535. Only the setuid helpers may write such maps.
    if (mapUser === 'self') fail('mapUser', "'self' cannot go with ids: 'range', which maps the caller to root inside");
    const r = callerIdRange();
    if ('reason' in r) fail('ids', `'range' ${r.reason}`);
    return {
      userns: true,
      uidMap: r.uidMap,
      gidMap: r.gidMap,
      uidMapper: r.uidMapper,
      gidMapper: r.gidMapper,
      // setgroups stays allowed: the sandbox's processes may take another
      // user's groups, as `su` does; newgidmap permits it for a subgid map.
      denySetgroups: false,
      insideUid: 0,
      insideGid: 0,
      idCount: RANGE_IDS,
      hostUids: [[uid, 1], [r.uid.start, RANGE_IDS - 1]],
    };
  }
  if (range) {
    // The caller's root stays outside: its own uid 0 is not mapped at all.
    return {
      userns: true,
      uidMap: `0 ${range.uid} ${range.count}\n`,
      gidMap: `0 ${range.gid} ${range.count}\n`,
      denySetgroups: false,
      insideUid: 0,
      insideGid: 0,
      range,
      initUser: { uid: 0, gid: 0 },
      idCount: range.count,
      hostUids: [[range.uid, range.count]],
    };
  }
  const insideUid = mapUser === 'root' ? 0 : uid;
  const insideGid = mapUser === 'root' ? 0 : gid;
  return {
    userns: true,
    uidMap: `${insideUid} ${uid} 1\n`,
    gidMap: `${insideGid} ${gid} 1\n`,
    // Required for an unprivileged gid_map.
    denySetgroups: true,
    insideUid,
    insideGid,
    idCount: 1,
    hostUids: [[uid, 1]],
  };
}

function namespaces(opts: SandboxOptions): Set<NamespaceName> {
  const ns = new Set<NamespaceName>(['mount']);
  const want = opts.namespaces ?? {};
  if (typeof want !== 'object' || want === null) fail('namespaces', 'must be an object like { pid: true }');
  for (const key of Object.keys(want)) {
    if (!(OPTIONAL_NAMESPACES as readonly string[]).includes(key)) {
      fail(`namespaces.${key}`, `unknown namespace '${key}' (known: ${OPTIONAL_NAMESPACES.join(', ')}; the network is set with 'network')`);
    }
  }
  for (const name of OPTIONAL_NAMESPACES) {
    const on = want[name as keyof typeof want] ?? name !== 'cgroup';
    if (on) ns.add(name);
  }
  const network = opts.network ?? 'none';
  if (network !== 'none' && network !== 'host') fail('network', `'${String(network)}' must be 'none' or 'host'`);
  if (network === 'none') ns.add('net');
  return ns;
}

function environment(p: ProcessOptions, home: string, pty: boolean): string[] {
  const env: Record<string, string> = { PATH: DEFAULT_PATH, HOME: home, LANG: 'C.UTF-8' };
  if (pty) env.TERM = 'xterm-256color';
  const inherit = p.inheritEnv ?? false;
  if (inherit === true) {
    Object.assign(env, process.env);
  } else if (Array.isArray(inherit)) {
    for (const k of inherit) {
      const v = process.env[k];
      if (v !== undefined) env[k] = v;
    }
  } else if (inherit !== false) {
    fail('inheritEnv', 'must be a boolean or a list of variable names');
  }
  for (const [k, v] of Object.entries(p.env ?? {})) {
    if (!k || k.includes('=') || k.includes('\0')) fail(`env.${k}`, 'is not a valid variable name');
    if (typeof v !== 'string') fail(`env.${k}`, 'value must be a string');
    if (v.includes('\0')) fail(`env.${k}`, 'value contains a NUL byte');
    env[k] = v;
  }
  return Object.entries(env).map(([k, v]) => `${k}=${v}`);
}

/** Like execvp: a name without '/' is tried in each PATH directory, in order. */
function execCandidates(argv0: string, env: string[]): string[] {
  if (argv0.includes('/')) return [argv0.startsWith('/') ? argv0 : posix.join('/', argv0)];
  const path = env.find((e) => e.startsWith('PATH='))?.slice(5) || DEFAULT_PATH;
  return path.split(':').filter(Boolean).map((dir) => posix.join(dir, argv0));
}

function stdio(option: string, s: StdioOption | undefined, fallback: StdioOption): NativeStdio {
  const v = s ?? fallback;
  if (v === 'pipe') return 'pipe';
  if (v === 'ignore') return 'null';
  if (v === 'inherit') return option === 'stdin' ? 0 : option === 'stdout' ? 1 : 2;
  if (typeof v === 'number' && Number.isInteger(v) && v >= 0) return v;
  fail(option, `'${String(v)}' must be 'pipe', 'ignore', 'inherit' or an fd number`);
}

function rlimits(p: ProcessOptions): NativePlan['rlimits'] {
  const out: NonNullable<NativePlan['rlimits']> = [];
  for (const [name, value] of Object.entries(p.rlimits ?? {})) {
    const resource = native.rlimitResources[name];
    if (resource === undefined) fail(`rlimits.${name}`, `unknown resource (known: ${Object.keys(native.rlimitResources).join(', ')})`);
    const pair = typeof value === 'number' ? { soft: value, hard: value } : value;
    if (!pair || typeof pair.soft !== 'number' || typeof pair.hard !== 'number' || pair.soft > pair.hard || pair.soft < 0) {
      fail(`rlimits.${name}`, 'must be a number or { soft, hard } with 0 <= soft <= hard');
    }
    const enc = (n: number) => (n === Infinity ? -1 : Math.floor(n));
    out.push({ resource, soft: enc(pair.soft), hard: enc(pair.hard) });
  }
  return out;
}

export interface BuiltPlan {
  plan: NativePlan;
  /** Every op the addon runs (plan.opsPrefix's, then plan.ops), for error messages. */
  allOps: readonly NativeOp[];
  /** For error messages: a readable description of each native op. */
  describeOp(index: number): string;
}

export function describeNativeOp(op: NativeOp): string {
  switch (op.kind) {
    case 'bind':
      return `${op.readOnly ? 'ro-bind' : 'bind'} ${op.srcInRoot ? '(sandbox) ' : ''}${op.src} -> ${op.dst}`;
    case 'overlay':
      return `overlay ${op.dst} (lower ${op.lower.join(':')}${op.upperBase ? `, upper ${posix.join(op.upperBase, op.upper!)}, work ${posix.join(op.upperBase, op.work!)}` : ''})`;
    case 'symlink':
      return `symlink ${op.dst} -> ${op.src}`;
    case 'write-file':
      return `file ${op.dst}`;
    case 'mkdir':
      return `dir ${op.dst}`;
    default:
      return `${op.kind} ${op.dst}`;
  }
}

/** The sandbox half of a plan: namespaces, identity, mounts. */
export interface SandboxPart {
  namespaces: NamespaceName[];
  identity: Identity;
  hostname: string;
  /** 'layers': an overlay of host directories (options.root's `layers`). */
  root: 'host' | 'empty' | 'layers';
  /** The seccomp program every process of the sandbox runs under; undefined: none. */
  seccomp?: Buffer;
  /** Processes may create user namespaces (options.nesting). */
  nesting: boolean;
  /** /work exists (a host root's, or a workDir bound): the default cwd. */
  hasWork: boolean;
  /** Sizes of the sandbox's own tmpfs mounts, by mount point (what sb.limits.tmpfs reports). */
  tmpfs: Record<string, string>;
  /** Ops shared by every sandbox of this kind (the host root), prepared once. */
  prefix?: { ops: readonly NativeOp[]; prepared: PreparedOps };
  ops: NativeOp[];
  pivot: boolean;
  readOnlyRoot: boolean;
}

export interface ProcessDefaults {
  /** Variables every process of this sandbox starts with (before its own env). */
  env?: Record<string, string>;
  /** Capabilities granted unless the process asks for its own list. */
  capabilities?: string[];
  rlimits?: ProcessOptions['rlimits'];
}

function checkKeys(opts: object, allowed: Set<string>): void {
  for (const key of Object.keys(opts)) if (!allowed.has(key)) fail(key, 'unknown option');
}

/**
 * Validates the sandbox options and builds the mount plan; throws ConfigError.
 * `extra` comes from callers above the options (a persistent sandbox's
 * private overlays, environment layers): raw ops, and mounts validated and
 * named like the user's own, placed before `mounts`.
 */
export function buildSandboxPart(
  opts: SandboxOptions,
  extra: {
    ops?: NativeOp[];
    mounts?: NamedMount[];
    /**
     * With `root: { layers }`: the host directory holding the root's
     * writable `upper` and `work` directories (a persistent sandbox's own);
     * without it the upper is a tmpfs.
     */
    rootUpper?: string;
  } = {},
): SandboxPart {
  const ns = namespaces(opts);
  const id = identity(opts, ns);
  const root = rootKind(opts.root);
  if (!ns.has('pid') && (opts.proc ?? true) && root !== 'empty') {
    fail('namespaces.pid', 'a fresh /proc needs the PID namespace (set proc: false to go without)');
  }
  const hostname = opts.hostname ?? 'sandbox';
  if (typeof hostname !== 'string' || !/^[A-Za-z0-9]([A-Za-z0-9.-]{0,62})$/.test(hostname)) {
    fail('hostname', `'${String(hostname)}' is not a valid host name`);
  }
  if (opts.nesting !== undefined && typeof opts.nesting !== 'boolean') fail('nesting', 'must be a boolean');
  const seccomp = seccompProgram(opts.seccomp, { nesting: opts.nesting });
  const ops: NativeOp[] = [];
  const prefix = root === 'host' ? hostRoot(id.range) : undefined;
  const tmpfs: Record<string, string> = {};
  if (root === 'layers') {
    const layersRoot = layersRootOp((opts.root as { layers: unknown }).layers, id, extra.rootUpper);
    ops.push(layersRoot);
    if (layersRoot.kind === 'overlay' && layersRoot.upperTmpfs) tmpfs['/'] = TMPFS_SIZES.upper;
  } else {
    if (!prefix) ops.push(ROOT_TMPFS);
    tmpfs['/'] = TMPFS_SIZES.root;
  }
  if (root !== 'empty') {
    if (ns.has('uts')) ops.push(...identityFileOps(hostname));
    if (opts.dev ?? true) {
      ops.push(...devOps());
      tmpfs['/dev/shm'] = TMPFS_SIZES.shm;
    }
    if (opts.proc ?? true) ops.push(...procOps());
    const tmp = opts.tmp ?? true;
    if (tmp) {
      const size = typeof tmp === 'object' ? tmp.size : TMPFS_SIZES.tmp;
      ops.push({ kind: 'tmpfs', dst: '/tmp', data: tmpfsData('tmp.size', size, 0o1777), nosuid: true, nodev: true });
      tmpfs['/tmp'] = String(size);
    }
    if (opts.workDir !== undefined) {
      const src = hostDir('workDir', opts.workDir, 'workDir');
      ops.push({ kind: 'bind', src, dst: WORK_DIR, nosuid: true, nodev: true, ...hostSourceFlags(src, id.range) });
    } else if (root === 'host') {
      // A layers root is a writable tree of its own: /work only when asked.
      ops.push({ kind: 'tmpfs', dst: WORK_DIR, data: `mode=0755,size=${TMPFS_SIZES.work}`, nosuid: true, nodev: true });
      tmpfs[WORK_DIR] = TMPFS_SIZES.work;
    }
    // The home of uid 0 inside; HOME must exist for most tools (a layers
    // root brings its own /root, or not, as its image made it).
    if (root === 'host') ops.push({ kind: 'mkdir', dst: '/root', mode: 0o700 });
  } else if (opts.workDir !== undefined) {
    fail('workDir', "needs root 'host' (with root 'empty', bind it through mounts)");
  }
  ops.push(...(extra.ops ?? []));
  const own = opts.mounts ?? [];
  if (!Array.isArray(own)) fail('mounts', 'must be an array');
  const mounts = [...(extra.mounts ?? []), ...own.map((mount, i) => ({ option: `mounts[${i}]`, mount }))];
  checkConflicts(mounts);
  for (const { option, mount } of mounts) ops.push(...mountOps(mount, option, id));
  const rootSwitch = opts.rootSwitch ?? 'pivot_root';
  if (rootSwitch !== 'pivot_root' && rootSwitch !== 'chroot') fail('rootSwitch', "must be 'pivot_root' or 'chroot'");
  return { namespaces: [...ns], identity: id, hostname, root, seccomp, nesting: !!opts.nesting, hasWork: root === 'host' || (root === 'layers' && opts.workDir !== undefined), tmpfs, prefix, ops, pivot: rootSwitch === 'pivot_root', readOnlyRoot: !!opts.readOnlyRoot };
}

/** 'CAP_CHOWN' or 'chown' -> 0; an unknown name is a ConfigError naming `option`. */
export function capabilityNumbers(option: string, names: unknown): number[] {
  if (!Array.isArray(names)) fail(option, "must be a list of capability names like 'CAP_CHOWN'");
  return names.map((c) => {
    const name = typeof c === 'string' ? c.toUpperCase() : '';
    const n = CAPABILITIES[name.startsWith('CAP_') ? name : `CAP_${name}`];
    if (n === undefined) fail(option, `unknown capability '${String(c)}'`);
    return n;
  });
}

/** The process half: argv, environment, ids, capabilities, stdio, limits. */
export function buildProcessPart(
  opts: ProcessOptions,
  sandbox: SandboxPart,
  defaults: ProcessDefaults = {},
): Pick<NativePlan, 'argv' | 'env' | 'execCandidates' | 'cwd' | 'user' | 'initUser' | 'noNewPrivs' | 'keepCaps' | 'seccomp' | 'newSession' | 'dieWithParent' | 'rlimits' | 'stdio' | 'extraFds' | 'pty'> {
  if (!Array.isArray(opts.argv) || opts.argv.length === 0 || !opts.argv.every((a) => typeof a === 'string')) {
    fail('argv', 'must be a non-empty array of strings');
  }
  if (opts.argv.some((a) => a.includes('\0'))) fail('argv', 'contains a NUL byte');
  const id = sandbox.identity;
  const cwd = checkSandboxPath('cwd', opts.cwd ?? (sandbox.hasWork ? WORK_DIR : '/'));
  const user = opts.user;
  if (user !== undefined) {
    if (!Number.isInteger(user.uid) || !Number.isInteger(user.gid) || user.uid < 0 || user.gid < 0) fail('user', 'needs integer uid and gid');
    if (id.idCount > 1) {
      if (user.uid >= id.idCount || user.gid >= id.idCount) fail('user', `uid ${user.uid}/gid ${user.gid} is not mapped in the sandbox's user namespace (mapped: 0-${id.idCount - 1})`);
    } else if (id.userns && (user.uid !== id.insideUid || user.gid !== id.insideGid)) {
      fail('user', `uid ${user.uid}/gid ${user.gid} is not mapped in the sandbox's user namespace (mapped: ${id.insideUid}/${id.insideGid})`);
    }
  }
  const keepCaps = capabilityNumbers('capabilities', opts.capabilities ?? defaults.capabilities ?? []);
  // The kernel lets a process map its own uid 0 into a user namespace it
  // creates only if it held CAP_SETFCAP (verify_root_map): nesting keeps it.
  // It grants nothing else here: no_new_privs makes file capabilities inert.
  if (sandbox.nesting && !keepCaps.includes(CAPABILITIES.CAP_SETFCAP!)) keepCaps.push(CAPABILITIES.CAP_SETFCAP!);
  const noNewPrivs = opts.noNewPrivs ?? true;
  if (!noNewPrivs && sandbox.seccomp && !keepCaps.includes(CAPABILITIES.CAP_SYS_ADMIN!)) {
    fail('noNewPrivs', "false needs seccomp: 'none' or the CAP_SYS_ADMIN capability (the kernel takes a seccomp filter only under no_new_privs or from a holder of CAP_SYS_ADMIN)");
  }
  let pty: NativePlan['pty'];
  if (opts.pty) {
    const p = typeof opts.pty === 'object' ? opts.pty : {};
    pty = { cols: p.cols ?? 80, rows: p.rows ?? 24 };
  }
  const uidInside = user?.uid ?? id.insideUid;
  const env = environment({ ...opts, env: { ...defaults.env, ...opts.env } }, uidInside === 0 ? '/root' : WORK_DIR, !!pty);
  const extraFds = Object.entries(opts.fds ?? {}).map(([t, fd]) => {
    const target = Number(t);
    if (!Number.isInteger(target) || target < 3 || target > 255) fail(`fds.${t}`, 'target must be an fd number from 3 to 255');
    if (!Number.isInteger(fd) || fd < 0) fail(`fds.${t}`, 'must be an open fd number');
    return { target, fd };
  });
  if (opts.timeout !== undefined && (typeof opts.timeout !== 'number' || !(opts.timeout > 0))) fail('timeout', 'must be a positive number of milliseconds');
  // A remapped root caller's command always takes its ids: a command
  // joining a running sandbox starts as the caller's unmapped uid.
  const ids = user ?? id.initUser;
  return {
    argv: opts.argv,
    env,
    execCandidates: execCandidates(opts.argv[0]!, env),
    cwd,
    user: ids,
    initUser: id.initUser,
    noNewPrivs,
    keepCaps,
    seccomp: sandbox.seccomp,
    newSession: opts.newSession ?? true,
    dieWithParent: opts.dieWithParent ?? true,
    rlimits: rlimits({ rlimits: { ...defaults.rlimits, ...opts.rlimits } } as ProcessOptions),
    stdio: pty
      ? ['pty', 'pty', 'pty']
      : [stdio('stdin', opts.stdin, 'pipe'), stdio('stdout', opts.stdout, 'pipe'), stdio('stderr', opts.stderr, 'pipe')],
    extraFds,
    pty,
  };
}

/** Every op of a sandbox part, prefix included, as the addon numbers them. */
export function allOps(part: SandboxPart): readonly NativeOp[] {
  return part.prefix ? [...part.prefix.ops, ...part.ops] : part.ops;
}

export function sandboxPlanFields(part: SandboxPart): Pick<NativePlan, 'namespaces' | 'uidMap' | 'gidMap' | 'uidMapper' | 'gidMapper' | 'denySetgroups' | 'initUser' | 'hostname' | 'pivot' | 'rootReadOnly' | 'opsPrefix' | 'ops'> {
  const { identity: id } = part;
  return {
    namespaces: part.namespaces,
    // With helpers, the maps are theirs to write (uidMap only describes them).
    uidMap: id.uidMapper ? undefined : id.uidMap,
    gidMap: id.gidMapper ? undefined : id.gidMap,
    uidMapper: id.uidMapper,
    gidMapper: id.gidMapper,
    denySetgroups: id.denySetgroups,
    initUser: id.initUser,
    hostname: part.hostname,
    pivot: part.pivot,
    rootReadOnly: part.readOnlyRoot,
    opsPrefix: part.prefix?.prepared,
    ops: part.ops,
  };
}

export function describer(ops: readonly NativeOp[]): (index: number) => string {
  return (i) => (ops[i] ? describeNativeOp(ops[i]!) : 'setup');
}

/** Which kind of root `root` asks for; ConfigError if none. */
function rootKind(root: SandboxOptions['root']): SandboxPart['root'] {
  if (root === undefined || root === 'host') return 'host';
  if (root === 'empty') return 'empty';
  if (typeof root === 'object' && root !== null && !Array.isArray(root)) {
    for (const key of Object.keys(root)) if (key !== 'layers') fail(`root.${key}`, 'unknown option (root takes { layers })');
    return 'layers';
  }
  fail('root', `'${String(root)}' must be 'host', 'empty' or { layers: [...] }`);
}

/**
 * The root of `root: { layers }`: an overlay mounted on the new root itself
 * (native: stacked on /newroot before every other op, as the root tmpfs is
 * otherwise, so pivot_root finds a mount there), the layers read-only below
 * a private upper. A root caller's layers are idmapped like any host source.
 */
function layersRootOp(layers: unknown, id: Identity, rootUpper: string | undefined): NativeOp {
  if (!Array.isArray(layers) || layers.length === 0) fail('root.layers', 'needs at least one host directory (highest priority first)');
  const lower = layers.map((l, j) => hostDir(`root.layers[${j}]`, l, 'root layer'));
  if (!id.range && id.hostUids) {
    // Unmapped owners are nobody's inside: not even the sandbox's root may
    // create /etc/hostname or copy a file up (overlayfs: EOVERFLOW). Said
    // here rather than as a failed write of the setup.
    lower.forEach((dir, j) => {
      const owner = statSync(dir).uid;
      if (!id.hostUids!.some(([start, count]) => owner >= start && owner < start + count)) {
        fail(`root.layers[${j}]`, `root layer ${dir} belongs to uid ${owner}, which is not mapped in the sandbox (mapped: ${id.hostUids!.map(([a, n]) => (n === 1 ? a : `${a}-${a + n - 1}`)).join(', ')}): an unprivileged caller's layers must be its own, or its subordinate ids' with ids: 'range'`);
      }
    });
  }
  const { cloneInParent, idmap } = hostSourceFlags(lower[0]!, id.range);
  const op: NativeOp = { kind: 'overlay', dst: '/', lower, nosuid: true, nodev: true, userxattr: id.userns, cloneInParent, idmap };
  if (rootUpper === undefined) {
    op.upperTmpfs = true;
    op.data = `mode=0755,size=${TMPFS_SIZES.upper}`;
    return op;
  }
  const base = hostDir('root', rootUpper, 'root upper dir');
  Object.assign(op, { upperBase: base, upper: 'upper', work: 'work' });
  if (id.range) op.upperIdmap = hostSourceFlags(base, id.range).idmap;
  return op;
}

/** Validates options and builds the native plan; throws ConfigError. */
export function buildPlan(opts: SpawnOptions): BuiltPlan {
  if (typeof opts !== 'object' || opts === null) throw new ConfigError('options must be an object');
  checkKeys(opts, KNOWN_OPTION_KEYS);
  const sandbox = buildSandboxPart(opts);
  // A fresh sandbox has no cgroup: its process cap is RLIMIT_NPROC, counted
  // in its own user namespace.
  const plan: NativePlan = { ...sandboxPlanFields(sandbox), ...buildProcessPart(opts, sandbox, { rlimits: { nproc: DEFAULT_PIDS } }) };
  const ops = allOps(sandbox);
  return { plan, allOps: ops, describeOp: describer(ops) };
}
