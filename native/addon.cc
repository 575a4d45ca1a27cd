// The N-API surface: spawn a process into a new sandbox, watch its exit,
// signal it. Policy (what to mount, which defaults) lives in TypeScript;
// this file prepares the plan, clones, writes the id maps and returns fds.
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <napi.h>

#include "child.h"
#include "watchers.h"
#include "plan_js.h"
#include "sys.h"


namespace msbx {
namespace {

// Closes every fd it owns on scope exit unless released to the caller.
struct FdSet {
  std::vector<int> fds;
  int Add(int fd) {
    if (fd >= 0) fds.push_back(fd);
    return fd;
  }
  void Release(int fd) { fds.erase(std::remove(fds.begin(), fds.end(), fd), fds.end()); }
  ~FdSet() {
    for (int fd : fds) close(fd);
  }
};

std::string ErrnoText(const std::string& what, int err) {
  return what + ": " + strerrorname_np(err) + " (" + strerror(err) + ")";
}

Napi::Error SysError(Napi::Env env, const std::string& what, int err) {
  Napi::Error e = Napi::Error::New(env, ErrnoText(what, err));
  e.Set("errno", Napi::Number::New(env, err));
  const char* code = strerrorname_np(err);
  if (code) e.Set("code", Napi::String::New(env, code));
  return e;
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

// What Spawn and Enter share: the plan, the fds it asks for, the terminal
// socket and the pipes between parent and child.
struct Prepared {
  Plan plan;
  Stack stack;
  FdSet owned;       // parent ends, released into the result
  FdSet child_only;  // child ends, closed in the parent after clone
  int parent_ends[3] = {-1, -1, -1};
  int pty_sock[2] = {-1, -1};
  int sync[2] = {-1, -1}, err[2] = {-1, -1}, status[2] = {-1, -1};
  int control[2] = {-1, -1};
  // Sources cloned here that the kernel could not idmap: {op index, errno}.
  std::vector<std::pair<int, int>> idmap_fallbacks;
};

// Makes what plan.stdio[target] asks for and wires it to the child's fd
// `target`: the child's end of a pipe (the parent's end is the result's
// stdin, stdout or stderr), /dev/null, the terminal, or the caller's fd.
bool WireStdio(Napi::Env env, Prepared& p, int target, std::vector<FdMapping>& out) {
  const Stdio& s = p.plan.stdio[target];
  int source = -1;
  switch (s.kind) {
    case Stdio::Kind::Fd:
      source = s.fd;
      break;
    case Stdio::Kind::Pty:
      source = kPtySlave;
      break;
    case Stdio::Kind::Null:
      source = p.child_only.Add(open("/dev/null", O_RDWR | O_CLOEXEC));
      if (source < 0) {
        SysError(env, "opening /dev/null for the sandbox's fd " + std::to_string(target), errno).ThrowAsJavaScriptException();
        return false;
      }
      break;
    case Stdio::Kind::Pipe: {
      int ends[2];
      if (pipe2(ends, O_CLOEXEC) < 0) {
        SysError(env, "pipe2 for the sandbox's fd " + std::to_string(target), errno).ThrowAsJavaScriptException();
        return false;
      }
      bool in = target == 0;
      p.parent_ends[target] = p.owned.Add(in ? ends[1] : ends[0]);
      source = p.child_only.Add(in ? ends[0] : ends[1]);
      break;
    }
  }
  out.push_back({target, source});
  return true;
}

// Node's own pidfd, inherited by every child: polled after a credential
// change to learn whether Node died meanwhile (see DieWithParent).
int OwnerPidfd() {
  static int fd = static_cast<int>(syscall(SYS_pidfd_open, getpid(), 0));
  return fd;
}

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
int CloneHostSource(const std::string& path, uint64_t attrs, int userns, int op, Prepared& p) {
  int tree = sys::open_tree(AT_FDCWD, path.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
  if (tree < 0) return -errno;
  struct mount_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.attr_set = attrs;
  if (userns >= 0) {
    attr.attr_set |= MOUNT_ATTR_IDMAP;
    attr.userns_fd = static_cast<uint64_t>(userns);
    if (sys::mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) == 0) return tree;
    p.idmap_fallbacks.push_back({op, errno});
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
bool CloneSourcesInParent(Napi::Env env, Prepared& p) {
  Plan& plan = p.plan;
  size_t n_prefix = plan.prefix_ops ? plan.prefix_ops->size() : 0;
  int userns = -1;
  for (size_t i = 0; i < n_prefix + plan.ops.size(); i++) {
    const MountOp& m = i < n_prefix ? (*plan.prefix_ops)[i] : plan.ops[i - n_prefix];
    if (!(m.flags & OP_CLONE_IN_PARENT)) continue;
    if ((m.flags & (OP_IDMAP | OP_UPPER_IDMAP)) && userns < 0) {
      int err = 0;
      userns = IdmapUserns(plan.uid_map, plan.gid_map, err);
      if (userns < 0) {
        SysError(env, "creating the user namespace for idmapped mounts ('" + plan.uid_map + "')", err)
            .ThrowAsJavaScriptException();
        return false;
      }
    }
    int op = static_cast<int>(i);
    auto add = [&](const std::string& path, uint64_t attrs, bool idmap) {
      int fd = CloneHostSource(path, attrs, idmap ? userns : -1, op, p);
      p.child_only.Add(fd);
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

bool Prepare(Napi::Env env, const Napi::Object& obj, Prepared& p, bool enter) {
  std::string error;
  if (!ReadPlan(obj, p.plan, error)) {
    Napi::TypeError::New(env, error).ThrowAsJavaScriptException();
    return false;
  }
  Plan& plan = p.plan;
  // The terminal is allocated by the child inside the sandbox's own devpts
  // and its master comes back over this socket.
  if (plan.pty) {
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, p.pty_sock) < 0) {
      SysError(env, "socketpair for the terminal", errno).ThrowAsJavaScriptException();
      return false;
    }
    p.owned.Add(p.pty_sock[0]);
    p.child_only.Add(p.pty_sock[1]);
  }
  if (!plan.hold) {
    // The streams (fds 0-2) go in front of the extra fds (3-255), so that
    // plan.fds stays sorted by target.
    std::vector<FdMapping> streams;
    for (int i = 0; i < 3; i++) {
      if (!WireStdio(env, p, i, streams)) return false;
    }
    plan.fds.insert(plan.fds.begin(), streams.begin(), streams.end());
  }
  plan.finalize();
  for (const std::string& procs : plan.cgroup_procs) {
    int fd = open(procs.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      SysError(env, "opening " + procs + " (the sandbox's cgroup)", errno).ThrowAsJavaScriptException();
      return false;
    }
    plan.cgroup_fds.push_back(p.child_only.Add(fd));
  }
  if (!p.stack.base) {
    SysError(env, "mmap of the child's stack", errno).ThrowAsJavaScriptException();
    return false;
  }

  bool ok = pipe2(p.sync, O_CLOEXEC) == 0 && pipe2(p.err, O_CLOEXEC) == 0 && pipe2(p.status, O_CLOEXEC) == 0;
  if (ok && enter) ok = pipe2(p.control, O_CLOEXEC) == 0;
  int e = errno;
  for (int fd : {p.sync[1], p.err[0], p.status[0], p.control[1]}) p.owned.Add(fd);
  for (int fd : {p.sync[0], p.err[1], p.status[1], p.control[0]}) p.child_only.Add(fd);
  if (!ok) {
    SysError(env, "pipe2", e).ThrowAsJavaScriptException();
    return false;
  }
  return true;
}

// Runs a setuid map helper (newuidmap/newgidmap) for the child `pid`:
// `argv` as the plan built it, with argv[1] replaced by the pid. posix_spawn
// (glibc: CLONE_VM|CLONE_VFORK, safe in threaded Node) with stdin from
// /dev/null and stdout/stderr into a pipe, read for the error message; the
// helper is waited for by its own pid, as libuv reaps only its own children.
// On failure `what` says which helper failed and how, in its own words.
bool RunMapper(const std::vector<std::string>& argv_in, pid_t pid, std::string& what) {
  std::vector<std::string> argv = argv_in;
  argv[1] = std::to_string(pid);
  std::string cmdline;
  for (const std::string& a : argv) cmdline += (cmdline.empty() ? "" : " ") + a;
  std::vector<char*> ptrs;
  for (std::string& a : argv) ptrs.push_back(a.data());
  ptrs.push_back(nullptr);
  char* no_env[] = {nullptr};
  int out[2];
  if (pipe2(out, O_CLOEXEC) < 0) return what = ErrnoText("pipe2 for " + cmdline, errno), false;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  // Node blocks and handles signals of its own: the helper gets defaults.
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  pid_t helper = -1;
  int rc = posix_spawn(&helper, ptrs[0], &fa, &attr, ptrs.data(), no_env);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    return what = ErrnoText("running " + cmdline, rc), false;
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

// The parent's side before the child may run anything: the id maps of a
// new sandbox.
bool ReleaseChild(Napi::Env env, Prepared& p, pid_t pid, int pidfd, bool write_maps) {
  const Plan& plan = p.plan;
  auto abort_child = [&](const std::string& what, int e) {
    sys::pidfd_send_signal(pidfd, SIGKILL);
    siginfo_t si;
    waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &si, WEXITED);
    SysError(env, what, e).ThrowAsJavaScriptException();
    return false;
  };
  int e = 0;
  if (write_maps && (plan.namespaces & NS_USER)) {
    for (const auto* mapper : {&plan.uid_mapper, &plan.gid_mapper}) {
      std::string what;
      if (mapper->empty() || RunMapper(*mapper, pid, what)) continue;
      sys::pidfd_send_signal(pidfd, SIGKILL);
      siginfo_t si;
      waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &si, WEXITED);
      Napi::Error::New(env, "writing the sandbox's id maps: " + what).ThrowAsJavaScriptException();
      return false;
    }
    if (plan.deny_setgroups && !WriteProcFile(pid, "setgroups", "deny", e))
      return abort_child("writing the sandbox's setgroups", e);
    if (!plan.uid_map.empty() && !WriteProcFile(pid, "uid_map", plan.uid_map, e))
      return abort_child("writing the sandbox's uid_map '" + plan.uid_map + "'", e);
    if (!plan.gid_map.empty() && !WriteProcFile(pid, "gid_map", plan.gid_map, e))
      return abort_child("writing the sandbox's gid_map '" + plan.gid_map + "'", e);
  }
  char go = 1;
  if (write(p.sync[1], &go, 1) != 1) return abort_child("releasing the sandbox child", errno);
  return true;
}

long Clone(uint64_t flags, int* pidfd) {
  struct clone_args args;
  memset(&args, 0, sizeof args);
  args.flags = flags | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<uint64_t>(pidfd);
  args.exit_signal = SIGCHLD;
  return syscall(SYS_clone3, &args, sizeof args);
}

Napi::Object Result(Napi::Env env, Prepared& p, long pid, int pidfd) {
  Napi::Object result = Napi::Object::New(env);
  auto give = [&](const char* key, int fd) {
    if (fd >= 0) p.owned.Release(fd);
    result.Set(key, fd >= 0 ? Napi::Number::New(env, fd) : env.Null());
  };
  result.Set("pid", pid > 0 ? Napi::Number::New(env, static_cast<double>(pid)) : env.Null());
  Napi::Array fallbacks = Napi::Array::New(env, p.idmap_fallbacks.size());
  for (size_t i = 0; i < p.idmap_fallbacks.size(); i++) {
    Napi::Object f = Napi::Object::New(env);
    f.Set("op", Napi::Number::New(env, p.idmap_fallbacks[i].first));
    f.Set("errno", Napi::Number::New(env, p.idmap_fallbacks[i].second));
    fallbacks.Set(static_cast<uint32_t>(i), f);
  }
  result.Set("idmapFallbacks", fallbacks);
  give("pidfd", pidfd);
  give("errFd", p.err[0]);
  give("statusFd", p.status[0]);
  give("stdin", p.parent_ends[0]);
  give("stdout", p.parent_ends[1]);
  give("stderr", p.parent_ends[2]);
  give("ptySocket", p.pty_sock[0]);
  give("controlFd", p.control[1]);
  return result;  // sync and pid pipes close with `owned`
}

// Clones the child, which runs RunEnter (`enter`, joining the sandbox whose
// PID 1 is `target_pidfd`) or RunChild (a new sandbox), releases it once
// the parent's side is done, and returns the fds of the result.
Napi::Value CloneChild(Napi::Env env, Prepared& p, bool enter, int target_pidfd) {
  const Plan& plan = p.plan;
  // The mount namespace always: ReadPlan refuses a plan without it. A
  // command entering a sandbox joins its namespaces with setns() instead.
  uint64_t flags = enter ? 0 : NamespaceCloneFlags(plan.namespaces) | CLONE_NEWNS;
  ChildFds cfds{p.sync[0], p.sync[1], p.err[1], p.status[1], p.pty_sock[1], p.control[0], OwnerPidfd(), p.stack.top()};
  int pidfd = -1;
  // Every signal stays blocked across clone() so none is delivered to the
  // child through Node's handlers before it resets them.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  long pid = Clone(flags, &pidfd);
  if (pid == 0) {
    if (enter) RunEnter(plan, cfds, target_pidfd);
    RunChild(plan, cfds);
  }
  int clone_err = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) {
    std::string what = enter ? "clone3" : "clone3 (creating the sandbox's namespaces)" + CloneHint(clone_err);
    SysError(env, what, clone_err).ThrowAsJavaScriptException();
    return env.Undefined();
  }
  p.owned.Add(pidfd);
  if (!ReleaseChild(env, p, static_cast<pid_t>(pid), pidfd, !enter)) return env.Undefined();
  return Result(env, p, pid, pidfd);
}

// spawn(plan): a new sandbox.
Napi::Value Spawn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject()) {
    Napi::TypeError::New(env, "spawn(plan): plan must be an object").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Prepared p;
  if (!Prepare(env, info[0].As<Napi::Object>(), p, false) || !CloneSourcesInParent(env, p)) return env.Undefined();
  return CloneChild(env, p, false, -1);
}

// enter(targetPidfd, plan): a command in the sandbox whose PID 1 is target.
// The child joins the sandbox's namespaces and stays, as the command's
// monitor, outside its PID namespace (see RunEnter).
Napi::Value Enter(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsObject()) {
    Napi::TypeError::New(env, "enter(targetPidfd, plan)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Prepared p;
  if (!Prepare(env, info[1].As<Napi::Object>(), p, true)) return env.Undefined();
  return CloneChild(env, p, true, info[0].As<Napi::Number>().Int32Value());
}

// signal(pidfd, signo) -> true if delivered, false if the process is gone.
Napi::Value Signal(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsNumber()) {
    Napi::TypeError::New(env, "signal(pidfd, signo)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  int rc = sys::pidfd_send_signal(info[0].As<Napi::Number>().Int32Value(), info[1].As<Napi::Number>().Int32Value());
  if (rc < 0 && errno != ESRCH) {
    SysError(env, "pidfd_send_signal", errno).ThrowAsJavaScriptException();
    return env.Undefined();
  }
  return Napi::Boolean::New(env, rc == 0);
}

Napi::Value ResizePty(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 3 || !info[0].IsNumber() || !info[1].IsNumber() || !info[2].IsNumber()) {
    Napi::TypeError::New(env, "resizePty(fd, cols, rows)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  struct winsize ws{};
  ws.ws_col = info[1].As<Napi::Number>().Uint32Value();
  ws.ws_row = info[2].As<Napi::Number>().Uint32Value();
  if (ioctl(info[0].As<Napi::Number>().Int32Value(), TIOCSWINSZ, &ws) < 0) {
    SysError(env, "resizing the pseudo-terminal", errno).ThrowAsJavaScriptException();
  }
  return env.Undefined();
}

// prepareOps(ops) -> an opaque handle for plan.opsPrefix: ops read once and
// shared by every plan that names them (reading ~80 op objects through N-API
// costs more than the rest of a spawn).
Napi::Value PrepareOps(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto ops = std::make_shared<std::vector<MountOp>>();
  std::string error;
  if (info.Length() < 1 || !ReadOps(info[0], *ops, error)) {
    Napi::TypeError::New(env, error.empty() ? "prepareOps(ops)" : error).ThrowAsJavaScriptException();
    return env.Undefined();
  }
  return Napi::External<PreparedOps>::New(env, new PreparedOps(std::move(ops)), [](Napi::Env, PreparedOps* p) { delete p; });
}

// Where Node's argv and environment lie in its memory, for PID 1 to wipe
// them in its copy (fields 48-51 of /proc/self/stat, after the command name).
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

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  ReadHostArgArea();
  exports.Set("spawn", Napi::Function::New(env, Spawn, "spawn"));
  exports.Set("enter", Napi::Function::New(env, Enter, "enter"));
  exports.Set("prepareOps", Napi::Function::New(env, PrepareOps, "prepareOps"));
  exports.Set("signal", Napi::Function::New(env, Signal, "signal"));
  exports.Set("resizePty", Napi::Function::New(env, ResizePty, "resizePty"));
  exports.Set("watchExit", DefineExitWatch(env));
  exports.Set("receiveFd", DefineReceiveFd(env));

  Napi::Array steps = Napi::Array::New(env);
  for (int i = 0; i < static_cast<int>(Step::Count); i++) steps.Set(i, Napi::String::New(env, kStepNames[i]));
  exports.Set("stepNames", steps);
  exports.Set("killAllSignal", Napi::Number::New(env, kSignalKillAll));
  exports.Set("controlKillTree", Napi::Number::New(env, kControlKillTree));

  // The compiled architecture's syscall numbers, for seccomp filters built
  // in TypeScript.
  Napi::Object syscalls = Napi::Object::New(env);
  static const std::pair<const char*, int> kSyscalls[] = {
#include "syscall_names.inc"
  };
  for (const auto& [name, nr] : kSyscalls) syscalls.Set(name, Napi::Number::New(env, nr));
  exports.Set("syscalls", syscalls);
  exports.Set("errorRecordSize", Napi::Number::New(env, sizeof(ErrorRecord)));

  Napi::Object rl = Napi::Object::New(env);
  const std::pair<const char*, int> limits[] = {
      {"as", RLIMIT_AS},         {"core", RLIMIT_CORE},     {"cpu", RLIMIT_CPU},
      {"data", RLIMIT_DATA},     {"fsize", RLIMIT_FSIZE},   {"locks", RLIMIT_LOCKS},
      {"memlock", RLIMIT_MEMLOCK}, {"msgqueue", RLIMIT_MSGQUEUE}, {"nice", RLIMIT_NICE},
      {"nofile", RLIMIT_NOFILE}, {"nproc", RLIMIT_NPROC},   {"rss", RLIMIT_RSS},
      {"rtprio", RLIMIT_RTPRIO}, {"rttime", RLIMIT_RTTIME}, {"sigpending", RLIMIT_SIGPENDING},
      {"stack", RLIMIT_STACK},
  };
  for (const auto& [name, value] : limits) rl.Set(name, Napi::Number::New(env, value));
  exports.Set("rlimitResources", rl);
  return exports;
}

}  // namespace
}  // namespace msbx

static Napi::Object InitModule(Napi::Env env, Napi::Object exports) { return msbx::Init(env, exports); }
NODE_API_MODULE(minisandbox, InitModule)
