// The child's process: fds, rlimits, ids, capabilities, the seccomp filter,
// a terminal, then execve() (ExecMain); and StartMain, which starts that
// process from PID 1 or a monitor.

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <termios.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "child_internal.h"
#include "sys.h"

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

namespace msbx::child {
namespace {

// Where the child keeps its own fds while it rewires 0..N: far above any
// target the plan may ask for (the TypeScript side caps targets below 256).
constexpr int kHighFd = 512;

// The terminal's slave side once allocated (plan.pty), for kPtySlave.
int g_pty_slave = -1;

// Moves every fd the plan maps (and the error pipe) above kHighFd, then
// dup2()s them into place and closes everything else: no host fd survives.
void WireFds(const Plan& plan) {
  int high[64];
  size_t n = plan.fds.size();
  if (n > 64) {
    errno = EMFILE;
    Fail(Step::Fds);
  }
  int err_high = fcntl(g_err_fd, F_DUPFD_CLOEXEC, kHighFd);
  if (err_high < 0) Fail(Step::Fds);
  g_err_fd = err_high;
  for (size_t i = 0; i < n; i++) {
    int src = plan.fds[i].source == kPtySlave ? g_pty_slave : plan.fds[i].source;
    high[i] = fcntl(src, F_DUPFD_CLOEXEC, kHighFd);
    if (high[i] < 0) Fail(Step::Fds);
  }
  for (size_t i = 0; i < n; i++) {
    if (dup2(high[i], plan.fds[i].target) < 0) Fail(Step::Fds);
  }
  // Keep the targets (sorted, all below kHighFd) and the error pipe (above).
  int keep[65];
  for (size_t i = 0; i < n; i++) keep[i] = plan.fds[i].target;
  keep[n] = g_err_fd;
  CloseAllExcept(keep, n + 1);
}

// Dropping from the bounding set takes CAP_SETPCAP in the effective set,
// which a switch to a non-root uid clears: done before the ids change.
void DropBoundingSet(uint64_t keep) {
  for (int cap = 0; cap <= 63; cap++) {
    if (keep & (1ull << cap)) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      Fail(Step::Capabilities);
    }
  }
}

void DropCapabilities(uint64_t keep) {
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) Fail(Step::Capabilities);
  struct __user_cap_header_struct hdr;
  struct __user_cap_data_struct data[2];
  memset(&hdr, 0, sizeof hdr);
  memset(data, 0, sizeof data);
  hdr.version = _LINUX_CAPABILITY_VERSION_3;
  for (int i = 0; i < 2; i++) {
    uint32_t bits = static_cast<uint32_t>(keep >> (32 * i));
    data[i].effective = data[i].permitted = data[i].inheritable = bits;
  }
  if (syscall(SYS_capset, &hdr, data) < 0) Fail(Step::Capabilities);
  // Ambient capabilities carry the kept set across execve() for a non-root
  // uid, which would otherwise lose everything.
  for (int cap = 0; cap <= 63; cap++) {
    if ((keep & (1ull << cap)) && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0)
      Fail(Step::Capabilities);
  }
}

// Joins the sandbox's cgroups (fds the parent opened) before anything of
// the user's runs; "0" is the writing process itself.
void JoinCgroups(const Plan& plan) {
  for (int fd : plan.cgroup_fds) {
    if (write(fd, "0", 1) != 1) Fail(Step::CgroupJoin);
  }
}

void InstallSeccomp(const Plan& plan) {
  struct sock_fprog prog;
  prog.len = static_cast<unsigned short>(plan.seccomp.size() / sizeof(struct sock_filter));
  prog.filter = reinterpret_cast<struct sock_filter*>(const_cast<char*>(plan.seccomp.data()));
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0) Fail(Step::Seccomp);
}

// What the main process runs, passed through clone(): it shares our memory,
// and we stay suspended (CLONE_VFORK) until it has exec'd or failed.
struct MainArgs {
  const Plan* plan;
  const ChildFds* fds;
  bool subreaper;
};

int MainEntry(void* arg) {
  const MainArgs& a = *static_cast<const MainArgs*>(arg);
  // An exec'd command keeps its daemonized descendants (see KillTree).
  if (a.subreaper && prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) Fail(Step::Monitor);
  ExecMain(*a.plan, *a.fds);
}

}  // namespace

// Closes every fd but the `n` in `keep` (sorted here, in place). The fds
// kept stay where they are: with many fds open in Node, no "high" region is
// known to be free.
void CloseAllExcept(int* keep, size_t n) {
  for (size_t i = 1; i < n; i++)
    for (size_t j = i; j > 0 && keep[j] < keep[j - 1]; j--) {
      int t = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  unsigned lo = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned fd = static_cast<unsigned>(keep[i]);
    if (fd > lo) sys::close_range(lo, fd - 1, 0);
    lo = fd + 1;
  }
  sys::close_range(lo, ~0u, 0);
}

void CloseAllExcept(int a) { CloseAllExcept(&a, 1); }

// Credential changes clear the parent-death signal, so it is (re)armed
// after them. Node may have died just before: its pidfd (when still open
// here) then reads as exited, and we go too.
void DieWithParent(int owner_pidfd) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) Fail(Step::DeathSignal);
  if (owner_pidfd < 0) return;
  struct pollfd p = {owner_pidfd, POLLIN, 0};
  if (poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) _exit(127);
}

void SetIds(uint32_t uid, uint32_t gid, bool keep_caps, Step gid_step, Step uid_step) {
  // setgroups is denied in unprivileged user namespaces; then the
  // supplementary groups are already empty of anything mapped.
  if (sys::setgroups_none() < 0 && errno != EPERM) Fail(Step::Setgroups);
  if (keep_caps) prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0);
  if (sys::setresgid(gid) < 0) Fail(gid_step);
  if (sys::setresuid(uid) < 0) Fail(uid_step);
}

[[noreturn]] void ExecMain(const Plan& plan, const ChildFds& fds) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  JoinCgroups(plan);

  // A new session detaches from any terminal the caller has, which is what
  // stops TIOCSTI from typing into it (CVE-2017-5226).
  if ((plan.new_session || plan.pty) && setsid() < 0) Fail(Step::NewSession);
  if (plan.pty && ioctl(g_pty_slave, TIOCSCTTY, 0) < 0) Fail(Step::ControllingTty);
  WireFds(plan);

  for (const Rlimit& r : plan.rlimits) {
    struct rlimit rl = {static_cast<rlim_t>(r.soft), static_cast<rlim_t>(r.hard)};
    if (setrlimit(r.resource, &rl) < 0) Fail(Step::Rlimit);
  }
  DropBoundingSet(plan.keep_caps);
  if (plan.set_ids) SetIds(plan.uid, plan.gid, plan.keep_caps != 0, Step::Setgid, Step::Setuid);
  // Our parent is PID 1 or the monitor, both outlived by nothing of ours;
  // Node's pidfd is closed by now.
  if (plan.die_with_parent) DieWithParent(-1);
  DropCapabilities(plan.keep_caps);
  if (plan.no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) Fail(Step::NoNewPrivs);

  // All host fds are closed by now, so a cwd like /proc/self/fd/N cannot
  // lead back to the host (runc CVE-2024-21626); the raw getcwd() reports
  // "(unreachable)" for a directory outside the root, checked anyway.
  if (chdir(plan.cwd.c_str()) < 0) Fail(Step::Chdir);
  char cwd[PATH_MAX];
  long n = syscall(SYS_getcwd, cwd, sizeof cwd);
  if (n < 0 || cwd[0] != '/') {
    errno = n < 0 ? errno : EXDEV;
    Fail(Step::Chdir);
  }
  // Last before exec, as bubblewrap does, so that the filter need not allow
  // anything of the setup. Without no_new_privs the kernel takes a filter
  // only from a holder of CAP_SYS_ADMIN (the TypeScript side checks).
  if (!plan.seccomp.empty()) InstallSeccomp(plan);

  int err = ENOENT;
  for (const std::string& path : plan.exec_candidates) {
    execve(path.c_str(), const_cast<char* const*>(plan.argv_ptrs.data()),
           const_cast<char* const*>(plan.env_ptrs.data()));
    // Keep looking on ENOENT/ENOTDIR like execvp; remember a permission
    // problem so "found but not executable" is what gets reported.
    if (errno != ENOENT && errno != ENOTDIR) err = errno;
    if (errno != ENOENT && errno != ENOTDIR && errno != EACCES) break;
  }
  Fail(Step::Exec, -1, err);
}

// Allocates the terminal in the sandbox's own devpts, so ttyname() and
// /dev/pts inside the sandbox agree, and hands the master to the parent.
void OpenSandboxPty(const Plan& plan, int sock) {
  int master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) Fail(Step::Pty);
  int unlock = 0;
  if (ioctl(master, TIOCSPTLCK, &unlock) < 0) Fail(Step::Pty);
  struct winsize ws;
  memset(&ws, 0, sizeof ws);
  ws.ws_col = plan.pty_cols;
  ws.ws_row = plan.pty_rows;
  if (ioctl(master, TIOCSWINSZ, &ws) < 0) Fail(Step::Pty);
  g_pty_slave = static_cast<int>(ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (g_pty_slave < 0) Fail(Step::Pty);

  char byte = 'T';
  struct iovec iov = {&byte, 1};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl.buf;
  msg.msg_controllen = sizeof ctl.buf;
  struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &master, sizeof(int));
  if (sendmsg(sock, &msg, MSG_NOSIGNAL) != 1) Fail(Step::Pty);
  close(master);
  close(sock);
}

// Starts the main process sharing our memory until it execs (vfork-like):
// no copy of Node's page tables, and we resume once it has exec'd or failed.
pid_t StartMain(const Plan& plan, const ChildFds& fds, bool subreaper) {
  MainArgs args{&plan, &fds, subreaper};
  return clone(MainEntry, fds.main_stack, CLONE_VM | CLONE_VFORK | SIGCHLD, &args);
}

}  // namespace msbx::child
