/**
 * The seccomp filter every sandboxed process runs under: which syscalls are
 * refused and why (the policy, modelled on Docker's default profile and the
 * OCI defaults), and the small compiler that turns it into a classic BPF
 * program for the addon to install right before execve.
 *
 * A denylist, not an allowlist: the sandbox already holds no capability, so
 * what is refused here is kernel attack surface that a capless process can
 * still reach (keyrings, bpf, io_uring, userfaultfd...) and the ways out of
 * the sandbox's own namespaces. Refusals return an errno (EPERM, or ENOSYS
 * where a caller falls back on it), never a kill, so that tools degrade
 * gracefully. Why a generated program rather than libseccomp:
 * docs/architecture.md.
 */
import { native } from '../native/index.js';
import { ConfigError } from './errors.js';

export type SeccompOption = 'default' | 'none' | SeccompPolicy;

export interface SeccompPolicy {
  /** Syscalls refused with EPERM on top of the defaults ('ptrace', 'mount'...). */
  deny?: string[];
  /**
   * Syscalls the defaults refuse that this sandbox may use: the whole rule
   * for that syscall goes, argument checks included ('keyctl', 'io_uring_setup',
   * 'personality', 'unshare'...).
   */
  allow?: string[];
}

const EPERM = 1;
const ENOSYS = 38;

/** When a rule refuses: always, or when every argument test matches. */
export interface ArgTest {
  /** Argument index, 0-5. */
  arg: number;
  /** Refuse when the low 32 bits have any of these bits set. */
  anyBits?: number;
  /** Refuse when the low 32 bits equal one of these. */
  oneOf?: number[];
  /** Refuse when the low 32 bits equal none of these. */
  noneOf?: number[];
  /** Refuse only when the whole 64-bit argument is zero. */
  zero?: boolean;
}

export interface SeccompRule {
  syscall: string;
  errno: number;
  /** Empty: always refused. */
  when: ArgTest[];
  why: string;
}

const CLONE_NEWCGROUP = 0x02000000;
const CLONE_NEWUSER = 0x10000000;
const TIOCSTI = 0x5412;
const TIOCLINUX = 0x541c;
const PR_SET_CHILD_SUBREAPER = 36;
/** personality() values Docker allows: Linux, 32-bit, UNAME26 and the query. */
const SAFE_PERSONALITIES = [0x0, 0x8, 0x20000, 0x20008, 0xffffffff];

function deny(syscalls: string[], why: string, errno = EPERM): SeccompRule[] {
  return syscalls.map((syscall) => ({ syscall, errno, when: [], why }));
}

/** The rules that nesting (new user namespaces inside) lifts. */
const NAMESPACE_RULES: SeccompRule[] = [
  ...['clone', 'unshare'].map((syscall) => ({
    syscall,
    errno: EPERM,
    when: [{ arg: 0, anyBits: CLONE_NEWUSER | CLONE_NEWCGROUP }],
    why: 'a new user namespace gives back every capability, and with it the kernel code they guard (mount, cgroup hierarchies, netfilter...)',
  })),
  // Its flags are in memory the filter cannot read. ENOSYS makes glibc fall
  // back to clone(), whose flags it can (Docker does the same).
  ...deny(['clone3'], 'its flags cannot be checked; callers fall back on clone', ENOSYS),
];

/**
 * The default rules. Syscalls an architecture does not have are skipped
 * (vm86 exists only on i386, iopl only on x86...).
 */
export const DEFAULT_SECCOMP_RULES: readonly SeccompRule[] = [
  ...deny(['keyctl', 'add_key', 'request_key'], 'kernel keyrings are not namespaced: the caller\'s keys and the host\'s keyrings would be readable and writable'),
  ...deny(['bpf'], 'eBPF programs and maps: a large kernel attack surface'),
  ...deny(['perf_event_open'], 'performance counters can observe other processes and the kernel'),
  ...deny(['userfaultfd'], 'used to win kernel races in many exploits'),
  ...deny(['kexec_load', 'kexec_file_load', 'reboot'], 'replace or restart the kernel'),
  ...deny(['init_module', 'finit_module', 'delete_module', 'create_module', 'query_module', 'get_kernel_syms'], 'kernel modules'),
  ...deny(['open_by_handle_at', 'name_to_handle_at'], 'file handles open files by inode, past any mount or root (the "shocker" escape)'),
  ...deny(['io_uring_setup', 'io_uring_enter', 'io_uring_register'], 'io_uring bypasses syscall filtering and has a long CVE history; callers fall back to ordinary I/O'),
  ...deny(['acct', 'swapon', 'swapoff', 'syslog', 'quotactl', 'quotactl_fd', 'lookup_dcookie', 'nfsservctl', 'uselib', 'ustat', 'sysfs', '_sysctl', 'vm86', 'vm86old', 'iopl', 'ioperm'], 'host administration and obsolete interfaces no sandboxed program needs'),
  {
    syscall: 'personality',
    errno: EPERM,
    when: [{ arg: 0, noneOf: SAFE_PERSONALITIES }],
    why: 'flags such as ADDR_NO_RANDOMIZE and READ_IMPLIES_EXEC weaken ASLR and W^X',
  },
  {
    syscall: 'ioctl',
    errno: EPERM,
    // The kernel reads the command as 32 bits: testing the low half is exact
    // (CVE-2019-10063 was a test of all 64).
    when: [{ arg: 1, oneOf: [TIOCSTI, TIOCLINUX] }],
    why: 'TIOCSTI and TIOCLINUX type into a terminal (CVE-2017-5226)',
  },
  {
    syscall: 'prctl',
    errno: EPERM,
    when: [{ arg: 0, oneOf: [PR_SET_CHILD_SUBREAPER] }, { arg: 1, zero: true }],
    why: 'an exec\'d command is a child subreaper so that a timeout finds every descendant; it may not give that up',
  },
  ...['ptrace', 'process_vm_readv', 'process_vm_writev'].map((syscall) => ({
    syscall,
    errno: EPERM,
    when: [{ arg: syscall === 'ptrace' ? 1 : 0, oneOf: [1] }],
    why: 'PID 1 is the sandbox\'s own init, a copy of the host process: never traced or read, even with CAP_SYS_PTRACE',
  })),
  ...NAMESPACE_RULES,
];

/** AUDIT_ARCH_* of the architecture Node runs on (x86_64, aarch64). */
function auditArch(): number {
  if (process.arch === 'x64') return 0xc000003e;
  if (process.arch === 'arm64') return 0xc00000b7;
  throw new ConfigError(`seccomp: no filter for the ${process.arch} architecture (x64 and arm64 are supported); use seccomp: 'none'`, 'seccomp');
}

/** The rules a policy makes, after the defaults are extended or relaxed. */
export function seccompRules(option: SeccompOption, opts: { nesting?: boolean } = {}): SeccompRule[] {
  if (option === 'none') return [];
  let rules = [...DEFAULT_SECCOMP_RULES];
  if (opts.nesting) rules = rules.filter((r) => !NAMESPACE_RULES.includes(r));
  if (option === 'default' || option === undefined) return rules;
  if (typeof option !== 'object' || option === null) {
    throw new ConfigError(`seccomp: '${String(option)}' must be 'default', 'none' or { deny, allow }`, 'seccomp');
  }
  for (const key of Object.keys(option)) {
    if (key !== 'deny' && key !== 'allow') throw new ConfigError(`seccomp.${key}: unknown option (deny, allow)`, `seccomp.${key}`);
  }
  const names = (key: 'deny' | 'allow'): string[] => {
    const list = option[key] ?? [];
    if (!Array.isArray(list)) throw new ConfigError(`seccomp.${key}: must be a list of syscall names`, `seccomp.${key}`);
    for (const name of list) {
      if (typeof name !== 'string' || native.syscalls[name] === undefined) {
        throw new ConfigError(`seccomp.${key}: unknown syscall '${String(name)}' on ${process.arch}`, `seccomp.${key}`);
      }
    }
    return list;
  };
  const denied = names('deny');
  const allowed = new Set(names('allow'));
  for (const name of denied) {
    if (allowed.has(name)) throw new ConfigError(`seccomp: '${name}' is both denied and allowed`, 'seccomp');
  }
  const extra = new Set(denied);
  rules = rules.filter((r) => !allowed.has(r.syscall) && !extra.has(r.syscall));
  return [...rules, ...deny([...extra], 'denied by this sandbox\'s seccomp.deny')];
}

// Classic BPF, as seccomp takes it (linux/filter.h, linux/seccomp.h).
const LD_W_ABS = 0x20;
const JMP_JEQ_K = 0x15;
const JMP_JGE_K = 0x35;
const JMP_JSET_K = 0x45;
const JMP_JA = 0x05;
const RET_K = 0x06;
const SECCOMP_RET_ALLOW = 0x7fff0000;
const SECCOMP_RET_ERRNO = 0x00050000;
/** struct seccomp_data: nr, arch, instruction_pointer, args[6]. */
const DATA_NR = 0;
const DATA_ARCH = 4;
const argLow = (i: number) => 16 + 8 * i;
const argHigh = (i: number) => 20 + 8 * i;
const X32_SYSCALL_BIT = 0x40000000;

interface Insn {
  code: number;
  jt: number;
  jf: number;
  k: number;
}

const stmt = (code: number, k: number): Insn => ({ code, jt: 0, jf: 0, k });
const jump = (code: number, k: number, jt: number, jf: number): Insn => ({ code, jt, jf, k });
const ret = (k: number): Insn => stmt(RET_K, k >>> 0);

/**
 * One rule's code: every test in turn, each jumping to the rule's end
 * (`fail` instructions away, counted from the test) when it does not match;
 * the last instruction refuses. Returns the instructions; `next` is where a
 * failing test lands, right after the rule.
 */
function ruleCode(rule: SeccompRule): Insn[] {
  // Built back to front, so each jump knows how far the rule's end is.
  const out: Insn[] = [ret(SECCOMP_RET_ERRNO | rule.errno)];
  for (const t of [...rule.when].reverse()) {
    const toEnd = () => out.length; // instructions between the next test and the rule's end
    const block: Insn[] = [];
    if (t.zero) {
      // Both halves zero: a non-zero half skips to the end.
      block.push(stmt(LD_W_ABS, argLow(t.arg)));
      block.push(jump(JMP_JEQ_K, 0, 0, 0)); // patched below
      block.push(stmt(LD_W_ABS, argHigh(t.arg)));
      block.push(jump(JMP_JEQ_K, 0, 0, toEnd()));
      block[1]!.jf = 2 + toEnd();
    } else if (t.anyBits !== undefined) {
      block.push(stmt(LD_W_ABS, argLow(t.arg)));
      block.push(jump(JMP_JSET_K, t.anyBits >>> 0, 0, toEnd()));
    } else if (t.oneOf !== undefined) {
      // jeq v1 → match, jeq v2 → match, ..., else skip to the end.
      block.push(stmt(LD_W_ABS, argLow(t.arg)));
      const n = t.oneOf.length;
      t.oneOf.forEach((v, i) => block.push(jump(JMP_JEQ_K, v >>> 0, n - 1 - i, i === n - 1 ? toEnd() : 0)));
    } else if (t.noneOf !== undefined) {
      // jeq v → skip to the end (allowed value); none matched → refuse.
      block.push(stmt(LD_W_ABS, argLow(t.arg)));
      const n = t.noneOf.length;
      t.noneOf.forEach((v, i) => block.push(jump(JMP_JEQ_K, v >>> 0, n - 1 - i + toEnd(), 0)));
    } else {
      throw new Error(`seccomp rule for ${rule.syscall}: an argument test needs anyBits, oneOf, noneOf or zero`);
    }
    out.unshift(...block);
  }
  return out;
}

/**
 * Finds the syscall's handler by binary search: a few comparisons on any
 * path, where a list would take one per rule. The kernel runs the filter
 * for every syscall number when it is installed, to learn which are always
 * allowed (those then skip it entirely): on a list of ~50 rules that alone
 * cost ~100 µs per process here, on this tree a fraction.
 */
function dispatch(entries: [number, Insn[]][]): Insn[] {
  if (entries.length <= 3) {
    const out: Insn[] = [];
    for (const [nr, handler] of entries) out.push(jump(JMP_JEQ_K, nr, 0, handler.length), ...handler);
    out.push(ret(SECCOMP_RET_ALLOW));
    return out;
  }
  const mid = entries.length >> 1;
  const left = dispatch(entries.slice(0, mid));
  const right = dispatch(entries.slice(mid));
  // nr >= the right half's first: over the left half (a long jump: ja).
  return [jump(JMP_JGE_K, entries[mid]![0], 0, 1), stmt(JMP_JA, left.length), ...left, ...right];
}

/** Compiles rules into the program the addon installs (struct sock_filter[]). */
export function compileSeccomp(rules: readonly SeccompRule[]): Buffer {
  const arch = auditArch();
  // Rules grouped by syscall number; names this architecture lacks go.
  const bySyscall = new Map<number, SeccompRule[]>();
  for (const rule of rules) {
    const nr = native.syscalls[rule.syscall];
    if (nr === undefined) continue;
    const list = bySyscall.get(nr) ?? [];
    // A rule without tests refuses always: later rules could not matter.
    if (!list.some((r) => r.when.length === 0)) list.push(rule);
    bySyscall.set(nr, rule.when.length === 0 ? [rule] : list);
  }
  const prog: Insn[] = [
    // Another architecture (i386 through int 0x80, arm32) numbers syscalls
    // differently: refused whole, as is the x32 ABI.
    stmt(LD_W_ABS, DATA_ARCH),
    jump(JMP_JEQ_K, arch, 1, 0),
    ret(SECCOMP_RET_ERRNO | ENOSYS),
    stmt(LD_W_ABS, DATA_NR),
  ];
  if (process.arch === 'x64') prog.push(jump(JMP_JGE_K, X32_SYSCALL_BIT, 0, 1), ret(SECCOMP_RET_ERRNO | ENOSYS));
  // The handler of a syscall sits right after its comparison and always
  // returns, so every conditional jump is short (8-bit offsets) and A can be
  // reused for arguments.
  const entries = [...bySyscall].sort((a, b) => a[0] - b[0]).map(([nr, list]): [number, Insn[]] => {
    const handler: Insn[] = [];
    for (const rule of list) handler.push(...ruleCode(rule));
    if (list.some((r) => r.when.length > 0)) handler.push(ret(SECCOMP_RET_ALLOW));
    if (handler.length > 255) throw new Error(`seccomp: the rules for syscall ${nr} are too long`);
    return [nr, handler];
  });
  prog.push(...dispatch(entries));
  if (prog.length > 4096) throw new ConfigError(`seccomp: the filter has ${prog.length} instructions, more than the kernel's 4096`, 'seccomp');
  const buf = Buffer.alloc(prog.length * 8);
  prog.forEach((insn, i) => {
    buf.writeUInt16LE(insn.code, i * 8);
    buf.writeUInt8(insn.jt, i * 8 + 2);
    buf.writeUInt8(insn.jf, i * 8 + 3);
    buf.writeUInt32LE(insn.k >>> 0, i * 8 + 4);
  });
  return buf;
}

const compiled = new Map<string, Buffer | undefined>();

/** The program for a sandbox's seccomp option (undefined for 'none'), compiled once per policy. */
export function seccompProgram(option: SeccompOption | undefined, opts: { nesting?: boolean } = {}): Buffer | undefined {
  const key = JSON.stringify([option ?? 'default', !!opts.nesting]);
  if (!compiled.has(key)) {
    compiled.set(key, option === 'none' ? undefined : compileSeccomp(seccompRules(option ?? 'default', opts)));
  }
  return compiled.get(key);
}
