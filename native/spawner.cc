// msbx-spawner: the process that clones sandboxes for one Node process.
//
// Why: a clone copies the caller's page tables, so cloning from Node costs
// in proportion to Node's heap (8 ms at 60 MiB, 140 ms at 2 GiB). This
// program is a few MiB; its clones cost the same whatever Node holds. The
// addon starts it on the first spawn (posix_spawn, a vfork: no copy either)
// with its end of a Unix stream socket as fd 3 and Node's pid as argv[1],
// then sends it spawn requests (wire.h) and gets back pids and pidfds.
//
// Lifetime: it dies with Node (PR_SET_PDEATHSIG, and it exits on EOF of its
// socket, which Node's death or close brings); the sandboxes it made with
// dieWithParent die with it in turn (their own parent-death signal). It is
// the parent of every sandbox's PID 1 and of every `enter` monitor, so it
// reaps them, and reports each one's wait status on that process's status
// pipe (Node cannot waitid() a process that is not its child).
//
// Unlike a sandbox's child, this process may allocate and use the C++
// library freely: it is single-threaded and exec'd fresh, so no lock can be
// held by a thread that does not exist here. Its clones run the same
// RunChild/RunEnter as the addon's (spawn.cc), between clone() and execve()
// with the same async-signal-safe rules.
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <signal.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "child.h"
#include "child_internal.h"
#include "spawn.h"
#include "sys.h"
#include "wire.h"

namespace msbx {
namespace {

constexpr int kSocketFd = 3;

// Each live child (PID 1 or monitor) and our copy of its status pipe's
// write end: we write its wait status there when we reap it, then close it,
// so the reader sees the main process's status first (PID 1 writes it
// before it exits) and EOF only once the child is gone and reaped.
std::map<pid_t, int> g_status_fds;

void Reap() {
  for (;;) {
    int st = 0;
    pid_t pid = waitpid(-1, &st, WNOHANG | __WALL);
    if (pid <= 0) return;
    auto it = g_status_fds.find(pid);
    if (it == g_status_fds.end()) continue;
    int32_t status = st;
    ssize_t unused = write(it->second, &status, sizeof status);
    (void)unused;
    close(it->second);
    g_status_fds.erase(it);
  }
}

// The host root's ops of the last request that carried them; a request
// with prefix_cached uses them again (the addon keeps the same copy).
std::shared_ptr<const std::vector<MountOp>> g_prefix;

// Takes the request's prefix from, or into, g_prefix. False when the
// request names a kept prefix and there is none.
bool ResolvePrefix(SpawnRequest& rq) {
  if (!rq.prefix_cached) {
    if (rq.plan.prefix_ops) g_prefix = rq.plan.prefix_ops;
    return true;
  }
  rq.plan.prefix_ops = g_prefix;
  return g_prefix != nullptr;
}

// /proc/self/mountinfo, polled for the kernel's word that the mount table
// changed (POLLPRI): a pooled sandbox child's mount namespace is a copy of
// the table as it was when the child was made. -1: no pooled sandboxes.
int g_mountinfo = -1;

// Whether the mount table changed since the last call; each call takes the
// news, so the call before a pooled child is made starts a new watch.
bool MountsChanged() {
  if (g_mountinfo < 0) return true;
  struct pollfd p = {g_mountinfo, POLLPRI, 0};
  return poll(&p, 1, 0) != 0;
}

// A child cloned ahead (PooledChild), for new sandboxes or for monitors
// (`enter`), and what the next one is to be made for: the last request's
// namespaces and maps (only its PoolKey fields are kept), once the spawner
// has been idle for kRefillIdleMs. Not at once: making namespaces takes the
// kernel's locks that the new sandbox's PID 1 takes for its mounts and its
// loopback, and a fork competes with the command just started; a pause in
// the requests means both are done.
struct Pool {
  bool enter;
  PooledChild child;
  std::unique_ptr<Plan> refill;
};
Pool g_sandboxes{false, {}, nullptr};
Pool g_monitors{true, {}, nullptr};
constexpr int kRefillIdleMs = 10;

Pool& PoolFor(const SpawnRequest& rq) { return rq.enter ? g_monitors : g_sandboxes; }

// Whether the pooled child can be this request's: a monitor for any
// command; for a new sandbox, one made with its namespaces and maps, while
// the host's mounts are as the child saw them and the kept prefix (the
// child has its own copy) is the one it was made with.
bool PoolServes(const SpawnRequest& rq) {
  const PooledChild& c = PoolFor(rq).child;
  if (c.pid < 0 || c.key != PoolKey(rq.plan, rq.enter)) return false;
  if (rq.enter) return true;
  if (rq.prefix_cached && c.prefix != g_prefix.get()) return false;
  return !MountsChanged();
}

// A pooled child (ClonePooledChild): this process as it was, in the
// namespaces of the last sandbox or in none (a monitor), waiting for a
// request; from then on it is that request's child, as if just cloned for
// it.
[[noreturn]] void RunPooledChild(int sock) {
  // Dies with us while it waits; StartChild arms the plan's own choice.
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  prctl(PR_SET_NAME, "msbx-pooled", 0, 0, 0);
  int owner = OwnerPidfd();
  int keep[2] = {sock, owner};
  child::CloseAllExcept(keep, 2);
  struct pollfd alive = {owner, POLLIN, 0};
  if (poll(&alive, 1, 0) != 0) _exit(0);  // we died before the death signal was armed
  wire::Kind kind;
  std::string payload, sources, error;
  std::vector<int> fds, source_fds;
  if (wire::Receive(sock, kind, payload, fds) <= 0 || kind != wire::Kind::Spawn) _exit(0);
  if (wire::Receive(sock, kind, sources, source_fds) <= 0 || kind != wire::Kind::Sources) _exit(0);
  SpawnRequest rq;
  if (!wire::DecodeRequest(payload, fds, rq, error) || !ResolvePrefix(rq) ||
      !wire::DecodeFds(sources, source_fds, rq.plan.source_fds))
    _exit(127);  // the spawner decoded it just before: cannot happen
  if (!rq.plan.die_with_parent) prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
  void* stack = mmap(nullptr, kChildStackSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) _exit(127);
  ChildFds cfds{-1, -1, sock, rq.err_write, rq.status_write, rq.pty_socket, rq.control_read, owner,
                static_cast<char*>(stack) + kChildStackSize};
  if (rq.enter) RunEnter(rq.plan, cfds, rq.target_pidfd);
  RunChild(rq.plan, cfds);
}

void NoteRefill(Pool& pool, const Plan& plan) {
  if (pool.child.pid >= 0 || (!pool.enter && g_mountinfo < 0)) return;
  pool.refill = std::make_unique<Plan>();
  if (pool.enter) return;  // a monitor is made in no namespace of its own
  pool.refill->namespaces = plan.namespaces;
  pool.refill->uid_map = plan.uid_map;
  pool.refill->gid_map = plan.gid_map;
  pool.refill->uid_mapper = plan.uid_mapper;
  pool.refill->gid_mapper = plan.gid_mapper;
  pool.refill->deny_setgroups = plan.deny_setgroups;
}

void Refill(Pool& pool) {
  std::unique_ptr<Plan> plan = std::move(pool.refill);
  if (!plan || pool.child.pid >= 0) return;
  if (!pool.enter) MountsChanged();
  std::string error;
  // Nothing to report if it fails: the next request clones as usual.
  if (ClonePooledChild(*plan, pool.enter, RunPooledChild, pool.child, error)) pool.child.prefix = g_prefix.get();
}

void Handle(int sock, const std::string& payload, std::vector<int>& fds) {
  SpawnRequest rq;
  SpawnReply reply;
  std::string error;
  bool decoded = false;
  if (!wire::DecodeRequest(payload, fds, rq, error)) {
    reply.what = error;
    g_prefix = nullptr;  // the addon resends it after any failed request
  } else if (!ResolvePrefix(rq)) {
    reply.what = "the spawn request names a host root the spawner does not hold";
  } else {
    decoded = true;
    Pool& pool = PoolFor(rq);
    bool pooled = PoolServes(rq);
    if (!pooled) DiscardPooledChild(pool.child);  // made for other namespaces or mounts
    bool handed_off = pooled && HandOffSandbox(rq, payload, fds, pool.child, reply);
    if (handed_off ? reply.pid > 0 : CloneSandbox(rq, reply)) {
      int keep = fcntl(rq.status_write, F_DUPFD_CLOEXEC, 0);
      if (keep >= 0) g_status_fds[static_cast<pid_t>(reply.pid)] = keep;
    }
  }
  // Every fd that came with the request was the child's to inherit: the
  // child has its copies now, ours go (no fd of Node's stays here).
  for (int fd : fds) close(fd);
  fds.clear();
  std::string out;
  std::vector<int> out_fds;
  wire::EncodeReply(reply, out, out_fds);
  bool sent = wire::Send(sock, wire::Kind::Reply, out, out_fds);
  if (reply.pidfd >= 0) close(reply.pidfd);
  if (!sent) _exit(0);  // Node is gone; our children die with us
  if (decoded) NoteRefill(PoolFor(rq), rq.plan);
}

// The size of a huge page on x86-64 and on arm64 with 4 KiB pages.
constexpr uintptr_t kHugePage = 2u << 20;

// Whether the 2 MiB at `addr` are backed by a huge page (smaps says so).
bool IsOneHugePage(uintptr_t addr) {
  std::ifstream smaps("/proc/self/smaps");
  bool in = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long lo = 0, hi = 0;
    if (sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {  // a mapping's first line
      in = lo <= addr && addr < hi;
      continue;
    }
    if (in && line.rfind("AnonHugePages:", 0) == 0) return strtoul(line.c_str() + 14, nullptr, 10) >= kHugePage / 1024;
  }
  return false;
}

// Moves this program's code onto one transparent huge page, where the
// kernel gives one. Why: every PID 1 and monitor is a clone of this
// process, and under a hypervisor that shadows page tables (a PVM guest,
// such as the machines this was measured on) each page a new process
// touches first costs a fault, while a 2 MiB huge page costs one fault for
// all of it; a PID 1 runs much of this code. The suite's warm start
// (benchmarks/suite) is where the gain shows.
// binding.gyp links the code and read-only data, and nothing else, into the
// first 2 MiB of the address space (-z noseparate-code, -z
// max-page-size=0x200000); the spawner is static, so that holds all of it.
//
// The copy is anonymous memory, written once, then only read and executed
// (W^X holds); perf and gdb see no file behind it. Where anything fails (no
// huge page to be had, executable memory refused) the code stays where the
// loader put it.
void MapCodeOnHugePage() {
  std::ifstream hp("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size");
  unsigned long pmd = 0;
  if (!(hp >> pmd) || pmd != kHugePage) return;
  auto* ph = reinterpret_cast<const ElfW(Phdr)*>(getauxval(AT_PHDR));
  size_t n = getauxval(AT_PHNUM);
  uintptr_t start = 0, size = 0;
  for (size_t i = 0; i < n; i++)
    if (ph[i].p_type == PT_LOAD && (ph[i].p_flags & PF_X)) start = ph[i].p_vaddr, size = ph[i].p_memsz;
  if (start == 0 || start % kHugePage != 0 || size > kHugePage) return;
  for (size_t i = 0; i < n; i++) {
    bool other = ph[i].p_type == PT_LOAD && !(ph[i].p_flags & PF_X);
    if (other && ph[i].p_vaddr < start + kHugePage && ph[i].p_vaddr + ph[i].p_memsz > start) return;
  }
  // A 2 MiB-aligned 2 MiB of fresh memory, marked for a huge page before
  // its first touch.
  void* raw = mmap(nullptr, 2 * kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return;
  uintptr_t r = reinterpret_cast<uintptr_t>(raw);
  uintptr_t copy = (r + kHugePage - 1) & ~(kHugePage - 1);
  if (copy > r) munmap(raw, copy - r);
  if (copy + kHugePage < r + 2 * kHugePage) munmap(reinterpret_cast<void*>(copy + kHugePage), r + kHugePage - copy);
  void* dst = reinterpret_cast<void*>(copy);
  bool ok = madvise(dst, kHugePage, MADV_HUGEPAGE) == 0;
  if (ok) {
    memcpy(dst, reinterpret_cast<const void*>(start), size);
    ok = IsOneHugePage(copy);
  }
  // mremap replaces the loader's mapping at once: this very code runs on
  // from the copy, byte for byte the same.
  ok = ok && mprotect(dst, kHugePage, PROT_READ | PROT_EXEC) == 0 &&
       mremap(dst, kHugePage, kHugePage, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(start)) != MAP_FAILED;
  if (!ok) munmap(dst, kHugePage);
}

int Main(int argc, char** argv) {
  // `msbx-spawner --version`: the install script's check that this binary
  // runs here at all (its architecture; it is static, so the host's C
  // library plays no part) before it is relied on.
  if (argc == 2 && strcmp(argv[1], "--version") == 0) {
    std::string v = "msbx-spawner protocol " + std::to_string(wire::kVersion) + "\n";
    return write(1, v.data(), v.size()) == static_cast<ssize_t>(v.size()) ? 0 : 1;
  }
  // Die with Node, and make sure it did not die before that was armed.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) return 1;
  if (argc < 2 || getppid() != static_cast<pid_t>(strtol(argv[1], nullptr, 10))) return 1;
  prctl(PR_SET_NAME, "msbx-spawner", 0, 0, 0);
  MapCodeOnHugePage();
  // Nothing of Node's but the socket: fds Node left inheritable stay out.
  sys::close_range(kSocketFd + 1, ~0u, 0);
  fcntl(kSocketFd, F_SETFD, FD_CLOEXEC);
  signal(SIGPIPE, SIG_IGN);
  RecordChangedSignals();
  g_mountinfo = open("/proc/self/mountinfo", O_RDONLY | O_CLOEXEC);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, nullptr);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) return 1;
  // PID 1 of each sandbox is a copy of us: it wipes our argv (no secrets
  // here, but the same code path as the addon's).
  ReadHostArgArea();

  std::string hello = std::to_string(getpid());
  if (!wire::Send(kSocketFd, wire::Kind::Hello, hello, {})) return 1;

  std::string payload;
  std::vector<int> fds;
  for (;;) {
    struct pollfd p[2] = {{kSocketFd, POLLIN, 0}, {sfd, POLLIN, 0}};
    int ready = poll(p, 2, g_sandboxes.refill || g_monitors.refill ? kRefillIdleMs : -1);
    if (ready < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (ready == 0) {
      Refill(g_sandboxes);
      Refill(g_monitors);
      continue;
    }
    if (p[1].revents & POLLIN) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) == sizeof si) {
      }
      Reap();
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      wire::Kind kind;
      int rc = wire::Receive(kSocketFd, kind, payload, fds);
      // EOF: Node closed the socket or died. Our children with a death
      // signal die with us; the others are reparented, as they would be if
      // Node had made them.
      if (rc <= 0) return 0;
      if (kind != wire::Kind::Spawn) {
        for (int fd : fds) close(fd);
        return 1;
      }
      Handle(kSocketFd, payload, fds);
      // A child that died while we were busy: its SIGCHLD is pending in the
      // signalfd and reaped on the next turn.
    }
  }
}

}  // namespace
}  // namespace msbx

int main(int argc, char** argv) { return msbx::Main(argc, argv); }
