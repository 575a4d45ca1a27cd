/**
 * The public description of a sandbox and of the process started in it.
 * Plain objects: validated up front (validate.ts), turned into a native plan
 * (plan.ts), executed by the addon.
 */
import type { NamespaceName } from '../native/index.js';
import type { SeccompOption } from './seccomp.js';

export type { NamespaceName, SeccompOption };

/** A host path made visible inside the sandbox. Always recursive. */
export interface BindMount {
  type: 'bind';
  source: string;
  target: string;
  /** Default false (bwrap's --bind); read-only applies to every submount too. */
  readOnly?: boolean;
  /** Keep device nodes usable (bwrap's --dev-bind). Default false: nodev. */
  devices?: boolean;
  /** Skip silently when the source does not exist. */
  optional?: boolean;
}

export interface TmpfsMount {
  type: 'tmpfs';
  target: string;
  /** Bytes, or a tmpfs size string ("64m", "10%"). */
  size?: number | string;
  /** Octal permission bits of the mount's root, default 0o755. */
  mode?: number;
  readOnly?: boolean;
}

/** Overlay of host directories; without `upper` the result is read-only. */
export interface OverlayMount {
  type: 'overlay';
  target: string;
  /** Lower layers, highest priority first (as overlayfs orders them). */
  lower: string[];
  upper?: string;
  /** Empty directory on the same filesystem as `upper`. */
  work?: string;
}

export interface ProcMount {
  type: 'proc';
  target: string;
}

/** A minimal /dev: null, zero, full, random, urandom, tty, private devpts, shm. */
export interface DevMount {
  type: 'dev';
  target: string;
}

export interface SymlinkMount {
  type: 'symlink';
  target: string;
  /** The link text, stored as is (may be relative). */
  linkTo: string;
}

export interface DirMount {
  type: 'dir';
  target: string;
  mode?: number;
}

export interface FileMount {
  type: 'file';
  target: string;
  content: string;
  mode?: number;
}

export type Mount =
  | BindMount
  | TmpfsMount
  | OverlayMount
  | ProcMount
  | DevMount
  | SymlinkMount
  | DirMount
  | FileMount;

export type RlimitName =
  | 'as' | 'core' | 'cpu' | 'data' | 'fsize' | 'locks' | 'memlock' | 'msgqueue' | 'nice'
  | 'nofile' | 'nproc' | 'rss' | 'rtprio' | 'rttime' | 'sigpending' | 'stack';

/** A number sets soft and hard alike; `Infinity` means unlimited. */
export type RlimitValue = number | { soft: number; hard: number };

export type StdioOption = 'pipe' | 'ignore' | 'inherit' | number;

export interface SandboxOptions {
  /**
   * What the root holds before `mounts` are applied.
   * - 'host' (default): a read-only view of the host's /usr, /bin, /lib*,
   *   /sbin and a safe subset of /etc, with fresh /proc, /dev and /tmp.
   * - 'empty': an empty tmpfs; `mounts` must provide everything.
   * - { layers }: an overlay of these host directories (read-only, highest
   *   priority first, as OverlayMount.lower) below a private writable upper
   *   (Sandbox.create: in its private directory; run()/spawn(): a tmpfs),
   *   with fresh /proc, /dev and /tmp as for 'host'. Nothing of the host is
   *   visible but what `mounts` adds. Whiteouts in the layers are
   *   overlayfs's: a 0/0 character device hides a file, the xattr
   *   `user.overlay.opaque=y` a directory's lower content. /work exists
   *   only with `workDir`; the default cwd is then /work, else /.
   */
  root?: 'host' | 'empty' | { layers: string[] };
  /**
   * Ids mapped inside. 'single' (default): only the caller's own (see
   * mapUser). 'range': ids 0-65535, as in a container: a root caller's
   * sandbox always has them (its remapped range); another caller's own ids
   * are 0 inside and 1-65535 are the first ids of its /etc/subuid and
   * /etc/subgid entry, written by the setuid helpers newuidmap/newgidmap
   * (package uidmap), as rootless Podman does. A missing entry or helper is
   * a ConfigError saying which (policy.idRangeSupport() tells beforehand).
   */
  ids?: 'single' | 'range';
  /** Applied in order after the root's own mounts. */
  mounts?: Mount[];
  /**
   * A host directory bound read-write at /work (the sandbox's private
   * writable directory). Without it /work is a private tmpfs.
   */
  workDir?: string;
  /** Fresh procfs at /proc with sensitive paths masked (root 'host' only). Default true. */
  proc?: boolean;
  /** Minimal /dev (root 'host' only). Default true. */
  dev?: boolean;
  /** Private tmpfs at /tmp (root 'host' only). Default true (1 GiB); an object sets its size. */
  tmp?: boolean | { size: number | string };
  /** Make the root's top level read-only. Default false. */
  readOnlyRoot?: boolean;
  hostname?: string;
  /** 'none' (default): a new network namespace with only loopback up. */
  network?: 'none' | 'host';
  /**
   * Namespaces to create besides mount and network. All default true.
   * `user: false` is for root callers only and leaves the sandbox with
   * real capabilities on the host: avoid it.
   */
  namespaces?: Partial<Record<Exclude<NamespaceName, 'mount' | 'net'>, boolean>>;
  /**
   * Who the caller is inside: 'root' (default) maps the caller to uid 0,
   * 'self' maps it to its own uid and gid. A root caller is never mapped to
   * the host's root: its sandbox's ids 0-65535 are an unprivileged host
   * range (policy.ts rootIdRange), and host binds are idmapped so that
   * root's files still look root's inside.
   */
  mapUser?: 'root' | 'self';
  /**
   * The seccomp filter of every process in the sandbox: 'default' (Docker's
   * default profile, as policy: lib/sandbox/seccomp.ts), 'none', or the
   * defaults extended and relaxed by syscall name.
   */
  seccomp?: SeccompOption;
  /**
   * Let processes inside create user and cgroup namespaces (to run bwrap,
   * podman or unshare inside): the seccomp rules against them go, and every
   * process keeps CAP_SETFCAP, without which the kernel refuses to map root
   * into a nested user namespace. Default false.
   */
  nesting?: boolean;
  /** Root switch: 'pivot_root' (default) or the weaker 'chroot' fallback. */
  rootSwitch?: 'pivot_root' | 'chroot';
}

export interface ProcessOptions {
  /** The command and its arguments; argv[0] is looked up in PATH inside the sandbox. */
  argv: string[];
  /** Added to the sandbox's small default environment (PATH, HOME, LANG). */
  env?: Record<string, string>;
  /** Host variables to pass through: true for all, or their names. Default none. */
  inheritEnv?: boolean | string[];
  /** Absolute path inside the sandbox. Default /work. */
  cwd?: string;
  /** uid and gid inside the sandbox; must be mapped (see mapUser). */
  user?: { uid: number; gid: number };
  rlimits?: Partial<Record<RlimitName, RlimitValue>>;
  /** Capabilities to keep (e.g. 'CAP_CHOWN'); all are dropped by default. */
  capabilities?: string[];
  /** Default true: setuid binaries and file capabilities grant nothing. */
  noNewPrivs?: boolean;
  /** Default true: setsid(), no controlling terminal of the caller's. */
  newSession?: boolean;
  /** Default true: the sandbox dies if this Node process dies. */
  dieWithParent?: boolean;
  stdin?: StdioOption;
  stdout?: StdioOption;
  stderr?: StdioOption;
  /** Run on a new pseudo-terminal (stdio all on it); its master is `proc.terminal`. */
  pty?: boolean | { cols?: number; rows?: number };
  /** Extra fds for the sandboxed process: { 3: someFd }. Targets 3..255. */
  fds?: Record<number, number>;
  /** Kill the whole tree after this many milliseconds. */
  timeout?: number;
  /** Kill the whole tree when aborted. */
  signal?: AbortSignal;
}

export type SpawnOptions = SandboxOptions & ProcessOptions;

export interface RunOptions extends SpawnOptions {
  /** Written to stdin, which is then closed. */
  input?: string | Buffer;
  /** Per stream; past it the tree is killed and `isMaxBuffer` set. Default 100 MiB. */
  maxBuffer?: number;
  /** 'utf8' (default) gives strings, 'buffer' gives Buffers. */
  encoding?: 'utf8' | 'buffer';
}
