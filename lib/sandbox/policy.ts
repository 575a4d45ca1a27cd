/**
 * Defaults and policy, kept here where they can be read and tested: what the
 * host-binds root contains, what a minimal /dev holds, which /proc paths are
 * hidden. The native side only executes the ops built from these lists.
 */
import { lstatSync, readFileSync, readlinkSync } from 'node:fs';
import { native, type NativeOp, type PreparedOps } from '../native/index.js';

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
 * them at most once per HOST_ROOT_TTL_MS.)
 */
export const COPY_FILES_UP_TO = 256 * 1024;

/**
 * Ops for a host path in the 'host' root: a symlink stays a symlink (merged
 * /usr: /bin -> usr/bin), a small regular file is copied, a directory (or a
 * large file) becomes a read-only bind, a missing path is skipped.
 */
export function mirrorHostPath(path: string, target = path): NativeOp[] {
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
  return [{ kind: 'bind', src: path, dst: target, readOnly: true, nosuid: true, nodev: true }];
}

/** The sandbox root's own tmpfs, the first op of every plan. */
export const ROOT_TMPFS: NativeOp = { kind: 'tmpfs', dst: '/', data: 'mode=0755', nosuid: true, nodev: true };

/**
 * How long the host root's ops are reused: looking at ~45 host paths, and
 * handing ~50 op objects to the addon, cost more than the rest of a plan. A
 * change under /etc reaches new sandboxes within this time.
 */
export const HOST_ROOT_TTL_MS = 1000;

export interface HostRoot {
  /** The root tmpfs and the host paths it shows, in order. */
  ops: readonly NativeOp[];
  /** The same, already read by the addon (plan.opsPrefix). */
  prepared: PreparedOps;
}

let hostRootCache: { root: HostRoot; at: number } | undefined;

export function hostRoot(): HostRoot {
  const now = performance.now();
  if (hostRootCache && now - hostRootCache.at < HOST_ROOT_TTL_MS) return hostRootCache.root;
  const ops: NativeOp[] = [ROOT_TMPFS];
  for (const dir of HOST_ROOT_DIRS) ops.push(...mirrorHostPath(dir));
  for (const entry of HOST_ETC_ENTRIES) ops.push(...mirrorHostPath(`/etc/${entry}`));
  const root = { ops, prepared: native.prepareOps(ops) };
  hostRootCache = { root, at: now };
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
  const ops: NativeOp[] = [{ kind: 'tmpfs', dst: target, data: 'mode=0755', nosuid: true, noexec: true }];
  for (const node of DEV_NODES) {
    // Not nodev: these are device nodes and must open.
    ops.push({ kind: 'bind', src: `/dev/${node}`, dst: `${target}/${node}`, nosuid: true, noexec: true });
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
  ops.push({ kind: 'tmpfs', dst: `${target}/shm`, data: 'mode=1777', nosuid: true, nodev: true });
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
