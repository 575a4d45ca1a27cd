/**
 * Defaults and policy, kept here where they can be read and tested: what the
 * host-binds root contains, what a minimal /dev holds, which /proc paths are
 * hidden. The native side only executes the ops built from these lists.
 */
import { lstatSync, readFileSync, readlinkSync, statSync, watch, type FSWatcher } from 'node:fs';
import { userInfo } from 'node:os';
import { native, type NativeOp, type PreparedOps } from '../native/index.js';

/**
 * Host ids a root caller's sandbox runs as: its root is the first, never the
 * host's root (as rootless Podman's subuids, or Docker's userns-remap). The
 * range is the `minisandbox` entry of /etc/subuid and /etc/subgid where
 * there is one, else DEFAULT_ROOT_ID_RANGE. One range for every sandbox:
 * sandboxes cannot see each other's processes or files, so sharing ids
 * costs them nothing, as with Docker's single remapped range.
 */
export interface IdRange {
  uid: number;
  gid: number;
  count: number;
}

/** Above systemd's container range (524288-1879048191), below the ids some tools read as negative. */
export const DEFAULT_ROOT_ID_RANGE: IdRange = { uid: 1879048192, gid: 1879048192, count: 65536 };

export const SUBID_USER = 'minisandbox';

/**
 * The files the subordinate id ranges are read from (shadow's format,
 * `name-or-uid:start:count`). A property, not a constant, so a test can
 * point the reader at a file of its own.
 */
export const SUBID_FILES = { uid: '/etc/subuid', gid: '/etc/subgid' };

/** A run of host ids: `start` to `start + count - 1`. */
export interface SubidRange {
  start: number;
  count: number;
}

/**
 * The first entry of `file` for any of `names` (a user name or a uid in
 * decimal: shadow accepts both), at most 65536 ids of it; undefined when the
 * file is missing or has none.
 */
export function subidEntry(file: string, names: readonly string[] = [SUBID_USER]): SubidRange | undefined {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch {
    return undefined;
  }
  for (const line of text.split('\n')) {
    const [name, start, count] = line.trim().split(':');
    if (name === undefined || !names.includes(name)) continue;
    const s = Number(start);
    const c = Number(count);
    if (Number.isInteger(s) && Number.isInteger(c) && s > 0 && c > 0) return { start: s, count: Math.min(c, 65536) };
  }
  return undefined;
}

let rootIdRangeCache: IdRange | undefined;

export function rootIdRange(): IdRange {
  if (rootIdRangeCache) return rootIdRangeCache;
  const u = subidEntry('/etc/subuid');
  const g = subidEntry('/etc/subgid');
  rootIdRangeCache = u && g ? { uid: u.start, gid: g.start, count: Math.min(u.count, g.count) } : DEFAULT_ROOT_ID_RANGE;
  return rootIdRangeCache;
}

/** Ids an `ids: 'range'` sandbox maps: 0 to RANGE_IDS - 1 inside. */
export const RANGE_IDS = 65536;

/** Where the setuid map helpers (package uidmap) are looked for, in order. */
export const MAP_HELPER_DIRS = ['/usr/bin', '/bin', '/usr/sbin', '/sbin', '/usr/local/bin'];

/**
 * An unprivileged caller's `ids: 'range'`: its own ids are 0 inside, its
 * subordinate ranges 1-65535, written by the helpers (`argv[1]`, the pid,
 * is filled in by the addon).
 */
export interface CallerIdRange {
  uid: SubidRange;
  gid: SubidRange;
  uidMapper: string[];
  gidMapper: string[];
  /** "inside outside count" lines, as /proc/PID/uid_map will show them. */
  uidMap: string;
  gidMap: string;
}

/** What `ids: 'range'` gives this caller, or why it cannot. */
export type IdRangeSupport =
  | { ok: true; uid: SubidRange; gid: SubidRange; caller: 'root' | 'subid' }
  | { ok: false; reason: string };

function findHelper(name: string): string | undefined {
  for (const dir of MAP_HELPER_DIRS) {
    try {
      const st = statSync(`${dir}/${name}`);
      if (st.isFile()) return `${dir}/${name}`;
    } catch {
      // not here
    }
  }
  return undefined;
}

/**
 * The caller's `ids: 'range'` mapping, or why there is none. Read on every
 * call (two small files): an entry added while the process runs counts.
 */
export function callerIdRange(): CallerIdRange | { reason: string } {
  const uid = process.getuid?.() ?? 0;
  const gid = process.getgid?.() ?? 0;
  let name: string | undefined;
  try {
    name = userInfo().username;
  } catch {
    // no passwd entry: only the uid form can match
  }
  const who = name ?? `uid ${uid}`;
  const names = name ? [name, String(uid)] : [String(uid)];
  const u = subidEntry(SUBID_FILES.uid, names);
  const g = subidEntry(SUBID_FILES.gid, names);
  const missing = [!u && SUBID_FILES.uid, !g && SUBID_FILES.gid].filter(Boolean);
  if (missing.length) {
    return { reason: `needs a ${missing.join(' and a ')} entry for ${who} (e.g. '${name ?? uid}:100000:65536', as \`usermod --add-subuids 100000-165535 --add-subgids 100000-165535 ${name ?? uid}\` writes)` };
  }
  if (u!.count < RANGE_IDS - 1 || g!.count < RANGE_IDS - 1) {
    return { reason: `needs ${RANGE_IDS - 1} subordinate ids for ${who}; ${SUBID_FILES.uid} gives ${u!.count}, ${SUBID_FILES.gid} gives ${g!.count}` };
  }
  const newuidmap = findHelper('newuidmap');
  const newgidmap = findHelper('newgidmap');
  const helpers = [!newuidmap && 'newuidmap', !newgidmap && 'newgidmap'].filter(Boolean);
  if (helpers.length) {
    return { reason: `needs the setuid helpers newuidmap and newgidmap (package uidmap); ${helpers.join(' and ')} not found in ${MAP_HELPER_DIRS.join(', ')}` };
  }
  const n = RANGE_IDS - 1;
  return {
    uid: u!,
    gid: g!,
    uidMapper: [newuidmap!, '', '0', String(uid), '1', '1', String(u!.start), String(n)],
    gidMapper: [newgidmap!, '', '0', String(gid), '1', '1', String(g!.start), String(n)],
    uidMap: `0 ${uid} 1\n1 ${u!.start} ${n}\n`,
    gidMap: `0 ${gid} 1\n1 ${g!.start} ${n}\n`,
  };
}

/**
 * Whether a sandbox of this caller can have `ids: 'range'`, and the host
 * ids it would use: a root caller always (its remapped range, see
 * rootIdRange), another caller with a /etc/subuid and /etc/subgid entry
 * and the uidmap helpers. For other rooms (images) and `doctor`.
 */
export function idRangeSupport(): IdRangeSupport {
  if ((process.getuid?.() ?? 0) === 0) {
    const r = rootIdRange();
    return { ok: true, uid: { start: r.uid, count: r.count }, gid: { start: r.gid, count: r.count }, caller: 'root' };
  }
  const r = callerIdRange();
  if ('reason' in r) return { ok: false, reason: `ids: 'range' ${r.reason}` };
  return { ok: true, uid: r.uid, gid: r.gid, caller: 'subid' };
}

/** Top-level host directories the 'host' root shows read-only. */
export const HOST_ROOT_DIRS = ['/usr', '/bin', '/sbin', '/lib', '/lib32', '/lib64', '/libx32'];

/**
 * The part of the host's /etc a program needs to run: name service files,
 * the dynamic loader cache, TLS roots, locale and shell defaults. Secrets
 * (shadow, ssh host keys, sudoers, credentials of services) stay out.
 */
export const HOST_ETC_ENTRIES = [
  'alternatives', 'bash.bashrc', 'ca-certificates', 'ca-certificates.conf', 'debian_version',
  'environment', 'gai.conf', 'gitconfig', 'group', 'host.conf', 'inputrc', 'ld.so.cache',
  'ld.so.conf', 'ld.so.conf.d', 'locale.alias', 'localtime', 'login.defs', 'magic', 'magic.mime',
  'mime.types', 'networks', 'nsswitch.conf', 'os-release', 'passwd', 'profile', 'profile.d',
  'protocols', 'python3', 'python3.11', 'resolv.conf', 'services', 'shells', 'skel', 'ssl',
  'terminfo', 'timezone', 'xattr.conf',
];

/** Device nodes bound from the host into a minimal /dev (bwrap's list). */
export const DEV_NODES = ['null', 'zero', 'full', 'random', 'urandom', 'tty'];

/** /proc paths hidden as in the OCI/Docker defaults (files get /dev/null, dirs an empty tmpfs). */
export const PROC_MASKED_FILES = ['kcore', 'keys', 'latency_stats', 'timer_list', 'timer_stats', 'sched_debug', 'sysrq-trigger'];
export const PROC_MASKED_DIRS = ['acpi', 'asound', 'scsi'];
/** /proc paths left visible but read-only. */
export const PROC_READONLY = ['bus', 'fs', 'irq', 'sys'];

export const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** The sandbox's private writable directory and default cwd. */
export const WORK_DIR = '/work';

/**
 * Small host files are copied into the sandbox's root rather than bound: a
 * write into a tmpfs costs a fraction of a mount, and the sandbox then
 * holds (and tears down) far fewer mounts. The copy is private to the
 * sandbox; the host file is never reachable from it. (hostRoot() reads
 * them again only when the host changes them.)
 */
export const COPY_FILES_UP_TO = 256 * 1024;

/**
 * Most processes and threads alive at once in a sandbox unless its limits
 * say otherwise: a fork bomb stops there, a parallel build or test suite
 * does not (the host's pid_max may be as low as 32768).
 */
export const DEFAULT_PIDS = 1024;

/**
 * Sizes of the sandbox's own tmpfs mounts. Without a size a tmpfs may grow
 * to half the host's RAM; these let a build or a test suite work and stop a
 * runaway one. tmpfs pages count against a memory limit as well.
 */
export const TMPFS_SIZES = {
  /** The root's own tmpfs: copied /etc files and mount points. */
  root: '256m',
  tmp: '1g',
  /** /work when it is a tmpfs (run() without workDir). */
  work: '1g',
  /** The writable upper of a one-shot sandbox's `root: { layers }`. */
  upper: '1g',
  /** Docker's default /dev/shm. */
  shm: '64m',
  /** /dev holds only device binds, symlinks and mount points. */
  dev: '1m',
} as const;

/**
 * How a host bind or overlay of a root caller's sandbox is made: the parent
 * clones the source (the sandbox's unprivileged host id cannot traverse
 * root's directories), shown through the sandbox's id mapping so that the
 * host's root-owned files look root-owned inside, unless the source belongs
 * to the sandbox's own host id already (its private directories).
 */
export function hostSourceFlags(path: string, range: IdRange | undefined): { cloneInParent?: boolean; idmap?: boolean } {
  if (!range) return {};
  let owner: number | undefined;
  try {
    owner = lstatSync(path).uid;
  } catch {
    // missing: the native side reports it (or skips an optional bind)
  }
  return { cloneInParent: true, idmap: owner !== range.uid };
}

/**
 * Ops for a host path in the 'host' root: a symlink stays a symlink (merged
 * /usr: /bin -> usr/bin), a small regular file is copied, a directory (or a
 * large file) becomes a read-only bind, a missing path is skipped.
 */
export function mirrorHostPath(path: string, target = path, range?: IdRange): NativeOp[] {
  let st;
  try {
    st = lstatSync(path);
  } catch {
    return [];
  }
  if (st.isSymbolicLink()) return [{ kind: 'symlink', src: readlinkSync(path), dst: target }];
  if (st.isFile() && st.size <= COPY_FILES_UP_TO) {
    try {
      return [{ kind: 'write-file', dst: target, data: readFileSync(path), mode: st.mode & 0o777 }];
    } catch {
      return []; // unreadable for this user: the sandbox does not get it either
    }
  }
  return [{ kind: 'bind', src: path, dst: target, readOnly: true, nosuid: true, nodev: true, ...hostSourceFlags(path, range) }];
}

/** The sandbox root's own tmpfs, the first op of every plan. */
export const ROOT_TMPFS: NativeOp = { kind: 'tmpfs', dst: '/', data: `mode=0755,size=${TMPFS_SIZES.root}`, nosuid: true, nodev: true };

/**
 * How long the host root's ops are reused where the host cannot be watched
 * (inotify's limits reached): a change under /etc reaches new sandboxes
 * within this time. Where it can, they are reused until the host changes
 * one of the paths they mirror (watchHostRoot).
 */
export const HOST_ROOT_TTL_MS = 1000;

export interface HostRoot {
  /** The root tmpfs and the host paths it shows, in order. */
  ops: readonly NativeOp[];
  /** The same, already read by the addon (plan.opsPrefix). */
  prepared: PreparedOps;
}

/** One cache per id mapping: a root caller's binds are idmapped. */
const hostRootCache = new Map<string, { root: HostRoot; at: number }>();

/** Watches on / and /etc while they hold; undefined before the first hostRoot(), [] once watching failed. */
let hostRootWatchers: FSWatcher[] | undefined;

/**
 * Drops the cached host root whenever an entry it mirrors changes on the
 * host (written, replaced, removed, created, chmod or chown): inotify
 * watches on / and /etc, which keep no event loop alive. Looking at ~45
 * host paths, copying the small files and handing the ops to the addon
 * cost more than the rest of a plan, so rebuilding them for every sandbox
 * made a start several milliseconds slower, while the host's /etc changes
 * rarely. A change reaches the next sandbox as soon as Node's event loop
 * has seen its event. False when the watches cannot be set (then
 * HOST_ROOT_TTL_MS applies).
 */
function watchHostRoot(): boolean {
  if (hostRootWatchers) return hostRootWatchers.length > 0;
  const watched: Array<[string, readonly string[]]> = [
    ['/', HOST_ROOT_DIRS.map((d) => d.slice(1))],
    ['/etc', HOST_ETC_ENTRIES],
  ];
  const stop = () => {
    for (const w of hostRootWatchers ?? []) w.close();
    hostRootWatchers = [];
    hostRootCache.clear();
  };
  hostRootWatchers = [];
  try {
    for (const [dir, names] of watched) {
      const w = watch(dir, { persistent: false }, (_event, name) => {
        if (name === null || names.includes(String(name))) hostRootCache.clear();
      });
      // A watch that fails later (its directory replaced, the queue
      // overflowing) can no longer vouch for the cache: back to the TTL.
      w.on('error', stop);
      hostRootWatchers.push(w);
    }
  } catch {
    stop();
  }
  return hostRootWatchers.length > 0;
}

export function hostRoot(range?: IdRange): HostRoot {
  const now = performance.now();
  const key = range ? `${range.uid}:${range.gid}:${range.count}` : '';
  const watching = watchHostRoot();
  const cached = hostRootCache.get(key);
  if (cached && (watching || now - cached.at < HOST_ROOT_TTL_MS)) return cached.root;
  const ops: NativeOp[] = [ROOT_TMPFS];
  for (const dir of HOST_ROOT_DIRS) ops.push(...mirrorHostPath(dir, dir, range));
  for (const entry of HOST_ETC_ENTRIES) ops.push(...mirrorHostPath(`/etc/${entry}`, `/etc/${entry}`, range));
  const root = { ops, prepared: native.prepareOps(ops) };
  hostRootCache.set(key, { root, at: now });
  return root;
}

/** /etc/hostname and /etc/hosts of the sandbox's own, so the name resolves. */
export function identityFileOps(hostname: string): NativeOp[] {
  return [
    { kind: 'write-file', dst: '/etc/hostname', data: `${hostname}\n`, mode: 0o644 },
    {
      kind: 'write-file',
      dst: '/etc/hosts',
      data: `127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t${hostname}\n`,
      mode: 0o644,
    },
  ];
}

export function devOps(target = '/dev'): NativeOp[] {
  const ops: NativeOp[] = [{ kind: 'tmpfs', dst: target, data: `mode=0755,size=${TMPFS_SIZES.dev}`, nosuid: true, noexec: true }];
  for (const node of DEV_NODES) {
    // Not nodev: these are device nodes and must open, for writing too (a
    // read-only mount does not stop writes to a device). Read-only stops
    // chmod, chown and utimes: the nodes are the host's own.
    ops.push({ kind: 'bind', src: `/dev/${node}`, dst: `${target}/${node}`, readOnly: true, nosuid: true, noexec: true });
  }
  for (const [name, link] of [
    ['stdin', '/proc/self/fd/0'],
    ['stdout', '/proc/self/fd/1'],
    ['stderr', '/proc/self/fd/2'],
    ['fd', '/proc/self/fd'],
    ['core', '/proc/kcore'],
    ['ptmx', 'pts/ptmx'],
  ] as const) {
    ops.push({ kind: 'symlink', src: link, dst: `${target}/${name}` });
  }
  // A private devpts instance: the sandbox sees only its own terminals.
  ops.push({ kind: 'devpts', dst: `${target}/pts`, data: 'newinstance,ptmxmode=0666,mode=620', nosuid: true, noexec: true });
  ops.push({ kind: 'tmpfs', dst: `${target}/shm`, data: `mode=1777,size=${TMPFS_SIZES.shm}`, nosuid: true, nodev: true });
  return ops;
}

/** A fresh procfs (needs the PID namespace) with the sensitive paths hidden. */
export function procOps(target = '/proc'): NativeOp[] {
  const ops: NativeOp[] = [{ kind: 'proc', dst: target, nosuid: true, nodev: true, noexec: true }];
  for (const f of PROC_MASKED_FILES) ops.push({ kind: 'mask-file', dst: `${target}/${f}`, optional: true });
  for (const d of PROC_MASKED_DIRS) ops.push({ kind: 'mask-dir', dst: `${target}/${d}`, optional: true });
  for (const p of PROC_READONLY) {
    ops.push({ kind: 'bind', src: `${target}/${p}`, dst: `${target}/${p}`, srcInRoot: true, readOnly: true, nosuid: true, nodev: true, noexec: true, optional: true });
  }
  return ops;
}

/**
 * Capabilities that let the sandbox's root work with files regardless of
 * their modes, as root in a container would: read-only environment layers,
 * files a command left unreadable. In the sandbox's user namespace they reach
 * only files of ids mapped into it, and read-only mounts stay read-only.
 */
export const FILE_CAPABILITIES = ['CAP_DAC_OVERRIDE', 'CAP_DAC_READ_SEARCH', 'CAP_FOWNER', 'CAP_CHOWN'];

/** Capability numbers (linux/capability.h), for `capabilities: ['CAP_CHOWN']`. */
export const CAPABILITIES: Record<string, number> = {
  CAP_CHOWN: 0, CAP_DAC_OVERRIDE: 1, CAP_DAC_READ_SEARCH: 2, CAP_FOWNER: 3, CAP_FSETID: 4,
  CAP_KILL: 5, CAP_SETGID: 6, CAP_SETUID: 7, CAP_SETPCAP: 8, CAP_LINUX_IMMUTABLE: 9,
  CAP_NET_BIND_SERVICE: 10, CAP_NET_BROADCAST: 11, CAP_NET_ADMIN: 12, CAP_NET_RAW: 13,
  CAP_IPC_LOCK: 14, CAP_IPC_OWNER: 15, CAP_SYS_MODULE: 16, CAP_SYS_RAWIO: 17, CAP_SYS_CHROOT: 18,
  CAP_SYS_PTRACE: 19, CAP_SYS_PACCT: 20, CAP_SYS_ADMIN: 21, CAP_SYS_BOOT: 22, CAP_SYS_NICE: 23,
  CAP_SYS_RESOURCE: 24, CAP_SYS_TIME: 25, CAP_SYS_TTY_CONFIG: 26, CAP_MKNOD: 27, CAP_LEASE: 28,
  CAP_AUDIT_WRITE: 29, CAP_AUDIT_CONTROL: 30, CAP_SETFCAP: 31, CAP_MAC_OVERRIDE: 32,
  CAP_MAC_ADMIN: 33, CAP_SYSLOG: 34, CAP_WAKE_ALARM: 35, CAP_BLOCK_SUSPEND: 36, CAP_AUDIT_READ: 37,
  CAP_PERFMON: 38, CAP_BPF: 39, CAP_CHECKPOINT_RESTORE: 40,
};
