// The N-API surface: spawn a process into a new sandbox, watch its exit,
// signal it. Policy (what to mount, which defaults) lives in TypeScript;
// this file prepares the plan, clones, writes the id maps and returns fds.
#include <errno.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <pthread.h>
#include <signal.h>
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
#include <mutex>
#include <poll.h>
#include <sstream>
#include <string>
#include <vector>

#include <napi.h>

#include "child.h"
#include "spawn.h"
#include "wire.h"
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

Napi::Error SysError(Napi::Env env, const std::string& what, int err) {
  Napi::Error e = Napi::Error::New(env, ErrnoText(what, err));
  e.Set("errno", Napi::Number::New(env, err));
  const char* code = strerrorname_np(err);
  if (code) e.Set("code", Napi::String::New(env, code));
  return e;
}

// What Spawn and Enter share: the plan, the fds it asks for, the terminal
// socket and the pipes between parent and child.
struct Prepared {
  Plan plan;
  FdSet owned;       // parent ends, released into the result
  FdSet child_only;  // child ends, closed here once the child has its copies
  int parent_ends[3] = {-1, -1, -1};
  int pty_sock[2] = {-1, -1};
  int err[2] = {-1, -1}, status[2] = {-1, -1};
  int control[2] = {-1, -1};
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
  bool ok = pipe2(p.err, O_CLOEXEC) == 0 && pipe2(p.status, O_CLOEXEC) == 0;
  if (ok && enter) ok = pipe2(p.control, O_CLOEXEC) == 0;
  int e = errno;
  for (int fd : {p.err[0], p.status[0], p.control[1]}) p.owned.Add(fd);
  for (int fd : {p.err[1], p.status[1], p.control[0]}) p.child_only.Add(fd);
  if (!ok) {
    SysError(env, "pipe2", e).ThrowAsJavaScriptException();
    return false;
  }
  return true;
}

// The spawner (native/spawner.cc): a small process of our own that clones
// sandboxes for us, so that a clone never copies Node's page tables. Started
// on the first spawn that needs it, replaced when it has died. One socket,
// one request at a time: spawn() and enter() are synchronous calls that
// block the event loop for the clone as the in-process path always did, so
// there is never more than one request in flight from this thread (the
// mutex orders requests from worker threads). See docs/architecture.md,
// "The spawner".
struct SpawnerState {
  std::mutex mu;
  std::string path;  // the binary; empty: the in-process path
  std::string reason;  // why the in-process path, when it is
  std::string running;  // the binary of the spawner running now
  int sock = -1;
  pid_t pid = -1;
  int started = 0;  // spawners started so far (one, unless they died)
  // The host root's ops the running spawner keeps (wire.cc): a request with
  // the same ones names them instead of sending them again. Held here so
  // that no other prefix can take the same address.
  std::shared_ptr<const std::vector<MountOp>> spawner_prefix;
};
SpawnerState g_spawner;

// Closes our end and reaps the spawner; returns how it ended ("killed by
// signal 9"), for the error of a request it did not answer.
std::string RetireSpawner() {
  SpawnerState& s = g_spawner;
  if (s.sock >= 0) close(s.sock);
  s.sock = -1;
  s.spawner_prefix = nullptr;
  std::string how = "gone";
  if (s.pid > 0) {
    // It exits on EOF of its socket; SIGKILL makes sure a stuck one goes too.
    kill(s.pid, SIGKILL);
    int st = 0;
    pid_t r;
    do r = waitpid(s.pid, &st, 0); while (r < 0 && errno == EINTR);
    if (r == s.pid) how = WIFSIGNALED(st) ? "killed by signal " + std::to_string(WTERMSIG(st)) : "exited with " + std::to_string(WEXITSTATUS(st));
  }
  s.pid = -1;
  return how;
}

// Starts the spawner (SpawnHelper: no copy of Node's page tables, an empty
// environment, default signals) with its socket end as fd 3 and /dev/null
// for 0-2; then waits for its hello.
bool StartSpawner(SpawnReply& reply) {
  SpawnerState& s = g_spawner;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) return reply.what = "socketpair for the spawner", reply.err = errno, false;
  if (sv[1] == 3) {
    // dup2(3, 3) would leave FD_CLOEXEC set: move it out of the way first.
    int moved = fcntl(sv[1], F_DUPFD_CLOEXEC, 4);
    close(sv[1]);
    sv[1] = moved;
  }
  std::string owner = std::to_string(getpid());
  char name[] = "msbx-spawner";
  char* argv[] = {name, owner.data(), nullptr};
  pid_t pid = SpawnHelper(s.path.c_str(), argv,
                          {HelperFd::Open(0, "/dev/null", O_RDONLY), HelperFd::Open(1, "/dev/null", O_WRONLY),
                           HelperFd::Open(2, "/dev/null", O_WRONLY), HelperFd::Dup(sv[1], 3)});
  close(sv[1]);
  if (pid < 0) {
    close(sv[0]);
    return reply.what = "starting the sandbox spawner " + s.path, reply.err = -pid, false;
  }
  s.sock = sv[0];
  s.pid = pid;
  s.running = s.path;
  s.started++;
  // Its hello: it runs, speaks our protocol version, and is ready.
  struct pollfd p = {s.sock, POLLIN, 0};
  int n;
  do n = poll(&p, 1, 10000); while (n < 0 && errno == EINTR);
  wire::Kind kind;
  std::string payload;
  std::vector<int> fds;
  int got = n > 0 ? wire::Receive(s.sock, kind, payload, fds) : -1;
  int e = n == 0 ? ETIMEDOUT : errno;
  for (int fd : fds) close(fd);
  if (got != 1 || kind != wire::Kind::Hello) {
    std::string how = RetireSpawner();
    reply.what = "the sandbox spawner " + s.path + " did not start (" +
                 (got == 1 ? std::string("unexpected first message") : got == 0 ? "it " + how : ErrnoText("its hello", e == EPROTO ? EPROTO : e)) +
                 (e == EPROTO ? "; a spawner of another build? rebuild with npm run prebuilds or node-gyp rebuild" : "") + ")";
    return false;
  }
  return true;
}

// Runs the request in the spawner. A spawner found dead before the request
// is sent is replaced, and the request goes to the new one; a spawner that
// dies after taking it fails this request (it may have started a child,
// which died with it if it had dieWithParent) with an error saying so.
bool CallSpawner(SpawnRequest& rq, SpawnReply& reply) {
  SpawnerState& s = g_spawner;
  std::lock_guard<std::mutex> lock(s.mu);
  std::string payload;
  std::vector<int> fds;
  for (int attempt = 0;; attempt++) {
    if (s.sock >= 0) {
      // Idle, the socket has nothing to say: readable or hung up means the
      // spawner died since the last request.
      struct pollfd p = {s.sock, POLLIN, 0};
      if (poll(&p, 1, 0) > 0) RetireSpawner();
    }
    if (s.sock < 0 && !StartSpawner(reply)) return false;
    // Encoded for this spawner: a new one holds no prefix yet.
    rq.prefix_cached = rq.plan.prefix_ops && rq.plan.prefix_ops == s.spawner_prefix;
    payload.clear();
    fds.clear();
    wire::EncodeRequest(rq, payload, fds);
    if (rq.plan.prefix_ops) s.spawner_prefix = rq.plan.prefix_ops;
    if (wire::Send(s.sock, wire::Kind::Spawn, payload, fds)) break;
    int e = errno;
    RetireSpawner();
    if ((e != EPIPE && e != ECONNRESET) || attempt > 0) return reply.what = "sending the plan to the sandbox spawner", reply.err = e, false;
  }
  wire::Kind kind;
  std::string in;
  std::vector<int> got;
  pid_t spawner_pid = s.pid;
  int rc = wire::Receive(s.sock, kind, in, got);
  if (rc != 1 || kind != wire::Kind::Reply || !wire::DecodeReply(in, got, reply)) {
    int e = errno;
    for (int fd : got) close(fd);
    std::string how = RetireSpawner();
    reply = SpawnReply();
    reply.what = rc == 0 || (rc < 0 && (e == EPIPE || e == ECONNRESET))
                     ? "the sandbox spawner (msbx-spawner, pid " + std::to_string(spawner_pid) + ") died before it answered (" + how +
                           "); the next spawn starts a new one"
                     : "a malformed reply from the sandbox spawner (pid " + std::to_string(spawner_pid) + ")";
    reply.spawner_died = true;
    return false;
  }
  // The pidfd is the one fd a reply carries; anything else is closed.
  for (int fd : got)
    if (fd != reply.pidfd) close(fd);
  bool ok = reply.err == 0 && reply.what.empty();
  // The spawner drops its prefix after a request it could not read; after
  // any failure the next request carries it again.
  if (!ok) s.spawner_prefix = nullptr;
  return ok;
}

Napi::Object Result(Napi::Env env, Prepared& p, const SpawnReply& reply, bool via_spawner) {
  Napi::Object result = Napi::Object::New(env);
  auto give = [&](const char* key, int fd) {
    if (fd >= 0) p.owned.Release(fd);
    result.Set(key, fd >= 0 ? Napi::Number::New(env, fd) : env.Null());
  };
  result.Set("pid", reply.pid > 0 ? Napi::Number::New(env, static_cast<double>(reply.pid)) : env.Null());
  Napi::Array fallbacks = Napi::Array::New(env, reply.idmap_fallbacks.size());
  for (size_t i = 0; i < reply.idmap_fallbacks.size(); i++) {
    Napi::Object f = Napi::Object::New(env);
    f.Set("op", Napi::Number::New(env, reply.idmap_fallbacks[i].first));
    f.Set("errno", Napi::Number::New(env, reply.idmap_fallbacks[i].second));
    fallbacks.Set(static_cast<uint32_t>(i), f);
  }
  result.Set("idmapFallbacks", fallbacks);
  p.owned.Add(reply.pidfd);
  give("pidfd", reply.pidfd);
  give("errFd", p.err[0]);
  give("statusFd", p.status[0]);
  give("stdin", p.parent_ends[0]);
  give("stdout", p.parent_ends[1]);
  give("stderr", p.parent_ends[2]);
  give("ptySocket", p.pty_sock[0]);
  give("controlFd", p.control[1]);
  result.Set("viaSpawner", Napi::Boolean::New(env, via_spawner));
  return result;
}

// Clones the child, in the spawner or here, and returns the fds of the
// result; the child ends made by Prepare close with `p` either way.
Napi::Value Execute(Napi::Env env, Prepared& p, bool enter, int target_pidfd) {
  SpawnRequest rq;
  rq.plan = std::move(p.plan);
  rq.plan.finalize();
  rq.enter = enter;
  rq.target_pidfd = target_pidfd;
  rq.err_write = p.err[1];
  rq.status_write = p.status[1];
  rq.pty_socket = p.pty_sock[1];
  rq.control_read = p.control[0];
  SpawnReply reply;
  bool via_spawner;
  bool ok;
  {
    std::string path;
    {
      std::lock_guard<std::mutex> lock(g_spawner.mu);
      path = g_spawner.path;
    }
    via_spawner = !path.empty();
    // The plan's vectors hold the strings the child reads: finalize() was
    // called before the move, and a moved vector keeps its buffers.
    ok = via_spawner ? CallSpawner(rq, reply) : CloneSandbox(rq, reply);
  }
  if (!ok) {
    if (reply.err) {
      Napi::Error e = SysError(env, reply.what, reply.err);
      e.ThrowAsJavaScriptException();
    } else {
      Napi::Error e = Napi::Error::New(env, reply.what);
      if (reply.spawner_died) e.Set("code", Napi::String::New(env, "MSBX_SPAWNER"));
      e.ThrowAsJavaScriptException();
    }
    return env.Undefined();
  }
  return Result(env, p, reply, via_spawner);
}

// configureSpawner(path | null, reason?): which path spawns take from now
// on. A running spawner of another binary is retired (its sandboxes with
// dieWithParent die with it); switching to the in-process path keeps it,
// idle, for a switch back (the benchmark alternates the two).
Napi::Value ConfigureSpawner(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::lock_guard<std::mutex> lock(g_spawner.mu);
  std::string path = info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "";
  if (!path.empty() && path != g_spawner.running && g_spawner.sock >= 0) RetireSpawner();
  g_spawner.path = path;
  g_spawner.reason = info.Length() > 1 && info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "";
  return env.Undefined();
}

// spawnerInfo() -> { mode, path, pid, started, reason }.
Napi::Value SpawnerInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::lock_guard<std::mutex> lock(g_spawner.mu);
  Napi::Object o = Napi::Object::New(env);
  bool spawner = !g_spawner.path.empty();
  o.Set("mode", Napi::String::New(env, spawner ? "spawner" : "inprocess"));
  o.Set("path", spawner ? Napi::Value(Napi::String::New(env, g_spawner.path)) : env.Null());
  o.Set("pid", g_spawner.pid > 0 ? Napi::Value(Napi::Number::New(env, g_spawner.pid)) : env.Null());
  o.Set("started", Napi::Number::New(env, g_spawner.started));
  o.Set("reason", g_spawner.reason.empty() ? env.Null() : Napi::Value(Napi::String::New(env, g_spawner.reason)));
  return o;
}

// spawn(plan): a new sandbox.
Napi::Value Spawn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject()) {
    Napi::TypeError::New(env, "spawn(plan): plan must be an object").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Prepared p;
  if (!Prepare(env, info[0].As<Napi::Object>(), p, false)) return env.Undefined();
  return Execute(env, p, false, -1);
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
  return Execute(env, p, true, info[0].As<Napi::Number>().Int32Value());
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

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  ReadHostArgArea();
  exports.Set("spawn", Napi::Function::New(env, Spawn, "spawn"));
  exports.Set("enter", Napi::Function::New(env, Enter, "enter"));
  exports.Set("prepareOps", Napi::Function::New(env, PrepareOps, "prepareOps"));
  exports.Set("signal", Napi::Function::New(env, Signal, "signal"));
  exports.Set("resizePty", Napi::Function::New(env, ResizePty, "resizePty"));
  exports.Set("configureSpawner", Napi::Function::New(env, ConfigureSpawner, "configureSpawner"));
  exports.Set("spawnerInfo", Napi::Function::New(env, SpawnerInfo, "spawnerInfo"));
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
