// The parent's side of a spawn (see spawn.h): shared by the addon's
// in-process path and the spawner, so that both run the same RunChild.
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "child.h"
#include "sys.h"
#include "wire.h"

namespace msbx {

void Plan::finalize() {
  argv_ptrs.clear();
  for (auto& s : argv) argv_ptrs.push_back(s.data());
  argv_ptrs.push_back(nullptr);
  env_ptrs.clear();
  for (auto& s : env) env_ptrs.push_back(s.data());
  env_ptrs.push_back(nullptr);
}

std::string ErrnoText(const std::string& what, int err) {
  const char* name = strerrorname_np(err);
  return what + ": " + (name ? name : "errno " + std::to_string(err)) + " (" + strerror(err) + ")";
}

namespace {

// Closes every fd it owns on scope exit.
struct FdSet {
  std::vector<int> fds;
  int Add(int fd) {
    if (fd >= 0) fds.push_back(fd);
    return fd;
  }
  ~FdSet() {
    for (int fd : fds) close(fd);
  }
};

bool Fail(SpawnReply& reply, const std::string& what, int err) {
  reply.what = what;
  reply.err = err;
  return false;
}

bool WriteProcFile(pid_t pid, const char* name, const std::string& data, int& err) {
  std::string path = "/proc/" + std::to_string(pid) + "/" + name;
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return err = errno, false;
  ssize_t n = write(fd, data.data(), data.size());
  err = errno;
  close(fd);
  return n == static_cast<ssize_t>(data.size());
}

std::string CloneHint(int err) {
  switch (err) {
    case EPERM:
      return " (user namespaces are not permitted for this user here: check the sysctls "
             "kernel.unprivileged_userns_clone, user.max_user_namespaces, and on Ubuntu "
             "kernel.apparmor_restrict_unprivileged_userns; `minisandbox doctor` explains)";
    case ENOSPC:
      return " (a namespace limit was reached: see /proc/sys/user/max_*_namespaces)";
    case EINVAL:
      return " (the kernel rejected this namespace combination)";
    default:
      return "";
  }
}

// The spare stack for the child's main process (ChildFds::main_stack); the
// parent's mapping is dropped after clone (the child has its own
// copy-on-write one).
struct Stack {
  char* base = nullptr;
  Stack() {
    void* p = mmap(nullptr, kChildStackSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    base = p == MAP_FAILED ? nullptr : static_cast<char*>(p);
  }
  ~Stack() {
    if (base) munmap(base, kChildStackSize);
  }
  // Stacks grow down: hand out the top end.
  char* top() const { return base + kChildStackSize; }
};

}  // namespace

// Polled by every child after a credential change to learn whether its
// parent (Node, or the spawner) died meanwhile (see DieWithParent).
int OwnerPidfd() {
  static int fd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  return fd;
}

namespace {

// A user namespace with the given maps, kept by an fd: the id mapping that
// idmapped mounts (OP_IDMAP) apply. One per distinct mapping, made on first
// use by a child that only waits while its maps are written.
int IdmapUserns(const std::string& uid_map, const std::string& gid_map, int& err) {
  static std::map<std::string, int> cache;
  std::string key = uid_map + "|" + gid_map;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  int hold[2];
  if (pipe2(hold, O_CLOEXEC) < 0) return err = errno, -1;
  struct clone_args args;
  memset(&args, 0, sizeof args);
  args.flags = CLONE_NEWUSER;
  args.exit_signal = SIGCHLD;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  long pid = syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) {
    // EOF once the parent closes its end: our copy of that end goes first.
    close(hold[1]);
    char c;
    while (read(hold[0], &c, 1) < 0 && errno == EINTR) {
    }
    _exit(0);
  }
  err = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(hold[0]);
  int fd = -1;
  if (pid > 0) {
    std::string ns = "/proc/" + std::to_string(pid) + "/ns/user";
    if (WriteProcFile(static_cast<pid_t>(pid), "uid_map", uid_map, err) &&
        WriteProcFile(static_cast<pid_t>(pid), "gid_map", gid_map, err)) {
      fd = open(ns.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) err = errno;
    }
  }
  close(hold[1]);
  if (pid > 0) waitpid(static_cast<pid_t>(pid), nullptr, 0);
  if (fd >= 0) cache[key] = fd;
  return fd;
}

// A detached recursive clone of the host path, with the mount attributes
// and (userns >= 0) the id mapping applied; -errno when it cannot be made.
// A filesystem that cannot be idmapped gets a plain clone and a fallback
// record, so the sandbox still starts and says which mounts are not mapped.
int CloneHostSource(const std::string& path, uint64_t attrs, int userns, int op, SpawnReply& reply) {
  int tree = sys::open_tree(AT_FDCWD, path.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
  if (tree < 0) return -errno;
  struct mount_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.attr_set = attrs;
  if (userns >= 0) {
    attr.attr_set |= MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<uint64_t>(userns);
    if (sys::mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) == 0) return tree;
    reply.idmap_fallbacks.push_back({op, errno});
    attr.attr_set = attrs;
    attr.userns_fd = 0;
  }
  if (attr.attr_set && sys::mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0) {
    int e = errno;
    close(tree);
    return -e;
  }
  return tree;
}

// Clones the host sources of OP_CLONE_IN_PARENT ops, in the order the child
// takes them (plan.source_fds). The child inherits the fds at clone().
bool CloneSourcesInParent(Plan& plan, FdSet& child_only, SpawnReply& reply) {
  size_t n_prefix = plan.prefix_ops ? plan.prefix_ops->size() : 0;
  int userns = -1;
  for (size_t i = 0; i < n_prefix + plan.ops.size(); i++) {
    const MountOp& m = i < n_prefix ? (*plan.prefix_ops)[i] : plan.ops[i - n_prefix];
    if (!(m.flags & OP_CLONE_IN_PARENT)) continue;
    if ((m.flags & (OP_IDMAP | OP_UPPER_IDMAP)) && userns < 0) {
      int err = 0;
      userns = IdmapUserns(plan.uid_map, plan.gid_map, err);
      if (userns < 0) return Fail(reply, "creating the user namespace for idmapped mounts ('" + plan.uid_map + "')", err);
    }
    int op = static_cast<int>(i);
    auto add = [&](const std::string& path, uint64_t attrs, bool idmap) {
      int fd = CloneHostSource(path, attrs, idmap ? userns : -1, op, reply);
      child_only.Add(fd);
      plan.source_fds.push_back(fd);
    };
    if (m.kind == OpKind::Bind) {
      add(m.src, MountAttrs(m.flags), m.flags & OP_IDMAP);
    } else {
      for (const std::string& lower : m.lowers) add(lower, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, m.flags & OP_IDMAP);
      if (!m.upper_base.empty()) add(m.upper_base, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, m.flags & OP_UPPER_IDMAP);
    }
  }
  return true;
}

// posix_spawn's attributes and file actions, destroyed on scope exit.
struct SpawnSetup {
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  int err = 0;  // the first error of the set-up calls
  SpawnSetup() {
    Check(posix_spawn_file_actions_init(&actions));
    Check(posix_spawnattr_init(&attr));
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
  }
  void Check(int rc) {
    if (rc != 0 && err == 0) err = rc;
  }
};

// Runs a setuid map helper (newuidmap/newgidmap) for the child `pid`:
// `argv` as the plan built it, with argv[1] replaced by the pid, stdin from
// /dev/null and stdout/stderr into a pipe, read for the error message. On
// failure `what` says which helper failed and how, in its own words.
bool RunMapper(const std::vector<std::string>& argv_in, pid_t pid, std::string& what) {
  std::vector<std::string> argv = argv_in;
  argv[1] = std::to_string(pid);
  std::string cmdline;
  for (const std::string& a : argv) cmdline += (cmdline.empty() ? "" : " ") + a;
  std::vector<char*> ptrs;
  for (std::string& a : argv) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  int out[2];
  if (pipe2(out, O_CLOEXEC) < 0) return what = ErrnoText("pipe2 for " + cmdline, errno), false;
  pid_t helper = SpawnHelper(ptrs[0], ptrs.data(),
                             {HelperFd::Open(0, "/dev/null", O_RDONLY), HelperFd::Dup(out[1], 1), HelperFd::Dup(out[1], 2)});
  close(out[1]);
  if (helper < 0) {
    close(out[0]);
    return what = ErrnoText("running " + cmdline, -helper), false;
  }
  std::string msg;
  char buf[512];
  for (;;) {
    ssize_t n = read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (msg.size() < 4096) msg.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int status = 0;
  while (waitpid(helper, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) msg.pop_back();
  std::string how = WIFEXITED(status) ? "exit " + std::to_string(WEXITSTATUS(status))
                                      : "signal " + std::to_string(WTERMSIG(status));
  what = cmdline + " failed (" + how + ")" + (msg.empty() ? "" : ": " + msg);
  return false;
}

void KillAndReap(int pidfd) {
  sys::pidfd_send_signal(pidfd, SIGKILL);
  siginfo_t si;
  while (waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &si, WEXITED) < 0 && errno == EINTR) {
  }
}

// The id maps of a new sandbox's user namespace, written before its child
// may run anything. On failure the child is killed and reaped.
bool WriteIdMaps(const Plan& plan, pid_t pid, int pidfd, SpawnReply& reply) {
  auto abort_child = [&](const std::string& what, int e) {
    KillAndReap(pidfd);
    return Fail(reply, what, e);
  };
  if (!(plan.namespaces & NS_USER)) return true;
  int e = 0;
  for (const auto* mapper : {&plan.uid_mapper, &plan.gid_mapper}) {
    std::string what;
    if (mapper->empty() || RunMapper(*mapper, pid, what)) continue;
    return abort_child("writing the sandbox's id maps: " + what, 0);
  }
  if (plan.deny_setgroups && !WriteProcFile(pid, "setgroups", "deny", e))
    return abort_child("writing the sandbox's setgroups", e);
  if (!plan.uid_map.empty() && !WriteProcFile(pid, "uid_map", plan.uid_map, e))
    return abort_child("writing the sandbox's uid_map '" + plan.uid_map + "'", e);
  if (!plan.gid_map.empty() && !WriteProcFile(pid, "gid_map", plan.gid_map, e))
    return abort_child("writing the sandbox's gid_map '" + plan.gid_map + "'", e);
  return true;
}

// The parent's side before the child may run anything: the id maps of a
// new sandbox, then the byte that releases it.
bool ReleaseChild(const Plan& plan, int sync_write, pid_t pid, int pidfd, bool write_maps, SpawnReply& reply) {
  if (write_maps && !WriteIdMaps(plan, pid, pidfd, reply)) return false;
  char go = 1;
  if (write(sync_write, &go, 1) != 1) {
    KillAndReap(pidfd);
    return Fail(reply, "releasing the sandbox child", errno);
  }
  return true;
}

// Returns once the child has run its first steps (StartChild), or died.
// Why: on a VM that shadows page tables a new process takes long to run
// at all (a fork's first instruction comes a good part of a millisecond
// later), and the scheduler queues it behind its parent, on the parent's
// CPU. Everything that follows here (the reply, then Node's own
// bookkeeping) can wait; the child's setup or command cannot, and it is
// what the caller waits for in the end. The suite's warm start
// (benchmarks/suite) is where it shows. `write_end` is our copy of the
// child's end: closed first, so that a child that dies unstarted ends the
// wait with EOF.
void WaitUntilStarted(int read_end, int write_end) {
  close(write_end);
  char c;
  while (read(read_end, &c, 1) < 0 && errno == EINTR) {
  }
  close(read_end);
}

long Clone(uint64_t flags, int* pidfd) {
  struct clone_args args;
  memset(&args, 0, sizeof args);
  args.flags = flags | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<uint64_t>(pidfd);
  args.exit_signal = SIGCHLD;
  return syscall(SYS_clone3, &args, sizeof args);
}

}  // namespace

pid_t SpawnHelper(const char* file, char* const argv[], std::initializer_list<HelperFd> fds) {
  SpawnSetup setup;
  for (const HelperFd& f : fds) {
    setup.Check(f.path ? posix_spawn_file_actions_addopen(&setup.actions, f.target, f.path, f.open_flags, 0)
                       : posix_spawn_file_actions_adddup2(&setup.actions, f.source, f.target));
  }
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  setup.Check(posix_spawnattr_setsigmask(&setup.attr, &none));
  setup.Check(posix_spawnattr_setsigdefault(&setup.attr, &all));
  setup.Check(posix_spawnattr_setflags(&setup.attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF));
  if (setup.err != 0) return -setup.err;
  char* no_env[] = {nullptr};
  pid_t pid = -1;
  int rc = posix_spawn(&pid, file, &setup.actions, &setup.attr, argv, no_env);
  return rc != 0 ? -rc : pid;
}

bool CloneSandbox(SpawnRequest& rq, SpawnReply& reply) {
  Plan& plan = rq.plan;
  FdSet child_only;  // fds made here for the child alone: closed after clone
  if (!rq.enter && !CloneSourcesInParent(plan, child_only, reply)) return false;
  Stack stack;
  if (!stack.base) return Fail(reply, "mmap of the child's stack", errno);
  int sync[2], started[2];
  if (pipe2(sync, O_CLOEXEC) < 0) return Fail(reply, "pipe2", errno);
  FdSet sync_fds;
  sync_fds.Add(sync[0]);
  sync_fds.Add(sync[1]);
  if (pipe2(started, O_CLOEXEC) < 0) return Fail(reply, "pipe2", errno);

  // The mount namespace always: ReadPlan refuses a plan without it. A
  // command entering a sandbox joins its namespaces with setns() instead.
  uint64_t flags = rq.enter ? 0 : NamespaceCloneFlags(plan.namespaces) | CLONE_NEWNS;
  ChildFds cfds{sync[0], sync[1], started[1], rq.err_write, rq.status_write, rq.pty_socket, rq.control_read, OwnerPidfd(), stack.top()};
  int pidfd = -1;
  // Every signal stays blocked across clone() so none is delivered to the
  // child through the parent's handlers before it resets them; the child
  // starts with all of them blocked (RunInit relies on it).
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  long pid = Clone(flags, &pidfd);
  if (pid == 0) {
    if (rq.enter) RunEnter(plan, cfds, rq.target_pidfd);
    RunChild(plan, cfds);
  }
  int clone_err = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) {
    close(started[0]);
    close(started[1]);
    return Fail(reply, rq.enter ? "clone3" : "clone3 (creating the sandbox's namespaces)" + CloneHint(clone_err), clone_err);
  }
  bool released = ReleaseChild(plan, sync[1], static_cast<pid_t>(pid), pidfd, !rq.enter, reply);
  // A child not released has been killed and reaped: EOF at once.
  WaitUntilStarted(started[0], started[1]);
  if (!released) {
    close(pidfd);
    return false;
  }
  reply.pid = pid;
  reply.pidfd = pidfd;
  return true;
}

std::string PoolKey(const Plan& plan, bool enter) {
  if (enter) return "enter";
  std::string key = std::to_string(plan.namespaces) + (plan.deny_setgroups ? " deny\n" : "\n");
  key += plan.uid_map + '\n' + plan.gid_map + '\n';
  for (const auto* mapper : {&plan.uid_mapper, &plan.gid_mapper}) {
    for (const std::string& arg : *mapper) key += arg + '\0';
    key += '\n';
  }
  return key;
}

bool ClonePooledChild(const Plan& plan, bool enter, void (*entry)(int sock), PooledChild& pool, std::string& error) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return error = ErrnoText("socketpair", errno), false;
  // As in CloneSandbox: no signal reaches the child through our handlers.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int pidfd = -1;
  long pid = Clone(enter ? 0 : NamespaceCloneFlags(plan.namespaces) | CLONE_NEWNS, &pidfd);
  if (pid == 0) {
    close(sv[0]);
    entry(sv[1]);
    _exit(127);
  }
  int clone_err = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  close(sv[1]);
  SpawnReply maps;
  if (pid < 0 || (!enter && !WriteIdMaps(plan, static_cast<pid_t>(pid), pidfd, maps))) {
    error = pid < 0 ? ErrnoText("clone3", clone_err) : maps.what;
    close(sv[0]);
    if (pidfd >= 0) close(pidfd);
    return false;
  }
  pool.pid = pid;
  pool.pidfd = pidfd;
  pool.sock = sv[0];
  pool.key = PoolKey(plan, enter);
  return true;
}

bool HandOffSandbox(SpawnRequest& rq, const std::string& payload, const std::vector<int>& fds, PooledChild& pool,
                    SpawnReply& reply) {
  PooledChild child = pool;
  pool = PooledChild{};
  FdSet owned;  // the socket and the host sources (the child gets its own copies)
  owned.Add(child.sock);
  auto discard = [&] {
    sys::pidfd_send_signal(child.pidfd, SIGKILL);  // the spawner reaps it
    close(child.pidfd);
  };
  if (!rq.enter && !CloneSourcesInParent(rq.plan, owned, reply)) {
    discard();
    return true;  // the request's own failure, as CloneSandbox reports it
  }
  std::string sources;
  std::vector<int> source_fds;
  wire::EncodeFds(rq.plan.source_fds, sources, source_fds);
  // Then its start byte (StartChild). A child killed meanwhile takes
  // nothing (the send fails) or dies before it starts (EOF): nothing of
  // the request has run, and the caller clones it as usual.
  char c = 0;
  ssize_t n = -1;
  if (wire::Send(child.sock, wire::Kind::Spawn, payload, fds) &&
      wire::Send(child.sock, wire::Kind::Sources, sources, source_fds)) {
    do n = read(child.sock, &c, 1); while (n < 0 && errno == EINTR);
  }
  if (n != 1) {
    discard();
    rq.plan.source_fds.clear();
    reply = SpawnReply{};
    return false;
  }
  reply.pid = child.pid;
  reply.pidfd = child.pidfd;
  return true;
}

void DiscardPooledChild(PooledChild& pool) {
  if (pool.pid < 0) return;
  sys::pidfd_send_signal(pool.pidfd, SIGKILL);
  close(pool.pidfd);
  close(pool.sock);
  pool = PooledChild{};
}

// Where this process's argv and environment lie in its memory, for PID 1 to
// wipe them in its copy (fields 48-51 of /proc/self/stat, after the command
// name).
void ReadHostArgArea() {
  std::ifstream in("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return;
  std::istringstream fields(stat.substr(paren + 2));
  std::vector<std::string> f;
  for (std::string x; fields >> x;) f.push_back(x);
  // f[0] is field 3 (state): field N is f[N - 3].
  if (f.size() < 49) return;
  auto at = [&](int field) { return static_cast<uintptr_t>(std::stoull(f[field - 3])); };
  SetHostArgArea(at(48), at(49), at(50), at(51));
}

}  // namespace msbx
