// The child side of a spawn: what runs between clone() and execve().
//
// Everything here runs in a clone of Node, a multithreaded process: other
// threads may have held malloc or stdio locks at the moment of the clone, so
// the child calls only raw, async-signal-safe syscalls on memory prepared by
// the parent (see plan.h). No allocation, no exceptions, no C++ library
// calls that might allocate. Every failure is reported to the parent as an
// ErrorRecord naming the step, the errno and the plan op.
//
// This file holds the two sequences, RunChild (a new sandbox) and RunEnter
// (a command in a running one); the steps live along the setup order in
// child_mounts.cc (the new root), child_exec.cc (the process) and
// child_init.cc (PID 1 and the monitor).
//
// The order follows bubblewrap's: propagation first, then a base tmpfs that
// becomes the root so the host root can be kept at /oldroot while the new
// root is assembled, then the mount plan, then the old root is detached and
// the new root pivoted in, then the process itself is set up.

#include "child.h"

#include <fcntl.h>
#include <net/if.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "child_internal.h"

namespace msbx {

const char* const kStepNames[static_cast<size_t>(Step::Count)] = {
#define MSBX_STEP_NAME(id, name) name,
    MSBX_CHILD_STEPS(MSBX_STEP_NAME)
#undef MSBX_STEP_NAME
};

namespace child {

void Report(Step step, int err, int op, const char* detail, size_t detail_len) {
  ErrorRecord rec;
  memset(&rec, 0, sizeof rec);
  rec.step = static_cast<int32_t>(step);
  rec.err = err;
  rec.op = op;
  if (detail_len > sizeof rec.detail) detail_len = sizeof rec.detail;
  if (detail) memcpy(rec.detail, detail, detail_len);
  rec.detail_len = static_cast<int32_t>(detail_len);
  ssize_t unused = write(g_err_fd, &rec, sizeof rec);
  (void)unused;
}

[[noreturn]] void Fail(Step step, int op, int err) {
  Report(step, err, op, nullptr, 0);
  _exit(127);
}

namespace {

// Bit sig-1 set: the clone resets that signal's disposition (see
// RecordChangedSignals). Signals 1..64.
uint64_t g_signals_to_reset = ~0ull;

// First steps of every child: forget the parent's signal handlers, die with
// the parent, wait until the parent has finished its side (id maps), and
// tell it we run (see WaitUntilStarted and HandOffSandbox in spawn.cc).
void StartChild(const Plan& plan, const ChildFds& fds) {
  g_err_fd = fds.err_write;
  // Handlers copied by clone() would run the parent's code here (Node's
  // write into libuv's pipes shared with the parent), and an ignored signal
  // would stay ignored across execve().
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < 65; sig++) {
    if (sig == SIGKILL || sig == SIGSTOP || !(g_signals_to_reset & (1ull << (sig - 1)))) continue;
    sigaction(sig, &dfl, nullptr);
  }
  if (plan.die_with_parent && prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) Fail(Step::DeathSignal);

  // A pooled child (spawner.cc) has no sync pipe: its request released it.
  if (fds.sync_read >= 0) {
    close(fds.sync_write);
    char go = 0;
    ssize_t got;
    do got = read(fds.sync_read, &go, 1); while (got < 0 && errno == EINTR);
    if (got != 1) _exit(127);  // the parent gave up (or died) before releasing us
    close(fds.sync_read);
  }
  char started = 1;
  ssize_t unused = write(fds.started_write, &started, 1);
  (void)unused;  // the parent reads EOF as well once this end is closed
  close(fds.started_write);
}

// Takes the sandbox's own root ids (plan.init_ids), once the maps are
// written (and, for enter, once inside the user namespace).
void TakeInitIds(const Plan& plan, const ChildFds& fds) {
  if (!plan.init_ids) return;
  SetIds(plan.init_uid, plan.init_gid, false, Step::InitIds, Step::InitIds);
  if (plan.die_with_parent) DieWithParent(fds.owner_pidfd);
}

// A new network namespace has only lo, and it starts down: without it
// nothing in the sandbox could reach localhost.
void BringUpLoopback() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) Fail(Step::Loopback);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, "lo", 3);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) Fail(Step::Loopback);
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) Fail(Step::Loopback);
  close(s);
}

}  // namespace
}  // namespace child

using namespace child;

void RecordChangedSignals() {
  uint64_t changed = 0;
  for (int sig = 1; sig < 65; sig++) {
    struct sigaction now;
    // A signal the C library reserves for itself fails with EINVAL: reset
    // it anyway, as before.
    if (sigaction(sig, nullptr, &now) < 0 || now.sa_handler != SIG_DFL) changed |= 1ull << (sig - 1);
  }
  g_signals_to_reset = changed;
}

[[noreturn]] void RunEnter(const Plan& plan, const ChildFds& fds, int target_pidfd) {
  StartChild(plan, fds);
  // The host's /proc, opened before we leave the host's mount namespace:
  // the monitor finds the command's descendants there, by the pids it
  // signals them with.
  int procfd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (procfd < 0) Fail(Step::Monitor);
  // One call joins every namespace of the sandbox's PID 1, the user
  // namespace first; the mount namespace brings its root and cwd. Joining a
  // PID namespace changes only where our children are born: the monitor
  // itself stays outside it, with no pid the sandbox could name to signal,
  // stop or trace it.
  if (setns(target_pidfd, static_cast<int>(NamespaceCloneFlags(plan.namespaces))) < 0) Fail(Step::Setns);
  TakeInitIds(plan, fds);
  prctl(PR_SET_NAME, "msbx-exec", 0, 0, 0);
  if (plan.pty) OpenSandboxPty(plan, fds.pty_socket);
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  // CLONE_VM|CLONE_VFORK: the command shares this copy of the address
  // space until it execs, so no second copy of Node's page tables is made.
  pid_t main_pid = StartMain(plan, fds, true);
  if (main_pid < 0) Fail(Step::Monitor);
  int keep[3] = {fds.status_write, fds.control_read, procfd};
  CloseAllExcept(keep, 3);
  RunMonitor(main_pid, fds.status_write, fds.control_read, procfd);
}

[[noreturn]] void RunChild(const Plan& plan, const ChildFds& fds) {
  StartChild(plan, fds);
  TakeInitIds(plan, fds);
  WipeHostArgs();
  // Nothing of this copy of Node (its memory, fds, executable) may be read
  // from inside, even by a process granted CAP_SYS_PTRACE there: a
  // non-dumpable process is open only to holders of CAP_SYS_PTRACE in the
  // namespace its memory was made in, the host's. The monitors of `enter`
  // must pass the same check to join the sandbox, so only a root caller's
  // sandbox (init_ids) can afford it; without it the sandbox's processes,
  // holding no capability, still cannot trace or read PID 1, which holds all.
  if (plan.init_ids) prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);

  if ((plan.namespaces & NS_UTS) && !plan.hostname.empty() &&
      sethostname(plan.hostname.c_str(), plan.hostname.size()) < 0)
    Fail(Step::Hostname);
  if (plan.namespaces & NS_NET) BringUpLoopback();
  SetUpFilesystem(plan);
  if (plan.pty) OpenSandboxPty(plan, fds.pty_socket);

  if (plan.hold) {
    CloseAllExcept(fds.status_write);
    RunInit(-1, fds.status_write);
  }
  if (plan.namespaces & NS_PID) {
    // Signals stay blocked across the fork so init cannot miss the main
    // process's SIGCHLD; the main process unblocks them before exec.
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    pid_t main_pid = StartMain(plan, fds, false);
    if (main_pid < 0) Fail(Step::ForkInit);
    {
      // Init keeps only the status pipe: the error pipe must reach EOF at the
      // parent as soon as the main process has exec'd.
      CloseAllExcept(fds.status_write);
      RunInit(main_pid, fds.status_write);
    }
  }
  ExecMain(plan, fds);
}

}  // namespace msbx
