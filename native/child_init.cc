// The processes of a sandbox that stay behind once the command runs: PID 1
// (RunInit), which reaps and forwards signals, and the monitor of a command
// exec'd into a running sandbox (RunMonitor), which kills its whole tree on
// request by walking the host's /proc.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "child_internal.h"

namespace msbx {
namespace {

// Node's own command line and environment (SetHostArgArea).
uintptr_t g_arg_start, g_arg_end, g_env_start, g_env_end;

}  // namespace

void SetHostArgArea(uintptr_t arg_start, uintptr_t arg_end, uintptr_t env_start, uintptr_t env_end) {
  g_arg_start = arg_start;
  g_arg_end = arg_end;
  g_env_start = env_start;
  g_env_end = env_end;
}

namespace child {
namespace {

// Pids of every live descendant of `root` (itself excluded), found by
// scanning /proc/*/stat for parent links (threads included). `procfd` is the
// host's /proc, so pids are the ones kill() takes here. Zombies are left
// out: they are dead, and their parent (or PID 1) reaps them. Fixed
// buffers: no allocation here.
constexpr int kMaxPids = 8192;

// The parent pid in /proc/<pid>/stat; -1 for a zombie or a vanished pid.
int ParentOfPid(int procfd, int pid) {
  char path[32], buf[512];
  size_t n = 0;
  if (!AppendNum(path, sizeof path, n, static_cast<unsigned long>(pid)) || !Append(path, sizeof path, n, "/stat"))
    return -1;
  int fd = openat(procfd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t len = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (len <= 0) return -1;
  buf[len] = 0;
  // The command name may hold spaces and ')': the state and ppid follow the
  // last ')'.
  char* close_paren = nullptr;
  for (char* p = buf; *p; p++)
    if (*p == ')') close_paren = p;
  if (!close_paren || !close_paren[1] || !close_paren[2]) return -1;
  char* p = close_paren + 2;  // state
  if (*p == 'Z' || *p == 'X') return -1;
  while (*p && *p != ' ') p++;
  int ppid = 0;
  for (p++; *p >= '0' && *p <= '9'; p++) ppid = ppid * 10 + (*p - '0');
  return ppid;
}

int CollectDescendants(int procfd, int root, int* out) {
  static int pids[kMaxPids], parents[kMaxPids];
  static bool mark[kMaxPids];
  int count = 0;
  int dir = openat(procfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return 0;
  char buf[4096];
  for (;;) {
    long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      struct linux_dirent64 {
        uint64_t d_ino;
        int64_t d_off;
        unsigned short d_reclen;
        unsigned char d_type;
        char d_name[];
      };
      auto* e = reinterpret_cast<linux_dirent64*>(buf + off);
      off += e->d_reclen;
      int pid = 0;
      bool numeric = e->d_name[0] != 0;
      for (const char* c = e->d_name; *c; c++) {
        if (*c < '0' || *c > '9') numeric = false;
        else pid = pid * 10 + (*c - '0');
      }
      if (!numeric || count >= kMaxPids) continue;
      int ppid = ParentOfPid(procfd, pid);
      if (ppid < 0) continue;
      pids[count] = pid;
      parents[count] = ppid;
      count++;
    }
  }
  close(dir);
  // Fixed point: a pid is a descendant if its parent is root or a descendant.
  int found = 0;
  bool grew = true;
  for (int i = 0; i < count; i++) mark[i] = false;
  while (grew) {
    grew = false;
    for (int i = 0; i < count; i++) {
      if (mark[i]) continue;
      bool child = parents[i] == root;
      for (int j = 0; !child && j < found; j++) child = parents[i] == out[j];
      if (child) {
        mark[i] = true;
        out[found++] = pids[i];
        grew = true;
      }
    }
  }
  return found;
}

// The command a monitor runs (a host pid), and its wait status once reaped.
pid_t g_main_pid = -1;
bool g_main_done = false;
int32_t g_main_status = 0;

// Reaps every exited child without blocking, remembering the command's status.
void ReapChildren() {
  for (;;) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG | __WALL);
    if (p <= 0) return;
    if (p == g_main_pid) {
      g_main_done = true;
      g_main_status = st;
    }
  }
}

// Kills the command and its whole subtree. The command is a child
// subreaper: while it lives, every orphan of its tree comes back to it, so
// it is stopped (a stopped process cannot fork) and killed last, after
// rounds that stop then kill every descendant until none is left.
void KillTree(int procfd) {
  static int victims[kMaxPids];
  if (g_main_done) return;
  for (int round = 0; round < 1000; round++) {
    int n = CollectDescendants(procfd, g_main_pid, victims);
    if (n == 0) break;
    kill(g_main_pid, SIGSTOP);
    for (int i = 0; i < n; i++) kill(victims[i], SIGSTOP);
    for (int i = 0; i < n; i++) kill(victims[i], SIGKILL);
  }
  kill(g_main_pid, SIGKILL);
}

void NoopHandler(int) {}

}  // namespace

// PID 1 is a copy of Node: its command line (/proc/1/cmdline needs no
// permission to read) would show Node's argv, secrets included, and its
// environment Node's. Both areas are wiped in this copy; Node's own stay.
void WipeHostArgs() {
  if (g_arg_end > g_arg_start) {
    char* p = reinterpret_cast<char*>(g_arg_start);
    size_t n = g_arg_end - g_arg_start;
    memset(p, 0, n);
    const char name[] = "msbx-init";
    if (n > sizeof name) memcpy(p, name, sizeof name);
  }
  if (g_env_end > g_env_start) memset(reinterpret_cast<char*>(g_env_start), 0, g_env_end - g_env_start);
}

// PID 1 of the sandbox: reaps every orphan, forwards signals to the tree,
// and when the main process exits reports its wait status and exits, which
// makes the kernel kill everything left in the PID namespace. With no main
// process (main_pid < 0, a persistent sandbox) it only reaps, until killed.
[[noreturn]] void RunInit(pid_t main_pid, int status_fd) {
  prctl(PR_SET_NAME, "msbx-init", 0, 0, 0);
  // Without a handler the kernel drops signals sent to a namespace's init,
  // even from the parent; a no-op handler makes them deliverable while they
  // stay blocked for sigwaitinfo().
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = NoopHandler;
  for (int sig = 1; sig < 32; sig++) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    sigaction(sig, &sa, nullptr);
  }
  sigaction(kSignalKillAll, &sa, nullptr);
  sigset_t all;
  sigfillset(&all);
  for (;;) {
    siginfo_t si;
    int sig = sigwaitinfo(&all, &si);
    if (sig < 0) continue;
    if (sig == kSignalKillAll) {
      // kill(-1) spares the caller: everything but PID 1 goes.
      kill(-1, SIGKILL);
      continue;
    }
    if (sig != SIGCHLD) {
      if (sig != SIGTSTP && sig != SIGTTIN && sig != SIGTTOU) kill(-1, sig);
      continue;
    }
    for (;;) {
      int st = 0;
      pid_t p = waitpid(-1, &st, WNOHANG);
      if (p <= 0) break;
      if (p == main_pid) {
        int32_t status = st;
        ssize_t unused = write(status_fd, &status, sizeof status);
        (void)unused;
        _exit(0);
      }
    }
  }
}

// The monitor of a command run in an existing sandbox: reaps it, reports
// its status, forwards signals, and kills its whole subtree on request.
[[noreturn]] void RunMonitor(pid_t main_pid, int status_fd, int control_fd, int procfd) {
  g_main_pid = main_pid;
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) _exit(127);
  struct pollfd pfd[2] = {{sfd, POLLIN, 0}, {control_fd, POLLIN, 0}};
  for (;;) {
    ReapChildren();
    if (g_main_done) {
      ssize_t unused = write(status_fd, &g_main_status, sizeof g_main_status);
      (void)unused;
      _exit(0);
    }
    int n = poll(pfd, control_fd >= 0 ? 2 : 1, -1);
    if (n < 0) continue;
    if (control_fd >= 0 && (pfd[1].revents & (POLLIN | POLLHUP))) {
      unsigned char cmd;
      ssize_t got = read(control_fd, &cmd, 1);
      if (got <= 0) {
        control_fd = -1;  // the parent closed it: nothing more will come
      } else if (cmd == kControlKillTree) {
        KillTree(procfd);
      } else if (!g_main_done) {
        kill(g_main_pid, cmd);
      }
    }
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) == sizeof si) {
    }
  }
}

}  // namespace child
}  // namespace msbx
