/**
 * Per-sandbox limits on memory, processes and CPU: cgroups where this
 * caller may use them (v1 as root, v2 when delegated), rlimits otherwise.
 * What is really in force is reported, never assumed.
 */
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync, accessSync, constants } from 'node:fs';
import { join } from 'node:path';
import { ConfigError } from './errors.js';
import type { RlimitName, RlimitValue } from './options.js';
import { DEFAULT_PIDS } from './policy.js';

export interface Limits {
  /** Bytes, or a size like '512m', '2g'. */
  memory?: number | string;
  /** Most processes (and threads) alive at once; default DEFAULT_PIDS (1024), null for none. */
  pids?: number | null;
  /** CPU time as a number of cores, e.g. 0.5 or 2. */
  cpu?: number;
}

export type EnforcedBy = 'cgroup v1' | 'cgroup v2' | 'rlimit' | 'none';

export interface LimitReport {
  memory: { limit: number | null; enforcedBy: EnforcedBy; note?: string };
  pids: { limit: number | null; enforcedBy: EnforcedBy; note?: string };
  cpu: { limit: number | null; enforcedBy: EnforcedBy; note?: string };
  /** Sizes of the sandbox's own tmpfs mounts (memory, counted in a memory limit), by mount point. */
  tmpfs: Record<string, string>;
  /** Writes to /work and overlay uppers on the host's disk. */
  disk: { limit: null; enforcedBy: 'none'; note: string };
}

export function parseSize(option: string, v: number | string): number {
  if (typeof v === 'number' && Number.isFinite(v) && v > 0) return Math.floor(v);
  const m = typeof v === 'string' ? /^(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?$/i.exec(v.trim()) : null;
  if (!m) throw new ConfigError(`${option}: '${String(v)}' must be bytes or a size like '512m'`, option);
  const mult = { '': 1, k: 1024, m: 1024 ** 2, g: 1024 ** 3, t: 1024 ** 4 }[m[2]!.toLowerCase() as '' | 'k' | 'm' | 'g' | 't'];
  return Math.floor(parseFloat(m[1]!) * mult);
}

const V1 = '/sys/fs/cgroup';
const CPU_PERIOD_US = 100_000;

/** Whether this process may write `path` (a cgroup file or directory, a device). */
export function writable(path: string): boolean {
  try {
    accessSync(path, constants.W_OK);
    return true;
  } catch {
    return false;
  }
}

function readCounter(file: string, key: string): number {
  try {
    const line = readFileSync(file, 'utf8').split('\n').find((l) => l.startsWith(`${key} `));
    return line ? Number(line.split(' ')[1]) : 0;
  } catch {
    return 0;
  }
}

/** The cgroup v2 directory of this process, if v2 is mounted and delegated to us. */
function delegatedV2(): string | null {
  if (!existsSync(join(V1, 'cgroup.controllers'))) return null;
  const self = readFileSync('/proc/self/cgroup', 'utf8').split('\n').find((l) => l.startsWith('0::'));
  if (!self) return null;
  // Processes may not live in a cgroup whose controllers are handed down,
  // so sandboxes go next to us under a parent we can write.
  const parent = join(V1, self.slice(3), '..');
  const control = join(parent, 'cgroup.subtree_control');
  if (!writable(parent) || !existsSync(control)) return null;
  const enabled = readFileSync(control, 'utf8');
  return ['memory', 'pids', 'cpu'].every((c) => enabled.includes(c)) ? parent : null;
}

/** Where the cgroups of sandbox `id` are (or would be): v1 per controller, or delegated v2. */
function cgroupDirsOf(id: string): string[] {
  const v2 = delegatedV2();
  if (v2) return [join(v2, `minisandbox-${id}`)];
  return ['memory', 'pids', 'cpu'].map((c) => join(V1, c, 'minisandbox', id));
}

/**
 * Removes the cgroups of a sandbox whose processes are all gone (its owner
 * died without closing it). Returns what could not be removed, and why.
 */
export function removeSandboxCgroups(id: string): { dir: string; reason: string }[] {
  const failed: { dir: string; reason: string }[] = [];
  for (const dir of cgroupDirsOf(id)) {
    try {
      rmdirSync(dir);
    } catch (e) {
      const err = e as NodeJS.ErrnoException;
      if (err.code !== 'ENOENT') failed.push({ dir, reason: err.code === 'EBUSY' ? 'processes still run in it' : err.message });
    }
  }
  return failed;
}

/** The cgroups (or rlimits) of one sandbox. */
export class SandboxLimits {
  /** cgroup.procs files a new process of the sandbox joins before it runs. */
  readonly procsFiles: string[] = [];
  /** Fallback rlimits for every process of the sandbox. */
  readonly rlimits: Partial<Record<RlimitName, RlimitValue>> = {};
  readonly report: LimitReport;
  readonly #dirs: string[] = [];
  readonly #memoryEvents: { file: string; key: string } | null = null;
  readonly #pidsEvents: { file: string; key: string } | null = null;

  constructor(id: string, limits: Limits = {}) {
    const memory = limits.memory !== undefined ? parseSize('limits.memory', limits.memory) : null;
    const pids = limits.pids ?? null;
    const cpu = limits.cpu ?? null;
    if (pids !== null && (!Number.isInteger(pids) || pids < 1)) throw new ConfigError('limits.pids: must be a positive integer, or null for no limit', 'limits.pids');
    if (cpu !== null && !(cpu > 0)) throw new ConfigError('limits.cpu: must be a positive number of cores', 'limits.cpu');
    const none = { enforcedBy: 'none' as EnforcedBy };
    this.report = {
      memory: { limit: memory, ...none },
      pids: { limit: pids, ...none },
      cpu: { limit: cpu, ...none },
      tmpfs: {},
      disk: { limit: null, enforcedBy: 'none', note: 'not bounded: this filesystem has no per-directory quota for the sandbox to use' },
    };
    if (limits.pids === undefined) {
      // The default cap is an rlimit even where a cgroup could hold it: on
      // cgroup v1 every command would pay a migration into the cgroup
      // (milliseconds), a cost only a limit the caller asked for is worth.
      this.rlimits.nproc = DEFAULT_PIDS;
      this.report.pids = { limit: DEFAULT_PIDS, enforcedBy: 'rlimit', note: 'the default: RLIMIT_NPROC, counted for the sandbox user in its own user namespace' };
    }
    if (memory === null && pids === null && cpu === null) return;

    const isRoot = process.getuid?.() === 0;
    const v2 = delegatedV2();
    if (v2) {
      const dir = this.#mkdir(join(v2, `minisandbox-${id}`));
      if (memory !== null) writeFileSync(join(dir, 'memory.max'), String(memory));
      if (pids !== null) writeFileSync(join(dir, 'pids.max'), String(pids));
      if (cpu !== null) writeFileSync(join(dir, 'cpu.max'), `${Math.round(cpu * CPU_PERIOD_US)} ${CPU_PERIOD_US}`);
      this.procsFiles.push(join(dir, 'cgroup.procs'));
      this.#memoryEvents = { file: join(dir, 'memory.events'), key: 'oom_kill' };
      this.#pidsEvents = { file: join(dir, 'pids.events'), key: 'max' };
      for (const k of ['memory', 'pids', 'cpu'] as const) if (this.report[k].limit !== null) this.report[k].enforcedBy = 'cgroup v2';
      return;
    }
    const v1 = (c: string) => isRoot && writable(join(V1, c));
    if (memory !== null && v1('memory')) {
      const dir = this.#mkdir(join(V1, 'memory', 'minisandbox', id));
      writeFileSync(join(dir, 'memory.limit_in_bytes'), String(memory));
      this.procsFiles.push(join(dir, 'cgroup.procs'));
      this.#memoryEvents = { file: join(dir, 'memory.oom_control'), key: 'oom_kill' };
      this.report.memory.enforcedBy = 'cgroup v1';
    } else if (memory !== null) {
      this.rlimits.as = memory;
      this.report.memory = { limit: memory, enforcedBy: 'rlimit', note: 'address space of each process (RLIMIT_AS), not the sandbox total' };
    }
    if (pids !== null && v1('pids')) {
      const dir = this.#mkdir(join(V1, 'pids', 'minisandbox', id));
      writeFileSync(join(dir, 'pids.max'), String(pids));
      this.procsFiles.push(join(dir, 'cgroup.procs'));
      this.#pidsEvents = { file: join(dir, 'pids.events'), key: 'max' };
      this.report.pids.enforcedBy = 'cgroup v1';
    } else if (pids !== null) {
      // Counted per user in the sandbox's own user namespace: per sandbox.
      this.rlimits.nproc = pids;
      this.report.pids = { limit: pids, enforcedBy: 'rlimit', note: 'RLIMIT_NPROC, counted for the sandbox user in its own user namespace' };
    }
    if (cpu !== null && v1('cpu')) {
      const dir = this.#mkdir(join(V1, 'cpu', 'minisandbox', id));
      writeFileSync(join(dir, 'cpu.cfs_period_us'), String(CPU_PERIOD_US));
      writeFileSync(join(dir, 'cpu.cfs_quota_us'), String(Math.round(cpu * CPU_PERIOD_US)));
      this.procsFiles.push(join(dir, 'cgroup.procs'));
      this.report.cpu.enforcedBy = 'cgroup v1';
    } else if (cpu !== null) {
      this.report.cpu.note = 'no cgroup available to this user: CPU is not limited';
    }
  }

  #mkdir(dir: string): string {
    mkdirSync(dir, { recursive: true });
    this.#dirs.push(dir);
    return dir;
  }

  /** OOM kills in this sandbox so far (cgroups only). */
  oomKills(): number {
    return this.#memoryEvents ? readCounter(this.#memoryEvents.file, this.#memoryEvents.key) : 0;
  }

  /** Forks refused at the pids limit so far (cgroups only). */
  pidsLimitHits(): number {
    return this.#pidsEvents ? readCounter(this.#pidsEvents.file, this.#pidsEvents.key) : 0;
  }

  /** Removes the cgroups; call once every process of the sandbox is gone. */
  async remove(): Promise<void> {
    for (const dir of this.#dirs) {
      for (let attempt = 0; ; attempt++) {
        try {
          rmdirSync(dir);
          break;
        } catch (e) {
          const code = (e as NodeJS.ErrnoException).code;
          if (code === 'ENOENT') break;
          // EBUSY while the last killed processes finish exiting.
          if (attempt >= 50) throw e;
          await new Promise((r) => setTimeout(r, 10));
        }
      }
    }
  }
}
