/**
 * Typed wrapper of the native addon. The addon executes a plan; it holds no
 * policy. Everything here mirrors native/plan.cc and native/addon.cc.
 */
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { packageRoot } from './packageRoot.js';

export { packageRoot };

export type NamespaceName = 'user' | 'mount' | 'pid' | 'ipc' | 'uts' | 'net' | 'cgroup';

interface MountFlags {
  readOnly?: boolean;
  nosuid?: boolean;
  nodev?: boolean;
  noexec?: boolean;
  /** A missing source or target is skipped instead of failing. */
  optional?: boolean;
}

/**
 * Host sources cloned by the parent before the fork (a root caller's
 * sandbox runs as an unprivileged host id that cannot traverse root's
 * directories), and optionally shown through the sandbox's id mapping.
 */
interface HostSourceFlags {
  cloneInParent?: boolean;
  /** The bind source or the overlay's lower layers are idmapped (needs cloneInParent). */
  idmap?: boolean;
}

/** One step of the mount plan, executed in order inside the new root. */
export type NativeOp =
  | ({ kind: 'bind'; src: string; dst: string; srcInRoot?: boolean } & MountFlags & HostSourceFlags)
  | ({ kind: 'tmpfs'; dst: string; data?: string; mode?: number } & MountFlags)
  | ({ kind: 'proc'; dst: string } & MountFlags)
  | ({ kind: 'devpts'; dst: string; data?: string } & MountFlags)
  | ({ kind: 'mqueue'; dst: string } & MountFlags)
  | ({
      kind: 'overlay';
      dst: string;
      /** Host paths of the lower layers, highest first. */
      lower: string[];
      /** The host directory holding upper and work (overlayfs wants both on one mount)... */
      upperBase?: string;
      /** ... and upper and work relative to it. */
      upper?: string;
      work?: string;
      userxattr?: boolean;
      /** With cloneInParent: the upper base is idmapped too. */
      upperIdmap?: boolean;
      /** Upper and work on a fresh tmpfs of this overlay's own (options in `data`), not a host dir. */
      upperTmpfs?: boolean;
      data?: string;
    } & MountFlags &
      HostSourceFlags)
  | { kind: 'symlink'; src: string; dst: string }
  | { kind: 'mkdir'; dst: string; mode?: number }
  | { kind: 'write-file'; dst: string; data: string | Buffer; mode?: number }
  | ({ kind: 'remount'; dst: string } & MountFlags)
  | { kind: 'mask-file'; dst: string; optional?: boolean }
  | { kind: 'mask-dir'; dst: string; optional?: boolean };

export type NativeStdio = 'pipe' | 'null' | 'pty' | number;

/** Ops read by the addon once (prepareOps) and reused by many plans. Opaque. */
export type PreparedOps = { readonly __brand: 'PreparedOps' };

export interface NativePlan {
  namespaces: NamespaceName[];
  uidMap?: string;
  gidMap?: string;
  /**
   * Instead of uidMap/gidMap: a setuid helper's argv (newuidmap PID map...)
   * run by the addon before the child is released; argv[1] is replaced by
   * the child's pid.
   */
  uidMapper?: string[];
  gidMapper?: string[];
  denySetgroups?: boolean;
  /** Ids every process of the sandbox takes first (a root caller's remapped root). */
  initUser?: { uid: number; gid: number };
  hostname?: string;
  /** false: chroot instead of pivot_root (weaker, documented fallback). */
  pivot?: boolean;
  rootReadOnly?: boolean;
  /** Run before `ops`; op indices in errors count across both. */
  opsPrefix?: PreparedOps;
  ops: readonly NativeOp[];
  argv: string[];
  env: string[];
  /** argv[0] resolved against PATH, as paths inside the sandbox. */
  execCandidates: string[];
  cwd: string;
  user?: { uid: number; gid: number };
  noNewPrivs?: boolean;
  keepCaps?: number[];
  newSession?: boolean;
  dieWithParent?: boolean;
  /** A persistent sandbox: PID 1 starts nothing and waits for enter(). */
  hold?: boolean;
  /** cgroup.procs files every command of the sandbox joins before it runs. */
  cgroupProcs?: string[];
  /** A classic BPF program (struct sock_filter[]) installed last before execve. */
  seccomp?: Buffer;
  rlimits?: { resource: number; soft: number; hard: number }[];
  stdio: [NativeStdio, NativeStdio, NativeStdio];
  extraFds?: { target: number; fd: number }[];
  pty?: { cols: number; rows: number };
}

export interface NativeSpawnResult {
  /** Host pid of PID 1 (spawn) or of the command's monitor (enter); null if enter failed early. */
  pid: number | null;
  pidfd: number | null;
  /** Setup errors arrive here as 256-byte records; EOF means exec happened. */
  errFd: number;
  /** PID 1 writes the main process's wait status here before it exits. */
  statusFd: number;
  stdin: number | null;
  stdout: number | null;
  stderr: number | null;
  /** With plan.pty: the child sends the terminal's master fd over this socket. */
  ptySocket: number | null;
  /** enter(): kill-tree (0xff) and signal-number bytes for the command's monitor. */
  controlFd: number | null;
  /** Sources cloned for an idmapped mount whose filesystem refused the mapping. */
  idmapFallbacks: { op: number; errno: number }[];
  /**
   * Cloned by the spawner, not by Node: the process is not Node's child, and
   * its exit is learned from statusFd (watchExit's viaSpawner).
   */
  viaSpawner: boolean;
}

/** Which path spawns take (native.spawnerInfo()). */
export interface SpawnerInfo {
  /** 'spawner': clones are made by msbx-spawner; 'inprocess': by Node itself. */
  mode: 'spawner' | 'inprocess';
  /** The spawner's binary, in spawner mode. */
  path: string | null;
  /** The running spawner's pid; null until the first spawn (or after it died). */
  pid: number | null;
  /** Spawners started by this process so far. */
  started: number;
  /** Why the in-process path, when it is. */
  reason: string | null;
}

export interface ExitWatch {
  ref(): void;
  unref(): void;
}

interface Addon {
  spawn(plan: NativePlan): NativeSpawnResult;
  /** Reads ops once, for plan.opsPrefix. */
  prepareOps(ops: readonly NativeOp[]): PreparedOps;
  /** Runs plan's process in the namespaces of the sandbox whose PID 1 is targetPidfd. */
  enter(targetPidfd: number, plan: NativePlan): NativeSpawnResult;
  signal(pidfd: number, signo: number): boolean;
  resizePty(fd: number, cols: number, rows: number): void;
  watchExit(
    pidfd: number,
    statusFd: number,
    callback: (exitCode: number | null, signal: number | null, fromInit: boolean) => void,
    viaSpawner?: boolean,
  ): ExitWatch;
  /** Spawns from now on go to the spawner at `path`, or (null) are cloned by Node itself. */
  configureSpawner(path: string | null, reason?: string): void;
  spawnerInfo(): SpawnerInfo;
  /** Takes ownership of socketFd; calls back once with the fd received or an errno. */
  receiveFd(socketFd: number, callback: (errno: number | null, fd: number | null) => void): void;
  stepNames: string[];
  errorRecordSize: number;
  rlimitResources: Record<string, number>;
  /** Sent to a sandbox's PID 1: kill every other process in it. */
  killAllSignal: number;
  /** Written to a monitor's control fd: kill the command's whole subtree. */
  controlKillTree: number;
  /** Syscall numbers of the architecture the addon was built for. */
  syscalls: Record<string, number>;
}

const root = packageRoot();
// The loader is plain CommonJS shared with the install script (see addon.cjs);
// it ships as lib/native/addon.cjs, next to this file's source.
const { loadAddon, spawnerFile } = createRequire(import.meta.url)(join(root, 'lib', 'native', 'addon.cjs')) as {
  loadAddon(root: string): Addon;
  spawnerFile(root: string): { file?: string; reason?: string };
};

export const native: Addon = loadAddon(root);

export type SpawnMode = 'spawner' | 'inprocess';

/**
 * Chooses the path spawns take. 'spawner' (the default): sandboxes are
 * cloned by msbx-spawner, a small process of this package's, whose clones
 * cost the same whatever this process's heap; the addon falls back to
 * cloning in-process only when the binary is missing. 'inprocess': Node
 * clones them itself, as before the spawner existed. A spawner already
 * running is retired when the path changes (with the sandboxes it made
 * that die with their parent).
 */
export function setSpawnMode(mode: SpawnMode, env: NodeJS.ProcessEnv = process.env): SpawnerInfo {
  if (mode === 'inprocess') {
    native.configureSpawner(null, env.MINISANDBOX_SPAWNER === 'inprocess' ? 'MINISANDBOX_SPAWNER=inprocess' : 'chosen with setSpawnMode');
  } else {
    const { file, reason } = spawnerFile(root);
    // Asked for explicitly, a missing spawner is an error at the first
    // spawn (which names the file), not a silent fallback.
    if (reason === undefined || (env.MINISANDBOX_SPAWNER === 'spawner' && file)) native.configureSpawner(file!);
    else native.configureSpawner(null, `no spawner binary: ${reason}`);
  }
  return native.spawnerInfo();
}

/** MINISANDBOX_SPAWNER: 'inprocess', 'spawner', or unset (the spawner when its binary is there). */
function spawnModeFromEnv(env: NodeJS.ProcessEnv): SpawnMode {
  const v = env.MINISANDBOX_SPAWNER;
  if (v === undefined || v === '' || v === 'auto' || v === 'spawner') return 'spawner';
  if (v === 'inprocess') return 'inprocess';
  // A plain Error, as the loader's (addon.cjs): this room imports no other
  // room's errors, and this one stops the import of the package.
  throw new Error(`minisandbox: MINISANDBOX_SPAWNER='${v}': expected 'spawner', 'inprocess' or 'auto'`);
}

setSpawnMode(spawnModeFromEnv(process.env));

/** A setup failure as the child reported it. */
export interface ErrorRecord {
  step: string;
  errno: number;
  /** Index into plan.ops, or -1. */
  op: number;
  /** The kernel's own words, when a filesystem context logged them. */
  detail: string;
}

export function decodeErrorRecord(buf: Buffer): ErrorRecord {
  const stepIndex = buf.readInt32LE(0);
  const len = Math.max(0, Math.min(buf.readInt32LE(12), native.errorRecordSize - 16));
  return {
    step: native.stepNames[stepIndex] ?? `step-${stepIndex}`,
    errno: buf.readInt32LE(4),
    op: buf.readInt32LE(8),
    detail: buf.subarray(16, 16 + len).toString('utf8').replace(/\0+$/, '').trim(),
  };
}
