/**
 * Calls raw syscalls inside a sandbox and reports each one's errno, as
 * bubblewrap's try-syscall does: arguments are chosen so that a call the
 * filter lets through fails harmlessly (EFAULT, EBADF, EINVAL...) or does
 * nothing lasting, and a call the filter refuses shows the filter's errno.
 */
import { native } from '../../lib/native/index.js';

/** A syscall by name with integer arguments (pointers are 0 = NULL). */
export interface Call {
  label: string;
  syscall: string;
  args: number[];
}

/** Each call runs in a forked child, so one that succeeds (unshare, clone) changes nothing else. */
export function trySyscallsScript(calls: Call[]): string {
  const table = calls.map((c) => [c.label, native.syscalls[c.syscall], c.args]);
  return `
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
out = {}
for label, nr, args in ${JSON.stringify(table)}:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        ctypes.set_errno(0)
        res = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        e = ctypes.get_errno()
        if res == 0 and label.startswith('clone'):
            os._exit(0)  # the new child of a clone that was let through
        os.write(w, ('ok' if res >= 0 else errno.errorcode.get(e, str(e))).encode())
        os._exit(0)
    os.close(w)
    out[label] = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
print(json.dumps(out))
`;
}

const CLONE_NEWUSER = 0x10000000;
const CLONE_NEWCGROUP = 0x02000000;
const SIGCHLD = 17;

/**
 * The calls the default filter refuses, each with an argument set that
 * fails in some other way (or succeeds harmlessly) when nothing filters it.
 */
export const REFUSED_CALLS: Call[] = [
  // KEYCTL_GET_KEYRING_ID of the session keyring: works for anyone unfiltered.
  { label: 'keyctl', syscall: 'keyctl', args: [0, -3, 0] },
  { label: 'add_key', syscall: 'add_key', args: [0, 0, 0, 0, -3] },
  { label: 'request_key', syscall: 'request_key', args: [0, 0, 0, 0] },
  { label: 'bpf', syscall: 'bpf', args: [-1, 0, 0] },
  { label: 'perf_event_open', syscall: 'perf_event_open', args: [0, 0, -1, -1, 0] },
  // UFFD_USER_MODE_ONLY: allowed to unprivileged users unfiltered.
  { label: 'userfaultfd', syscall: 'userfaultfd', args: [1] },
  { label: 'io_uring_setup', syscall: 'io_uring_setup', args: [1, 0] },
  { label: 'open_by_handle_at', syscall: 'open_by_handle_at', args: [-1, 0, 0] },
  { label: 'init_module', syscall: 'init_module', args: [0, 0, 0] },
  { label: 'finit_module', syscall: 'finit_module', args: [-1, 0, 0] },
  { label: 'delete_module', syscall: 'delete_module', args: [0, 0] },
  { label: 'kexec_load', syscall: 'kexec_load', args: [0, 0, 0, 0] },
  // ADDR_NO_RANDOMIZE
  { label: 'personality-no-aslr', syscall: 'personality', args: [0x0040000] },
  { label: 'unshare-user', syscall: 'unshare', args: [CLONE_NEWUSER] },
  { label: 'unshare-cgroup', syscall: 'unshare', args: [CLONE_NEWCGROUP] },
  { label: 'clone-user', syscall: 'clone', args: [CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0] },
  // TIOCSTI on stdin
  { label: 'ioctl-tiocsti', syscall: 'ioctl', args: [0, 0x5412, 0] },
  // TIOCSTI with garbage in the upper half of the command (CVE-2019-10063)
  { label: 'ioctl-tiocsti-high', syscall: 'ioctl', args: [0, 0x1_0000_5412, 0] },
  { label: 'ptrace-pid1', syscall: 'ptrace', args: [16 /* PTRACE_ATTACH */, 1, 0, 0] },
  { label: 'process_vm_readv-pid1', syscall: 'process_vm_readv', args: [1, 0, 0, 0, 0, 0] },
  // PR_SET_CHILD_SUBREAPER, 0
  { label: 'prctl-unsubreaper', syscall: 'prctl', args: [36, 0, 0, 0, 0] },
];

/** Calls the default filter lets through, for contrast. */
export const ALLOWED_CALLS: Call[] = [
  { label: 'personality-query', syscall: 'personality', args: [0xffffffff] },
  { label: 'personality-linux32', syscall: 'personality', args: [0x0008] },
  { label: 'unshare-fs', syscall: 'unshare', args: [0x200 /* CLONE_FS */] },
  { label: 'clone-plain', syscall: 'clone', args: [SIGCHLD, 0, 0, 0, 0] },
  { label: 'ioctl-tcgets', syscall: 'ioctl', args: [0, 0x5401, 0] },
  { label: 'prctl-subreaper-on', syscall: 'prctl', args: [36, 1, 0, 0, 0] },
  // ESRCH: no such process (the filter refuses only pid 1)
  { label: 'ptrace-other', syscall: 'ptrace', args: [16, 99999, 0, 0] },
  { label: 'getpid', syscall: 'getpid', args: [] },
];
