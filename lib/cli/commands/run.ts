/** `minisandbox run`: bubblewrap-style options, then the command. */
import { constants as osConstants } from 'node:os';
import { spawn } from '../../sandbox/process.js';
import type { Mount, SpawnOptions } from '../../sandbox/options.js';
import { UsageError, assignment, oneOf, seconds, type Args, type Command, type Given, type OptionSpec } from '../args.js';

const FS = 'Filesystem (applied in order, after the default root)';
const PROCESS = 'Process';
const SECURITY = 'Security';

const bindLike = (help: string): OptionSpec => ({ values: ['SRC', 'DST'], repeatable: true, section: FS, help });
const mountAt = (values: string[], help: string): OptionSpec => ({ values, repeatable: true, section: FS, help });

const OPTIONS: Record<string, OptionSpec> = {
  '--ro-bind': bindLike('Bind host path SRC at DST read-only (every submount too)'),
  '--bind': bindLike('Bind host path SRC at DST read-write'),
  '--dev-bind': bindLike('Like --bind, device nodes usable'),
  '--bind-try': bindLike('Like --bind, skipped if SRC does not exist'),
  '--tmpfs': mountAt(['DST'], 'Fresh tmpfs at DST (see --size)'),
  '--size': mountAt(['SIZE'], 'Size of the next --tmpfs (bytes, or 64m, 10%)'),
  '--overlay': mountAt(['LOWER[:LOWER...]', 'UPPER', 'WORK', 'DST'], 'Overlay: writes go to UPPER (WORK: empty dir, same fs)'),
  '--ro-overlay': mountAt(['LOWER[:LOWER...]', 'DST'], 'Read-only overlay of the lower dirs'),
  '--symlink': mountAt(['TEXT', 'DST'], 'Symlink at DST pointing to TEXT'),
  '--dir': mountAt(['DST'], 'Create directory DST'),
  '--file': mountAt(['TEXT', 'DST'], 'Create file DST holding TEXT'),
  '--proc': mountAt(['DST'], 'Extra fresh procfs at DST'),
  '--dev': mountAt(['DST'], 'Extra minimal /dev at DST'),
  '--workdir': { values: ['DIR'], section: FS, option: 'workDir', help: 'Host DIR bound read-write at /work (default: private tmpfs)' },
  '--root': { values: ['host|empty'], check: oneOf('host', 'empty'), section: FS, option: 'root', help: 'Start from the host view (default) or an empty root' },
  '--ro-root': { section: FS, option: 'readOnlyRoot', help: "Make the root's top level read-only" },
  '--chroot': { section: FS, option: 'rootSwitch', help: 'Switch root with chroot instead of pivot_root (weaker)' },

  '--chdir': { values: ['DIR'], section: PROCESS, option: 'cwd', help: 'Working directory inside (default /work)' },
  '--env': { values: ['NAME=VALUE'], check: assignment, repeatable: true, section: PROCESS, option: 'env', help: 'Set a variable (the environment starts nearly empty)' },
  '--inherit-env': { values: ['NAME'], optionalValue: true, repeatable: true, section: PROCESS, option: 'inheritEnv', help: 'Pass the host variable NAME (or, alone, all of them)' },
  '--map-self': { section: PROCESS, option: 'mapUser', help: 'Be your own uid inside instead of root' },
  '--cap-add': { values: ['CAP'], repeatable: true, section: PROCESS, option: 'capabilities', help: 'Keep a capability (all are dropped by default)' },
  '--rlimit': { values: ['NAME=N'], check: assignment, repeatable: true, section: PROCESS, option: 'rlimits', help: 'Set a resource limit (nofile=1024, as=..., nproc=..., or unlimited)' },
  '--hostname': { values: ['NAME'], section: PROCESS, option: 'hostname', help: 'Host name inside (default: sandbox)' },
  '--net': { values: ['none|host'], check: oneOf('none', 'host'), section: PROCESS, option: 'network', help: "No network but loopback (default), or the host's" },
  '--pty': { section: PROCESS, option: 'pty', help: 'Run on a new pseudo-terminal, relayed to this one' },
  '--timeout': { values: ['SECONDS'], check: seconds, section: PROCESS, option: 'timeout', help: 'Kill the whole sandbox after SECONDS' },

  '--seccomp': { values: ['default|none'], check: oneOf('default', 'none'), section: SECURITY, option: 'seccomp', help: "The syscall filter (default: Docker's default profile)" },
  '--seccomp-deny': { values: ['NAME'], repeatable: true, section: SECURITY, option: 'seccomp.deny', help: 'Refuse syscall NAME too (EPERM)' },
  '--seccomp-allow': { values: ['NAME'], repeatable: true, section: SECURITY, option: 'seccomp.allow', help: 'Let syscall NAME through though the defaults refuse it' },
  '--nesting': { section: SECURITY, option: 'nesting', help: 'Allow user namespaces inside (bwrap, podman, unshare -r)' },
};

function signalExit(signal: NodeJS.Signals): number {
  return 128 + (osConstants.signals[signal] ?? 0);
}

/** The mount a filesystem option makes, or undefined for an option that is not one. */
function mountOf(g: Given, size: string | undefined): Mount | undefined {
  const v = g.values;
  switch (g.flag) {
    case '--ro-bind':
    case '--bind':
    case '--dev-bind':
    case '--bind-try':
      return { type: 'bind', source: v[0]!, target: v[1]!, readOnly: g.flag === '--ro-bind', devices: g.flag === '--dev-bind', optional: g.flag === '--bind-try' };
    case '--tmpfs':
      return { type: 'tmpfs', target: v[0]!, ...(size !== undefined ? { size } : {}) };
    case '--overlay':
      return { type: 'overlay', lower: v[0]!.split(':'), upper: v[1]!, work: v[2]!, target: v[3]! };
    case '--ro-overlay':
      return { type: 'overlay', lower: v[0]!.split(':'), target: v[1]! };
    case '--symlink':
      return { type: 'symlink', linkTo: v[0]!, target: v[1]! };
    case '--dir':
      return { type: 'dir', target: v[0]! };
    case '--file':
      return { type: 'file', content: v[0]!, target: v[1]! };
    case '--proc':
      return { type: 'proc', target: v[0]! };
    case '--dev':
      return { type: 'dev', target: v[0]! };
    default:
      return undefined;
  }
}

/** The spawn options the command line asks for; each mount's flag is recorded for errors about it. */
export function spawnOptions(args: Args): SpawnOptions {
  const mounts: Mount[] = [];
  let size: Given | undefined;
  for (const g of args.given) {
    if (g.flag === '--size') {
      if (size) throw new UsageError(`${size.text}: no --tmpfs follows it`);
      size = g;
      continue;
    }
    // The library names a variable's or a limit's errors by its name: `env.X`, `rlimits.nofile`.
    if (g.flag === '--env' || g.flag === '--rlimit') args.blame(`${g.flag === '--env' ? 'env' : 'rlimits'}.${(g.value as [string, string])[0]}`, g);
    const mount = mountOf(g, size?.values[0]);
    if (!mount) continue;
    args.blame(`mounts[${mounts.length}]`, size && g.flag === '--tmpfs' ? { text: `${size.text} ${g.text}`, values: g.values } : g);
    if (g.flag === '--tmpfs') size = undefined;
    mounts.push(mount);
  }
  if (size) throw new UsageError(`${size.text}: no --tmpfs follows it`);

  const opts: SpawnOptions = {
    argv: [...args.command],
    mounts,
    env: Object.fromEntries(args.all<[string, string]>('--env')),
    stdin: 'inherit',
    stdout: 'inherit',
    stderr: 'inherit',
  };
  const workDir = args.get('--workdir');
  if (workDir !== undefined) opts.workDir = workDir;
  const root = args.get<'host' | 'empty'>('--root');
  if (root) opts.root = root;
  if (args.has('--ro-root')) opts.readOnlyRoot = true;
  if (args.has('--chroot')) opts.rootSwitch = 'chroot';
  const cwd = args.get('--chdir');
  if (cwd !== undefined) opts.cwd = cwd;
  // --inherit-env alone passes everything; with names, only those.
  const inherit = args.all<string | string[]>('--inherit-env');
  if (inherit.length) opts.inheritEnv = inherit.some((v) => Array.isArray(v)) ? true : (inherit as string[]);
  if (args.has('--map-self')) opts.mapUser = 'self';
  const caps = args.all('--cap-add');
  if (caps.length) opts.capabilities = caps;
  for (const [name, n] of args.all<[string, string]>('--rlimit')) {
    const value = n === 'unlimited' ? Infinity : Number(n);
    if (n.trim() === '' || Number.isNaN(value)) throw new UsageError(`--rlimit: expected NAME=N or NAME=unlimited, got '${name}=${n}'`);
    opts.rlimits = { ...opts.rlimits, [name]: value };
  }
  const hostname = args.get('--hostname');
  if (hostname !== undefined) opts.hostname = hostname;
  const network = args.get<'none' | 'host'>('--net');
  if (network) opts.network = network;
  if (args.has('--pty')) opts.pty = { cols: process.stdout.columns ?? 80, rows: process.stdout.rows ?? 24 };
  const timeout = args.get<number>('--timeout');
  if (timeout !== undefined) opts.timeout = timeout * 1000;
  const seccomp = args.get<'default' | 'none'>('--seccomp');
  const deny = args.all('--seccomp-deny');
  const allow = args.all('--seccomp-allow');
  if (seccomp && (deny.length || allow.length)) throw new UsageError(`--seccomp ${seccomp} cannot be combined with --seccomp-deny or --seccomp-allow`);
  if (seccomp) opts.seccomp = seccomp;
  else if (deny.length || allow.length) opts.seccomp = { ...(deny.length ? { deny } : {}), ...(allow.length ? { allow } : {}) };
  if (args.has('--nesting')) opts.nesting = true;
  return opts;
}

/** Relays this terminal to the sandbox's pseudo-terminal, in raw mode. */
async function relayTerminal(proc: ReturnType<typeof spawn>): Promise<void> {
  await proc.ready;
  const term = proc.terminal!;
  const stdin = process.stdin;
  if (stdin.isTTY) stdin.setRawMode(true);
  stdin.on('data', (d) => term.write(d));
  term.on('data', (d) => process.stdout.write(d));
  const resize = () => term.resize(process.stdout.columns ?? 80, process.stdout.rows ?? 24);
  process.stdout.on('resize', resize);
  await proc.exited.finally(() => {
    if (stdin.isTTY) stdin.setRawMode(false);
    stdin.pause();
    process.stdout.off('resize', resize);
  });
}

const runCommand: Command = {
  spec: {
    name: 'run',
    about: `Runs COMMAND in a new sandbox: its own user, mount, PID, IPC, UTS and
network namespaces, a root of read-only host /usr, /bin, /lib* and a safe
part of /etc, fresh /proc, /dev and /tmp, a private /work as cwd. Nothing of
the host is visible or writable unless an option below says so.`,
    options: OPTIONS,
    command: 'COMMAND',
    exitCodes: `Exit code: COMMAND's own, or 128+N when signal N killed it (137 at
--timeout); 125 when the sandbox could not be set up; 2 on usage errors.`,
  },
  run: async (args) => {
  const opts = spawnOptions(args);
  const proc = spawn(opts);
  // Ctrl-C and friends reach the sandbox through its PID 1.
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => proc.kill(sig));
  if (opts.pty) await relayTerminal(proc);
  const exit = await proc.exited;
  if (proc.timedOut) process.stderr.write(`minisandbox: timed out after ${opts.timeout! / 1000}s, sandbox killed\n`);
  return exit.exitCode ?? signalExit(exit.signal ?? 'SIGKILL');
  },
};

export const commands = [runCommand];
