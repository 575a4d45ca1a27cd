/**
 * The seccomp filter, attacked for real: each refused syscall is called
 * inside a sandbox and must fail with the filter's errno, while the same
 * call without the filter fails otherwise (or works), which shows that the
 * filter is what stops it. Keyrings get a full attack: a secret key in the
 * caller's session keyring, read and written from inside.
 */
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, Sandbox, run } from '../../lib/index.js';
import { native } from '../../lib/native/index.js';
import { compileSeccomp, seccompRules, DEFAULT_SECCOMP_RULES } from '../../lib/sandbox/seccomp.js';
import { doctor } from '../../lib/sandbox/doctor.js';
import { tempDir } from '../helpers.js';
import { ALLOWED_CALLS, REFUSED_CALLS, trySyscallsScript, type Call } from './syscalls.js';

async function trySyscalls(calls: Call[], opts: Parameters<typeof run>[0] extends infer O ? Partial<O> : never = {}): Promise<Record<string, string>> {
  const r = await run({ argv: ['python3', '-c', trySyscallsScript(calls)], ...opts });
  expect(r.stderr).toBe('');
  return JSON.parse(r.stdout) as Record<string, string>;
}

describe('the default filter', () => {
  it('is installed in every sandboxed process: run, exec, shells', async () => {
    const status = 'grep -E "^(Seccomp|NoNewPrivs):" /proc/self/status';
    const r = await run({ argv: ['sh', '-c', status] });
    expect(r.stdout).toMatch(/Seccomp:\s+2/);
    await using sb = await Sandbox.create();
    expect((await sb.exec(status)).stdout).toMatch(/Seccomp:\s+2/);
    const sh = await sb.shell();
    expect((await sh.run(status)).output).toMatch(/Seccomp:\s+2/);
    expect(sb.isolation.seccomp).toBe('default');
  });

  it('refuses each syscall of its list with EPERM (ENOSYS for clone3), which nothing else would', async () => {
    const filtered = await trySyscalls(REFUSED_CALLS);
    const unfiltered = await trySyscalls(REFUSED_CALLS, { seccomp: 'none' });
    for (const { label } of REFUSED_CALLS) {
      expect({ label, errno: filtered[label] }).toEqual({ label, errno: 'EPERM' });
    }
    // Without the filter these fail for another reason or work: the filter
    // is what refuses them, not a missing capability.
    for (const label of ['keyctl', 'add_key', 'userfaultfd', 'io_uring_setup', 'personality-no-aslr', 'unshare-user', 'clone-user', 'ioctl-tiocsti', 'ioctl-tiocsti-high', 'prctl-unsubreaper']) {
      expect({ label, errno: unfiltered[label] }).not.toEqual({ label, errno: 'EPERM' });
    }
    const clone3: Call = { label: 'clone3', syscall: 'clone3', args: [0, 0] };
    expect((await trySyscalls([clone3]))['clone3']).toBe('ENOSYS');
    expect((await trySyscalls([clone3], { seccomp: 'none' }))['clone3']).not.toBe('ENOSYS');
  });

  it('lets everything else through, including safe arguments of filtered syscalls', async () => {
    const r = await trySyscalls(ALLOWED_CALLS);
    expect(r).toEqual({
      'personality-query': 'ok',
      'personality-linux32': 'ok',
      'unshare-fs': 'ok',
      'clone-plain': 'ok',
      'ioctl-tcgets': 'ENOTTY',
      'prctl-subreaper-on': 'ok',
      'ptrace-other': 'ESRCH',
      getpid: 'ok',
    });
  });

  it('blocks unshare -U from the shell, and nesting lifts exactly that', async () => {
    const cmd = 'unshare -U -r id -u; echo rc=$?';
    expect((await run({ argv: ['sh', '-c', cmd] })).stdout).toMatch(/rc=1/);
    const nested = await run({ argv: ['sh', '-c', cmd], nesting: true });
    expect(nested.stdout).toBe('0\nrc=0\n');
    const r = await trySyscalls(REFUSED_CALLS, { nesting: true });
    expect(r['keyctl']).toBe('EPERM');
    expect(r['unshare-user']).toBe('ok');
  });

  it('refuses foreign architectures and the x32 ABI before looking at the syscall number', () => {
    const prog = compileSeccomp([]);
    const insn = (i: number) => ({ code: prog.readUInt16LE(i * 8), jt: prog[i * 8 + 2], jf: prog[i * 8 + 3], k: prog.readUInt32LE(i * 8 + 4) });
    // ld arch; jeq ARCH → skip; ret ERRNO(ENOSYS)
    expect(insn(0)).toEqual({ code: 0x20, jt: 0, jf: 0, k: 4 });
    expect(insn(1).code).toBe(0x15);
    expect(insn(1).k).toBe(process.arch === 'x64' ? 0xc000003e : 0xc00000b7);
    expect(insn(2)).toEqual({ code: 0x06, jt: 0, jf: 0, k: 0x00050000 | 38 });
    if (process.arch === 'x64') {
      expect(insn(4)).toEqual({ code: 0x35, jt: 0, jf: 1, k: 0x40000000 });
      expect(insn(5).k).toBe(0x00050000 | 38);
    }
  });

  it('x32 syscalls are refused (ENOSYS) where the kernel would run them', async () => {
    if (process.arch !== 'x64') return;
    const x32getpid: Call = { label: 'x32', syscall: 'getpid', args: [] };
    const script = trySyscallsScript([x32getpid]).replace('ctypes.c_long(nr)', 'ctypes.c_long(nr | 0x40000000)');
    const r = await run({ argv: ['python3', '-c', script] });
    expect(JSON.parse(r.stdout).x32).toBe('ENOSYS');
  });
});

describe('per sandbox', () => {
  it('extends the defaults with deny and relaxes them with allow', async () => {
    const calls: Call[] = [
      { label: 'keyctl', syscall: 'keyctl', args: [0, -3, 0] },
      { label: 'getppid', syscall: 'getppid', args: [] },
      { label: 'bpf', syscall: 'bpf', args: [-1, 0, 0] },
    ];
    const r = await trySyscalls(calls, { seccomp: { allow: ['keyctl'], deny: ['getppid'] } });
    expect(r['keyctl']).not.toBe('EPERM');
    expect(r['getppid']).toBe('EPERM');
    expect(r['bpf']).toBe('EPERM');
    await using sb = await Sandbox.create({ seccomp: { deny: ['mkdir', 'mkdirat'] } });
    const mk = await sb.exec('mkdir /tmp/x');
    expect(mk.stderr).toMatch(/Operation not permitted/);
    expect(sb.isolation.seccomp).toBe('custom');
  });

  it("'none' installs no filter", async () => {
    const r = await run({ argv: ['grep', 'Seccomp:', '/proc/self/status'], seccomp: 'none' });
    expect(r.stdout).toMatch(/Seccomp:\s+0/);
  });

  it('refuses bad policies by name before anything starts', async () => {
    const bad: [unknown, RegExp][] = [
      ['strict', /^seccomp: 'strict' must be 'default', 'none' or \{ deny, allow \}$/],
      [{ deny: ['no_such_call'] }, /^seccomp\.deny: unknown syscall 'no_such_call' on /],
      [{ allow: 'keyctl' }, /^seccomp\.allow: must be a list of syscall names$/],
      [{ deny: ['keyctl'], allow: ['keyctl'] }, /^seccomp: 'keyctl' is both denied and allowed$/],
      [{ kill: ['x'] }, /^seccomp\.kill: unknown option/],
    ];
    for (const [seccomp, message] of bad) {
      const err = await run({ argv: ['true'], seccomp: seccomp as never }).catch((e) => e);
      expect(err).toBeInstanceOf(ConfigError);
      expect((err as Error).message).toMatch(message);
    }
    const nnp = await run({ argv: ['true'], noNewPrivs: false }).catch((e) => e);
    expect(nnp).toBeInstanceOf(ConfigError);
    expect(nnp.message).toMatch(/^noNewPrivs: false needs seccomp: 'none' or the CAP_SYS_ADMIN capability/);
    expect((await run({ argv: ['true'], noNewPrivs: false, seccomp: 'none' })).exitCode).toBe(0);
  });

  it('every default rule names a reason and a syscall this machine knows, or one another architecture has', () => {
    for (const rule of DEFAULT_SECCOMP_RULES) {
      expect(rule.why.length).toBeGreaterThan(10);
      if (native.syscalls[rule.syscall] === undefined) expect(['vm86', 'vm86old', 'iopl', 'ioperm', 'create_module', 'query_module', 'get_kernel_syms', 'uselib', 'ustat', 'sysfs', '_sysctl', 'nfsservctl', 'lookup_dcookie']).toContain(rule.syscall);
    }
    expect(seccompRules('none')).toEqual([]);
  });

  it('doctor reports the filter', async () => {
    const checks = await doctor();
    const check = checks.find((c) => c.name === 'seccomp');
    expect(check).toMatchObject({ ok: true });
    expect(check!.detail).toMatch(/keyctl.*refused/);
  });
});

describe('kernel keyrings (not namespaced)', () => {
  // A secret key in a session keyring, as a login session or a service has;
  // the sandbox is started from a process holding that keyring.
  let dir: ReturnType<typeof tempDir>;
  beforeAll(() => {
    dir = tempDir('msbx-keys-');
  });
  afterAll(() => dir.remove());

  const keyctl = native.syscalls['keyctl']!;
  const addKey = native.syscalls['add_key']!;

  it('cannot read, list or add keys of the caller, whatever their serial', () => {
    const indexJs = join(process.cwd(), 'dist/lib/index.js');
    const script = join(dir.path, 'attack.mjs');
    writeFileSync(
      script,
      `
import { run } from ${JSON.stringify(indexJs)};
const [serial, seccomp] = [process.argv[2], process.argv[3]];
const attack = \`
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(256)
# KEYCTL_READ (11) of the secret, by its serial and through the session keyring (-3)
n = libc.syscall(${keyctl}, 11, ${'${serial}'}, buf, 256)
print('read', buf.raw[:n].decode() if n > 0 else 'errno %d' % ctypes.get_errno())
n = libc.syscall(${keyctl}, 11, -3, buf, 256)
print('list', 'ok' if n >= 0 else 'errno %d' % ctypes.get_errno())
k = libc.syscall(${addKey}, b'user', b'planted', b'x', 1, -3)
print('add', 'ok' if k >= 0 else 'errno %d' % ctypes.get_errno())
\`;
const r = await run({ argv: ['python3', '-c', attack], seccomp });
process.stdout.write(r.stdout + r.stderr);
`,
    );
    // The caller: joins a fresh session keyring, puts a secret in it, then
    // becomes Node, which starts the sandbox.
    const launcher = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
assert libc.syscall(${keyctl}, 1, b'msbx-test') > 0  # KEYCTL_JOIN_SESSION_KEYRING
serial = libc.syscall(${addKey}, b'user', b'secret', b'TOPSECRET-KEY', 13, -3)
assert serial > 0, ctypes.get_errno()
os.execvp('node', ['node', sys.argv[1], str(serial), sys.argv[2]])
`;
    const attack = (seccomp: string) => spawnSync('python3', ['-c', launcher, script, seccomp], { encoding: 'utf8', timeout: 20_000 });
    const open = attack('none');
    // The attack is real: without the filter the key is read and a key planted.
    expect(open.stdout).toMatch(/^read TOPSECRET-KEY$/m);
    expect(open.stdout).toMatch(/^add ok$/m);
    const blocked = attack('default');
    expect(blocked.stdout).toBe('read errno 1\nlist errno 1\nadd errno 1\n');
  });
});
