// The N-API surface: spawn a process into a new sandbox, watch its exit,
// signal it. Policy (what to mount, which defaults) lives in TypeScript;
// this file prepares the plan, clones, writes the id maps and returns fds.
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
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

// stdio entry: "pipe" | "null" | "pty" | fd number to inherit.
// Fills the child's source fd and, for pipes, the parent's end.
bool WireStdio(Napi::Env env, Napi::Value spec, int target, bool pty, FdSet& owned, FdSet& child_only,
               Plan& plan, int& parent_end, std::string& error) {
  parent_end = -1;
  int source = -1;
  if (spec.IsNumber()) {
    source = spec.As<Napi::Number>().Int32Value();
    if (fcntl(source, F_GETFD) < 0) return error = "stdio[" + std::to_string(target) + "]: fd " + std::to_string(source) + " is not open", false;
  } else if (spec.IsString()) {
    std::string s = spec.As<Napi::String>().Utf8Value();
    if (s == "pipe") {
      int p[2];
      if (pipe2(p, O_CLOEXEC) < 0) return error = ErrnoText("pipe2", errno), false;
      bool in = target == 0;
      parent_end = owned.Add(in ? p[1] : p[0]);
      source = child_only.Add(in ? p[0] : p[1]);
    } else if (s == "null") {
      source = child_only.Add(open("/dev/null", O_RDWR | O_CLOEXEC));
      if (source < 0) return error = ErrnoText("open /dev/null", errno), false;
    } else if (s == "pty") {
      if (!pty) return error = "stdio 'pty' needs plan.pty", false;
      source = kPtySlave;
    } else {
      return error = "stdio[" + std::to_string(target) + "]: unknown value '" + s + "'", false;
    }
  } else {
    return error = "stdio entries must be 'pipe', 'null', 'pty' or an fd number", false;
  }
  (void)env;
  plan.fds.push_back({target, source});
  return true;
}

Napi::Value Spawn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject()) {
    Napi::TypeError::New(env, "spawn(plan): plan must be an object").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Napi::Object obj = info[0].As<Napi::Object>();
  Plan plan;
  std::string error;
  if (!ReadPlan(obj, plan, error)) {
    Napi::TypeError::New(env, error).ThrowAsJavaScriptException();
    return env.Undefined();
  }

  FdSet owned;       // parent ends, released into the result
  FdSet child_only;  // child ends, closed in the parent after clone

  // The terminal is allocated by the child inside the sandbox's own devpts
  // and its master comes back over this socket.
  int pty_sock[2] = {-1, -1};
  if (plan.pty) {
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pty_sock) < 0) {
      SysError(env, "socketpair for the terminal", errno).ThrowAsJavaScriptException();
      return env.Undefined();
    }
    owned.Add(pty_sock[0]);
    child_only.Add(pty_sock[1]);
    Napi::Object p = obj.Get("pty").As<Napi::Object>();
    if (p.Get("cols").IsNumber()) plan.pty_cols = static_cast<uint16_t>(p.Get("cols").As<Napi::Number>().Uint32Value());
    if (p.Get("rows").IsNumber()) plan.pty_rows = static_cast<uint16_t>(p.Get("rows").As<Napi::Number>().Uint32Value());
  }

  Napi::Value stdio_v = obj.Get("stdio");
  if (!stdio_v.IsArray() || stdio_v.As<Napi::Array>().Length() != 3) {
    Napi::TypeError::New(env, "plan.stdio must be an array of three entries").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Napi::Array stdio = stdio_v.As<Napi::Array>();
  int parent_ends[3];
  for (int i = 0; i < 3; i++) {
    if (!WireStdio(env, stdio.Get(i), i, plan.pty, owned, child_only, plan, parent_ends[i], error)) {
      Napi::TypeError::New(env, error).ThrowAsJavaScriptException();
      return env.Undefined();
    }
  }
  Napi::Value extra = obj.Get("extraFds");
  if (extra.IsArray()) {
    Napi::Array a = extra.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); i++) {
      Napi::Value e = a.Get(i);
      if (!e.IsObject() || !e.As<Napi::Object>().Get("target").IsNumber() || !e.As<Napi::Object>().Get("fd").IsNumber()) {
        Napi::TypeError::New(env, "plan.extraFds entries need numeric target and fd").ThrowAsJavaScriptException();
        return env.Undefined();
      }
      int target = e.As<Napi::Object>().Get("target").As<Napi::Number>().Int32Value();
      int fd = e.As<Napi::Object>().Get("fd").As<Napi::Number>().Int32Value();
      if (target < 3 || target > 255 || fcntl(fd, F_GETFD) < 0) {
        Napi::TypeError::New(env, "plan.extraFds: target must be 3..255 and fd open").ThrowAsJavaScriptException();
        return env.Undefined();
      }
      plan.fds.push_back({target, fd});
    }
  }
  std::sort(plan.fds.begin(), plan.fds.end(), [](const FdMapping& a, const FdMapping& b) { return a.target < b.target; });
  for (size_t i = 1; i < plan.fds.size(); i++) {
    if (plan.fds[i].target == plan.fds[i - 1].target) {
      Napi::TypeError::New(env, "plan: fd " + std::to_string(plan.fds[i].target) + " is wired twice").ThrowAsJavaScriptException();
      return env.Undefined();
    }
  }
  plan.finalize();

  int sync[2], err[2], status[2];
  if (pipe2(sync, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0 || pipe2(status, O_CLOEXEC) < 0) {
    SysError(env, "pipe2", errno).ThrowAsJavaScriptException();
    return env.Undefined();
  }
  owned.Add(sync[1]);
  owned.Add(err[0]);
  owned.Add(status[0]);
  child_only.Add(sync[0]);
  child_only.Add(err[1]);
  child_only.Add(status[1]);

  uint64_t flags = CLONE_NEWNS | CLONE_PIDFD;
  if (plan.namespaces & NS_USER) flags |= CLONE_NEWUSER;
  if (plan.namespaces & NS_PID) flags |= CLONE_NEWPID;
  if (plan.namespaces & NS_IPC) flags |= CLONE_NEWIPC;
  if (plan.namespaces & NS_UTS) flags |= CLONE_NEWUTS;
  if (plan.namespaces & NS_NET) flags |= CLONE_NEWNET;
  if (plan.namespaces & NS_CGROUP) flags |= CLONE_NEWCGROUP;

  int pidfd = -1;
  struct clone_args args;
  memset(&args, 0, sizeof args);
  args.flags = flags;
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  args.exit_signal = SIGCHLD;

  ChildFds cfds{sync[0], sync[1], err[1], status[1], pty_sock[1]};

  // Every signal stays blocked across clone() so none is delivered to the
  // child through Node's handlers before it resets them.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  long pid = syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) RunChild(plan, cfds);
  int clone_err = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) {
    SysError(env, "clone3 (creating the sandbox's namespaces)" + CloneHint(clone_err), clone_err)
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  owned.Add(pidfd);

  auto abort_child = [&](const std::string& what, int e) {
    sys::pidfd_send_signal(pidfd, SIGKILL);
    siginfo_t si;
    waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), &si, WEXITED);
    SysError(env, what, e).ThrowAsJavaScriptException();
    return env.Undefined();
  };

  // The parent writes the id maps: only it may map more than its own id
  // (when privileged), and the child must not run unmapped code meanwhile.
  if (plan.namespaces & NS_USER) {
    int e = 0;
    if (plan.deny_setgroups && !WriteProcFile(static_cast<pid_t>(pid), "setgroups", "deny", e))
      return abort_child("writing the sandbox's setgroups", e);
    if (!plan.uid_map.empty() && !WriteProcFile(static_cast<pid_t>(pid), "uid_map", plan.uid_map, e))
      return abort_child("writing the sandbox's uid_map '" + plan.uid_map + "'", e);
    if (!plan.gid_map.empty() && !WriteProcFile(static_cast<pid_t>(pid), "gid_map", plan.gid_map, e))
      return abort_child("writing the sandbox's gid_map '" + plan.gid_map + "'", e);
  }
  char go = 1;
  if (write(sync[1], &go, 1) != 1) return abort_child("releasing the sandbox child", errno);

  Napi::Object result = Napi::Object::New(env);
  auto give = [&](const char* key, int fd) {
    if (fd >= 0) owned.Release(fd);
    result.Set(key, fd >= 0 ? Napi::Number::New(env, fd) : env.Null());
  };
  result.Set("pid", Napi::Number::New(env, static_cast<double>(pid)));
  give("pidfd", pidfd);
  give("errFd", err[0]);
  give("statusFd", status[0]);
  give("stdin", parent_ends[0]);
  give("stdout", parent_ends[1]);
  give("stderr", parent_ends[2]);
  give("ptySocket", pty_sock[0]);
  return result;  // sync[1] closes with `owned`; the child has read its byte
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

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("spawn", Napi::Function::New(env, Spawn, "spawn"));
  exports.Set("signal", Napi::Function::New(env, Signal, "signal"));
  exports.Set("resizePty", Napi::Function::New(env, ResizePty, "resizePty"));
  exports.Set("watchExit", DefineExitWatch(env));
  exports.Set("receiveFd", DefineReceiveFd(env));

  Napi::Array steps = Napi::Array::New(env);
  for (int i = 0; i < static_cast<int>(Step::Count); i++) steps.Set(i, Napi::String::New(env, kStepNames[i]));
  exports.Set("stepNames", steps);
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
