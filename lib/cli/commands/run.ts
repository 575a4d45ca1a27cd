/** `minisandbox run`: bubblewrap-style options, then the command. */
import { constants as osConstants } from 'node:os';
import { spawn } from '../../sandbox/process.js';
import type { Mount, SpawnOptions } from '../../sandbox/options.js';
import { ArgReader, UsageError } from '../args.js';

export const RUN_HELP = `Usage: minisandbox run [OPTIONS] -- COMMAND [ARGS...]

Runs COMMAND in a new sandbox: its own user, mount, PID, IPC, UTS and
network namespaces, a root of read-only host /usr, /bin, /lib* and a safe
part of /etc, fresh /proc, /dev and /tmp, a private /work as cwd. Nothing of
the host is visible or writable unless an option below says so. The exit
code of COMMAND is passed through (128+N when killed by signal N).

Filesystem (applied in order, after the default root):
  --ro-bind SRC DST      Bind host path SRC at DST read-only (every submount too)
  --bind SRC DST         Bind host path SRC at DST read-write
  --dev-bind SRC DST     Like --bind, device nodes usable
  --bind-try SRC DST     Like --bind, skipped if SRC does not exist
  --tmpfs DST            Fresh tmpfs at DST (see --size)
  --size SIZE            Size of the next --tmpfs (bytes, or 64m, 10%)
  --overlay LOWER[:LOWER...] UPPER WORK DST
                         Overlay: writes go to UPPER (WORK: empty dir, same fs)
  --ro-overlay LOWER[:LOWER...] DST
                         Read-only overlay of the lower dirs
  --symlink TEXT DST     Symlink at DST pointing to TEXT
  --dir DST              Create directory DST
  --file TEXT DST        Create file DST holding TEXT
  --proc DST             Extra fresh procfs at DST
  --dev DST              Extra minimal /dev at DST
  --workdir DIR          Host DIR bound read-write at /work (default: private tmpfs)
  --root host|empty      Start from the host view (default) or an empty root
  --ro-root              Make the root's top level read-only
  --chroot               Switch root with chroot instead of pivot_root (weaker)

Process:
  --chdir DIR            Working directory inside (default /work)
  --env NAME=VALUE       Set a variable (the environment starts nearly empty)
  --inherit-env [NAME]   Pass the host variable NAME (or, alone, all of them)
  --map-self             Be your own uid inside instead of root
  --cap-add CAP          Keep a capability (all are dropped by default)
  --rlimit NAME=N        Set a resource limit (nofile=1024, as=..., nproc=...)
  --hostname NAME        Host name inside (default: sandbox)
  --net none|host        No network but loopback (default), or the host's
  --pty                  Run on a new pseudo-terminal, relayed to this one
  --timeout SECONDS      Kill the whole sandbox after SECONDS

Security:
  --seccomp default|none The syscall filter (default: Docker's default profile)
  --seccomp-deny NAME    Refuse syscall NAME too (EPERM); repeatable
  --seccomp-allow NAME   Let syscall NAME through though the defaults refuse it
  --nesting              Allow user namespaces inside (bwrap, podman, unshare -r)
  -h, --help             This help
`;

function signalExit(signal: NodeJS.Signals): number {
  return 128 + (osConstants.signals[signal] ?? 0);
}

export function parseRunArgs(argv: string[]): SpawnOptions | 'help' {
  const r = new ArgReader(argv);
  const mounts: Mount[] = [];
  const env: Record<string, string> = {};
  const opts: SpawnOptions = { argv: [], mounts, env, stdin: 'inherit', stdout: 'inherit', stderr: 'inherit' };
  let size: string | undefined;
  while (!r.done) {
    const a = r.next();
    switch (a) {
      case '--':
        opts.argv = r.rest();
        break;
      case '-h':
      case '--help':
        return 'help';
      case '--ro-bind':
      case '--bind':
      case '--dev-bind':
      case '--bind-try': {
        const [source, target] = r.values(a, 2) as [string, string];
        mounts.push({ type: 'bind', source, target, readOnly: a === '--ro-bind', devices: a === '--dev-bind', optional: a === '--bind-try' });
        break;
      }
      case '--tmpfs':
        mounts.push({ type: 'tmpfs', target: r.value(a), ...(size ? { size } : {}) });
        size = undefined;
        break;
      case '--size':
        size = r.value(a);
        break;
      case '--overlay': {
        const [lower, upper, work, target] = r.values(a, 4) as [string, string, string, string];
        mounts.push({ type: 'overlay', lower: lower.split(':'), upper, work, target });
        break;
      }
      case '--ro-overlay': {
        const [lower, target] = r.values(a, 2) as [string, string];
        mounts.push({ type: 'overlay', lower: lower.split(':'), target });
        break;
      }
      case '--symlink': {
        const [linkTo, target] = r.values(a, 2) as [string, string];
        mounts.push({ type: 'symlink', linkTo, target });
        break;
      }
      case '--dir':
        mounts.push({ type: 'dir', target: r.value(a) });
        break;
      case '--file': {
        const [content, target] = r.values(a, 2) as [string, string];
        mounts.push({ type: 'file', content, target });
        break;
      }
      case '--proc':
        mounts.push({ type: 'proc', target: r.value(a) });
        break;
      case '--dev':
        mounts.push({ type: 'dev', target: r.value(a) });
        break;
      case '--workdir':
        opts.workDir = r.value(a);
        break;
      case '--root': {
        const v = r.value(a);
        if (v !== 'host' && v !== 'empty') throw new UsageError(`--root takes host or empty, not '${v}'`);
        opts.root = v;
        break;
      }
      case '--ro-root':
        opts.readOnlyRoot = true;
        break;
      case '--chroot':
        opts.rootSwitch = 'chroot';
        break;
      case '--chdir':
        opts.cwd = r.value(a);
        break;
      case '--env': {
        const kv = r.value(a);
        const eq = kv.indexOf('=');
        if (eq <= 0) throw new UsageError(`--env takes NAME=VALUE, not '${kv}'`);
        env[kv.slice(0, eq)] = kv.slice(eq + 1);
        break;
      }
      case '--inherit-env': {
        const next = r.peek();
        if (next && !next.startsWith('-')) {
          const cur = Array.isArray(opts.inheritEnv) ? opts.inheritEnv : [];
          opts.inheritEnv = [...cur, r.next()];
        } else opts.inheritEnv = true;
        break;
      }
      case '--map-self':
        opts.mapUser = 'self';
        break;
      case '--cap-add':
        opts.capabilities = [...(opts.capabilities ?? []), r.value(a)];
        break;
      case '--rlimit': {
        const kv = r.value(a);
        const [name, n] = kv.split('=');
        const value = n === 'unlimited' ? Infinity : Number(n);
        if (!name || Number.isNaN(value)) throw new UsageError(`--rlimit takes NAME=N, not '${kv}'`);
        opts.rlimits = { ...opts.rlimits, [name]: value };
        break;
      }
      case '--hostname':
        opts.hostname = r.value(a);
        break;
      case '--net': {
        const v = r.value(a);
        if (v !== 'none' && v !== 'host') throw new UsageError(`--net takes none or host, not '${v}'`);
        opts.network = v;
        break;
      }
      case '--pty':
        opts.pty = { cols: process.stdout.columns ?? 80, rows: process.stdout.rows ?? 24 };
        break;
      case '--seccomp': {
        const v = r.value(a);
        if (v !== 'default' && v !== 'none') throw new UsageError(`--seccomp takes default or none, not '${v}'`);
        if (typeof opts.seccomp === 'object') throw new UsageError('--seccomp cannot be combined with --seccomp-deny or --seccomp-allow');
        opts.seccomp = v;
        break;
      }
      case '--seccomp-deny':
      case '--seccomp-allow': {
        if (typeof opts.seccomp === 'string') throw new UsageError(`${a} cannot be combined with --seccomp ${opts.seccomp}`);
        const policy = (opts.seccomp ??= {}) as { deny?: string[]; allow?: string[] };
        const key = a === '--seccomp-deny' ? 'deny' : 'allow';
        policy[key] = [...(policy[key] ?? []), r.value(a)];
        break;
      }
      case '--nesting':
        opts.nesting = true;
        break;
      case '--timeout': {
        const s = Number(r.value(a));
        if (!(s > 0)) throw new UsageError('--timeout takes a positive number of seconds');
        opts.timeout = s * 1000;
        break;
      }
      default:
        if (a.startsWith('-')) throw new UsageError(`unknown option '${a}' (see minisandbox run --help)`);
        // bwrap allows the command without '--'.
        opts.argv = [a, ...r.rest()];
    }
  }
  if (opts.argv.length === 0) throw new UsageError('no command given (minisandbox run [OPTIONS] -- COMMAND)');
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

export async function runCommand(argv: string[]): Promise<number> {
  const opts = parseRunArgs(argv);
  if (opts === 'help') {
    process.stdout.write(RUN_HELP);
    return 0;
  }
  const proc = spawn(opts);
  // Ctrl-C and friends reach the sandbox through its PID 1.
  for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) process.on(sig, () => proc.kill(sig));
  if (opts.pty) await relayTerminal(proc);
  const exit = await proc.exited;
  if (proc.timedOut) process.stderr.write(`minisandbox: timed out after ${opts.timeout! / 1000}s, sandbox killed\n`);
  return exit.exitCode ?? signalExit(exit.signal ?? 'SIGKILL');
}
