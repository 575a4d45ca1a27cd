/**
 * What this machine lets a sandbox do, checked for real (by starting small
 * sandboxes), with the reason wherever something does not work.
 */
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { release, tmpdir } from 'node:os';
import { join } from 'node:path';
import { writable as canWrite } from './limits.js';
import { RANGE_IDS, idRangeSupport, rootIdRange } from './policy.js';
import { run } from './run.js';
import { DEFAULT_SECCOMP_RULES } from './seccomp.js';
import { removeTree } from '../files/fsTree.js';
import { native } from '../native/index.js';

export interface Check {
  name: string;
  ok: boolean;
  /** What was found, or why it fails and what to do. */
  detail: string;
}

function readSysctl(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8').trim();
  } catch {
    return undefined;
  }
}

function kernelCheck(): Check {
  const [major = 0, minor = 0] = release().split('.').map((n) => parseInt(n, 10));
  const ok = major > 5 || (major === 5 && minor >= 12);
  return {
    name: 'kernel',
    ok,
    detail: ok
      ? `Linux ${release()} (>= 5.12: unprivileged overlay, mount_setattr, pidfd, clone3)`
      : `Linux ${release()} is older than 5.12; recursive read-only binds (mount_setattr) and unprivileged overlay need 5.12`,
  };
}

function userNamespaceSysctls(): Check {
  const problems: string[] = [];
  const clone = readSysctl('/proc/sys/kernel/unprivileged_userns_clone');
  if (clone === '0') problems.push('kernel.unprivileged_userns_clone=0 (set it to 1)');
  const max = readSysctl('/proc/sys/user/max_user_namespaces');
  if (max === '0') problems.push('user.max_user_namespaces=0 (set it to e.g. 65536)');
  const apparmor = readSysctl('/proc/sys/kernel/apparmor_restrict_unprivileged_userns');
  if (apparmor === '1') problems.push('kernel.apparmor_restrict_unprivileged_userns=1 (Ubuntu >= 23.10: set it to 0, or give node an AppArmor profile with "userns,")');
  return {
    name: 'user namespace sysctls',
    ok: problems.length === 0,
    detail: problems.length ? problems.join('; ') : `max_user_namespaces=${max ?? '?'}, no distribution restriction found`,
  };
}

async function sandboxCheck(name: string, what: string, opts: Parameters<typeof run>[0]): Promise<Check> {
  try {
    const r = await run({ ...opts, timeout: 10_000 });
    if (r.exitCode === 0) return { name, ok: true, detail: `${what}: works` };
    return { name, ok: false, detail: `${what}: exited ${r.exitCode ?? r.signal}: ${r.stderr.trim()}` };
  } catch (e) {
    return { name, ok: false, detail: `${what}: ${(e as Error).message}` };
  }
}

async function overlayCheck(): Promise<Check> {
  const dir = mkdtempSync(join(tmpdir(), 'msbx-doctor-'));
  try {
    for (const d of ['lower/sub', 'upper', 'work']) mkdirSync(join(dir, d), { recursive: true });
    writeFileSync(join(dir, 'lower/sub/f'), 'x');
    // Removing a lower directory is what fails without userxattr (EIO).
    return await sandboxCheck('overlayfs (userxattr)', 'overlay of a private upper over a shared lower', {
      argv: ['sh', '-c', 'rm -r /o/sub && echo y > /o/new && test ! -e /o/sub'],
      mounts: [{ type: 'overlay', target: '/o', lower: [join(dir, 'lower')], upper: join(dir, 'upper'), work: join(dir, 'work') }],
    });
  } finally {
    await removeTree(dir); // overlay leaves a mode-000 work dir that rmSync cannot enter
  }
}

function cgroupCheck(): Check {
  if (existsSync('/sys/fs/cgroup/cgroup.controllers')) {
    const controllers = readSysctl('/sys/fs/cgroup/cgroup.controllers') ?? '';
    const writable = canWrite('/sys/fs/cgroup/cgroup.procs');
    return {
      name: 'cgroups',
      ok: writable,
      detail: writable
        ? `cgroup v2 (${controllers}), writable: memory/pids/cpu limits enforced`
        : `cgroup v2 (${controllers}) not delegated to this user: limits fall back to rlimits (use systemd-run --user --scope -p Delegate=yes)`,
    };
  }
  const v1 = ['memory', 'pids', 'cpu'].filter((c) => existsSync(`/sys/fs/cgroup/${c}/cgroup.procs`));
  if (v1.length === 0) return { name: 'cgroups', ok: false, detail: 'no cgroup v1 or v2 hierarchy found: limits fall back to rlimits' };
  const writable = canWrite(`/sys/fs/cgroup/${v1[0]}`); // v1 is root's
  return {
    name: 'cgroups',
    ok: writable,
    detail: writable
      ? `cgroup v1 (${v1.join(', ')}), writable as root: limits enforced`
      : `cgroup v1 (${v1.join(', ')}) is root-only: for this user limits fall back to rlimits`,
  };
}

async function seccompCheck(): Promise<Check> {
  const name = 'seccomp';
  try {
    // unshare -U is refused by the filter (and only by it, in a user namespace).
    const r = await run({ argv: ['sh', '-c', 'grep "^Seccomp:" /proc/self/status; unshare -U true 2>/dev/null; echo "unshare=$?"'], timeout: 10_000 });
    const mode = /Seccomp:\s+(\d)/.exec(r.stdout)?.[1];
    const refused = /unshare=1/.test(r.stdout);
    const ok = mode === '2' && refused;
    const names = [...new Set(DEFAULT_SECCOMP_RULES.map((x) => x.syscall))];
    return {
      name,
      ok,
      detail: ok
        ? `default filter installed (${names.length} syscalls ruled); keyctl, add_key, bpf, io_uring_*, userfaultfd, perf_event_open, kexec, modules and new user namespaces refused (EPERM)`
        : `the filter is not in force: Seccomp: ${mode ?? '?'}, unshare -U ${refused ? 'refused' : 'allowed'}`,
    };
  } catch (e) {
    return { name, ok: false, detail: (e as Error).message };
  }
}

async function idMappingCheck(): Promise<Check> {
  const name = 'id mapping';
  if (process.getuid?.() !== 0) {
    return { name, ok: true, detail: 'this user is root inside its sandboxes, and nobody else is mapped (one id)' };
  }
  const range = rootIdRange();
  const where = `root's sandboxes run as host ids ${range.uid}-${range.uid + range.count - 1} (uids) and ${range.gid}-${range.gid + range.count - 1} (gids), never as the host's root`;
  try {
    // With idmapped mounts the host's root-owned /usr looks root-owned inside.
    const r = await run({ argv: ['stat', '-c', '%u', '/usr'], timeout: 10_000 });
    const idmapped = r.stdout.trim() === '0';
    return { name, ok: true, detail: `${where}; host binds ${idmapped ? 'are idmapped (root\'s files look root\'s inside)' : 'could not be idmapped here: root\'s files show as nobody inside'}` };
  } catch (e) {
    return { name, ok: false, detail: `${where}; ${(e as Error).message}` };
  }
}

export const ID_RANGE_CHECK = "id range (ids: 'range')";

/** Whether `ids: 'range'` (ids 0-65535 inside, container images) is available, and why not. */
async function idRangeCheck(): Promise<Check> {
  const name = ID_RANGE_CHECK;
  const r = idRangeSupport();
  if (!r.ok) return { name, ok: false, detail: `${r.reason}; sandboxes still run, with one id (images' owners are squashed to it)` };
  // Root's range starts at inside 0; a user's subordinate ids at inside 1.
  const n = r.caller === 'root' ? r.uid.count : RANGE_IDS - 1;
  const ids = `uids ${r.uid.start}-${r.uid.start + n - 1}, gids ${r.gid.start}-${r.gid.start + n - 1}`;
  if (r.caller === 'root') return { name, ok: true, detail: `root's sandboxes always map ids 0-65535 (${ids})` };
  // The helpers can still refuse (a range not this user's, a nosuid /usr): try them.
  const check = await sandboxCheck(name, 'a sandbox with ids 0-65535 mapped', { argv: ['true'], ids: 'range' });
  return check.ok ? { name, ok: true, detail: `0 inside is this user, 1-65535 are its subordinate ${ids}, mapped by newuidmap/newgidmap` } : check;
}

function fuseCheck(): Check {
  const usable = canWrite('/dev/fuse');
  return { name: '/dev/fuse', ok: true, detail: `${usable ? 'usable' : 'not usable by this user'} (not needed: overlayfs is used)` };
}

/**
 * Which path spawns take: the spawner (clones that cost the same whatever
 * Node's heap) or Node itself. Run after a sandbox check, so a spawner that
 * cannot start has already failed it with its reason.
 */
function spawnerCheck(): Check {
  const info = native.spawnerInfo();
  if (info.mode === 'inprocess') {
    // The in-process path works; it only costs more with a big heap.
    return { name: 'spawn path', ok: true, detail: `in-process: Node clones each sandbox itself (${info.reason}); each clone copies Node's page tables` };
  }
  const running = info.pid !== null ? `running as pid ${info.pid}` : 'not running (it died, or nothing was spawned yet)';
  return { name: 'spawn path', ok: info.pid !== null, detail: `spawner ${info.path}, ${running}` };
}

export async function doctor(): Promise<Check[]> {
  return [
    kernelCheck(),
    userNamespaceSysctls(),
    await sandboxCheck('user+mount+pid+ipc+uts+net namespaces, pivot_root, pidfd', 'a full sandbox running /bin/true', { argv: ['true'] }),
    await sandboxCheck('fresh /proc and private devpts', 'reading /proc/self/status and allocating a terminal', {
      argv: ['sh', '-c', 'test -r /proc/self/status && tty >/dev/null'],
      pty: true,
    }),
    spawnerCheck(),
    await overlayCheck(),
    await seccompCheck(),
    await idMappingCheck(),
    await idRangeCheck(),
    cgroupCheck(),
    fuseCheck(),
  ];
}
