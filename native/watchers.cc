#include "watchers.h"

#include <sys/socket.h>

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

namespace msbx {
namespace {

// Calls back into JavaScript from a libuv callback, with raw N-API only:
// at environment teardown JavaScript can no longer run, and the wrappers
// would turn the failing calls into a fatal error. Here they just do nothing.
// Takes (and releases) the reference to the callback.
struct Arg {
  enum Kind { Null, Number, Bool } kind;
  double value;
};

void CallBack(napi_env env, napi_ref& cb_ref, std::initializer_list<Arg> args) {
  napi_ref ref = cb_ref;
  cb_ref = nullptr;
  if (!ref) return;
  napi_handle_scope scope;
  if (napi_open_handle_scope(env, &scope) != napi_ok) return;
  napi_value cb, global, argv[4], result;
  size_t argc = 0;
  bool ok = napi_get_reference_value(env, ref, &cb) == napi_ok && cb && napi_get_global(env, &global) == napi_ok;
  for (const Arg& a : args) {
    if (!ok || argc >= 4) break;
    if (a.kind == Arg::Null) ok = napi_get_null(env, &argv[argc]) == napi_ok;
    else if (a.kind == Arg::Bool) ok = napi_get_boolean(env, a.value != 0, &argv[argc]) == napi_ok;
    else ok = napi_create_double(env, a.value, &argv[argc]) == napi_ok;
    argc++;
  }
  if (ok) {
    napi_make_callback(env, nullptr, global, cb, argc, argv, &result);
    bool pending = false;
    if (napi_is_exception_pending(env, &pending) == napi_ok && pending) {
      napi_value ex;
      napi_get_and_clear_last_exception(env, &ex);
      napi_fatal_exception(env, ex);  // thrown by the callback: surfaces as uncaught
    }
  }
  napi_delete_reference(env, ref);
  napi_close_handle_scope(env, scope);
}

struct Watch {
  uv_poll_t poll;         // the pidfd: readable once the process has exited
  uv_poll_t status_poll;  // the status pipe, when PID 1 reports for a main process
  int pidfd;
  int status_fd;  // PID 1's report of the main process's status, or -1
  // The process is the spawner's child, not ours: waitid() cannot reap it
  // (ECHILD), so `poll` watches the status pipe instead of the pidfd. The
  // first record there is the main process's status (from PID 1 or the
  // monitor) or, if it died without one, its own wait status, which the
  // spawner writes when it reaps it; EOF follows once it is reaped.
  bool via_spawner = false;
  napi_env env;
  napi_ref callback = nullptr;
  bool reported = false;  // the callback has run
  bool done = false;      // the process is reaped
  // Owned by each uv handle until closed and by the JavaScript object's
  // External: freed when all let go, so ref()/unref() after exit stay safe.
  int owners = 2;
};

void Release(Watch* w) {
  if (--w->owners == 0) delete w;
}

void OnClosed(uv_handle_t* h) { Release(static_cast<Watch*>(h->data)); }

void Report(Watch* w, int code, int sig, bool from_init) {
  if (w->reported) return;
  w->reported = true;
  napi_env env = w->env;
  napi_ref callback = w->callback;
  w->callback = nullptr;
  Arg code_a = code >= 0 ? Arg{Arg::Number, static_cast<double>(code)} : Arg{Arg::Null, 0};
  Arg sig_a = sig ? Arg{Arg::Number, static_cast<double>(sig)} : Arg{Arg::Null, 0};
  CallBack(env, callback, {code_a, sig_a, Arg{Arg::Bool, from_init ? 1.0 : 0.0}});
}

// Reads PID 1's 4-byte report of the main process's wait status, if there.
bool ReadStatus(Watch* w, int& code, int& sig) {
  if (w->status_fd < 0) return false;
  int32_t st = 0;
  ssize_t n = read(w->status_fd, &st, sizeof st);
  if (n != sizeof st) return false;
  if (WIFEXITED(st)) code = WEXITSTATUS(st), sig = 0;
  else if (WIFSIGNALED(st)) code = -1, sig = WTERMSIG(st);
  return true;
}

void StopStatusPoll(Watch* w) {
  if (w->status_fd < 0) return;
  uv_poll_stop(&w->status_poll);
  uv_close(reinterpret_cast<uv_handle_t*>(&w->status_poll), OnClosed);
  close(w->status_fd);
  w->status_fd = -1;
}

// The main process's status arrives as soon as it exits: the result is
// known then, while PID 1 still tears the namespaces down (about a
// millisecond); the pidfd poll reaps PID 1 afterwards without delaying it.
void OnStatusReadable(uv_poll_t* handle, int, int) {
  Watch* w = static_cast<Watch*>(handle->data);
  int code = -1, sig = 0;
  bool got = ReadStatus(w, code, sig);
  StopStatusPoll(w);  // a report, or EOF: PID 1 died without one
  if (got) {
    // Nothing else keeps Node alive for a sandbox whose command is done.
    uv_unref(reinterpret_cast<uv_handle_t*>(&w->poll));
    Report(w, code, sig, true);
  }
}

void Finish(Watch* w, const siginfo_t& si) {
  w->done = true;
  uv_poll_stop(&w->poll);
  int code = -1, sig = 0;
  if (si.si_code == CLD_EXITED) code = si.si_status;
  else sig = si.si_status;
  // PID 1 writes the main process's status before it exits; it is dead
  // here, so this read cannot block.
  bool from_init = ReadStatus(w, code, sig);
  StopStatusPoll(w);
  close(w->pidfd);
  w->pidfd = -1;
  uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), OnClosed);
  Report(w, code, sig, from_init);
}

void OnReadable(uv_poll_t* handle, int status, int) {
  Watch* w = static_cast<Watch*>(handle->data);
  if (w->done) return;
  siginfo_t si{};
  int rc = waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(w->pidfd), &si, WEXITED | WNOHANG);
  if (rc < 0 || si.si_pid == 0) {
    if (status < 0 || (rc < 0 && errno != EINTR)) {
      // Reaped elsewhere or the poll broke: report an unknown exit.
      siginfo_t unknown{};
      unknown.si_code = CLD_KILLED;
      unknown.si_status = SIGKILL;
      Finish(w, unknown);
    }
    return;
  }
  Finish(w, si);
}

// Spawner mode: the status pipe, until EOF.
void OnSpawnerStatus(uv_poll_t* handle, int status, int) {
  Watch* w = static_cast<Watch*>(handle->data);
  if (w->done) return;
  int code = -1, sig = 0;
  int32_t st = 0;
  ssize_t n = status < 0 ? 0 : read(w->status_fd, &st, sizeof st);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n == static_cast<ssize_t>(sizeof st)) {
    if (WIFEXITED(st)) code = WEXITSTATUS(st);
    else if (WIFSIGNALED(st)) sig = WTERMSIG(st);
    // Nothing else keeps Node alive for a sandbox whose command is done;
    // the poll stays until EOF to close the fds once the process is reaped.
    uv_unref(reinterpret_cast<uv_handle_t*>(&w->poll));
    Report(w, code, sig, true);
    return;
  }
  // EOF (or a broken pipe): the process is gone and reaped. Without any
  // record (the spawner died with it) the exit is unknown: reported as a
  // kill, as a process reaped elsewhere is.
  w->done = true;
  uv_poll_stop(&w->poll);
  close(w->status_fd);
  w->status_fd = -1;
  close(w->pidfd);
  w->pidfd = -1;
  uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), OnClosed);
  Report(w, -1, SIGKILL, false);
}

Watch* Get(const Napi::CallbackInfo& info) {
  Napi::Value ext = info.This().As<Napi::Object>().Get("_watch");
  if (!ext.IsExternal()) return nullptr;
  return ext.As<Napi::External<Watch>>().Data();
}

Napi::Value Ref(const Napi::CallbackInfo& info);
Napi::Value Unref(const Napi::CallbackInfo& info);

// watchExit(pidfd, statusFd, callback(exitCode, signal, fromInit)) -> { ref(), unref() }
Napi::Value WatchExit(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 3 || !info[0].IsNumber() || !info[1].IsNumber() ||
      !info[2].IsFunction()) {
    Napi::TypeError::New(env, "watchExit(pidfd, statusFd, callback, viaSpawner?)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Watch* w = new Watch();
  w->pidfd = info[0].As<Napi::Number>().Int32Value();
  w->status_fd = info[1].As<Napi::Number>().Int32Value();
  w->via_spawner = info.Length() > 3 && info[3].IsBoolean() && info[3].As<Napi::Boolean>().Value();
  w->env = env;
  napi_create_reference(env, info[2], 1, &w->callback);
  w->poll.data = w;
  uv_loop_t* loop = nullptr;
  napi_get_uv_event_loop(env, &loop);
  int rc = uv_poll_init(loop, &w->poll, w->via_spawner ? w->status_fd : w->pidfd);
  if (rc == 0) rc = w->via_spawner ? uv_poll_start(&w->poll, UV_READABLE | UV_DISCONNECT, OnSpawnerStatus)
                                   : uv_poll_start(&w->poll, UV_READABLE, OnReadable);
  if (rc != 0) {
    napi_delete_reference(env, w->callback);
    delete w;
    Napi::Error::New(env, std::string("watching the sandbox's pidfd: ") + uv_strerror(rc))
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  if (w->status_fd >= 0 && !w->via_spawner) {
    w->status_poll.data = w;
    if (uv_poll_init(loop, &w->status_poll, w->status_fd) == 0) {
      w->owners++;
      // Not keeping the loop alive on its own: the pidfd poll does that.
      uv_unref(reinterpret_cast<uv_handle_t*>(&w->status_poll));
      uv_poll_start(&w->status_poll, UV_READABLE | UV_DISCONNECT, OnStatusReadable);
    } else {
      close(w->status_fd);  // the pidfd path still reports, without the status
      w->status_fd = -1;
    }
  }
  Napi::Object self = Napi::Object::New(env);
  self.Set("_watch", Napi::External<Watch>::New(env, w, [](Napi::Env, Watch* data) { Release(data); }));
  self.Set("ref", Napi::Function::New(env, Ref, "ref"));
  self.Set("unref", Napi::Function::New(env, Unref, "unref"));
  return self;
}

// The loop stays alive while a sandbox runs, as with child_process; unref()
// lets a long-lived sandbox not hold the process open.
Napi::Value Ref(const Napi::CallbackInfo& info) {
  Watch* w = Get(info);
  if (w && !w->done && !w->reported) uv_ref(reinterpret_cast<uv_handle_t*>(&w->poll));
  return info.Env().Undefined();
}
Napi::Value Unref(const Napi::CallbackInfo& info) {
  Watch* w = Get(info);
  if (w && !w->done) uv_unref(reinterpret_cast<uv_handle_t*>(&w->poll));
  return info.Env().Undefined();
}

}  // namespace

Napi::Function DefineExitWatch(Napi::Env env) { return Napi::Function::New(env, WatchExit, "watchExit"); }

namespace {

struct Receive {
  uv_poll_t poll;
  int sock;
  napi_env env;
  napi_ref callback = nullptr;
};

void OnReceiveClosed(uv_handle_t* h) {
  Receive* r = static_cast<Receive*>(h->data);
  close(r->sock);
  delete r;
}

void OnSocketReadable(uv_poll_t* handle, int status, int) {
  Receive* r = static_cast<Receive*>(handle->data);
  int fd = -1, err = 0;
  if (status < 0) {
    err = EIO;
  } else {
    char byte;
    struct iovec iov = {&byte, 1};
    union {
      char buf[CMSG_SPACE(sizeof(int))];
      struct cmsghdr align;
    } ctl;
    struct msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof ctl.buf;
    ssize_t n = recvmsg(r->sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    struct cmsghdr* cm = n > 0 ? CMSG_FIRSTHDR(&msg) : nullptr;
    if (cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    else err = n < 0 ? errno : EPIPE;  // EOF: setup failed before the terminal existed
  }
  uv_poll_stop(&r->poll);
  napi_env env = r->env;
  napi_ref callback = r->callback;
  r->callback = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(&r->poll), OnReceiveClosed);
  Arg err_a = err ? Arg{Arg::Number, static_cast<double>(err)} : Arg{Arg::Null, 0};
  Arg fd_a = fd >= 0 ? Arg{Arg::Number, static_cast<double>(fd)} : Arg{Arg::Null, 0};
  CallBack(env, callback, {err_a, fd_a});
}

// receiveFd(socketFd, callback(errno | null, fd | null)); takes ownership of socketFd.
Napi::Value ReceiveFd(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsNumber() || !info[1].IsFunction()) {
    Napi::TypeError::New(env, "receiveFd(socketFd, callback)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Receive* r = new Receive();
  r->sock = info[0].As<Napi::Number>().Int32Value();
  r->env = env;
  napi_create_reference(env, info[1], 1, &r->callback);
  r->poll.data = r;
  uv_loop_t* loop = nullptr;
  napi_get_uv_event_loop(env, &loop);
  int rc = uv_poll_init(loop, &r->poll, r->sock);
  if (rc == 0) rc = uv_poll_start(&r->poll, UV_READABLE | UV_DISCONNECT, OnSocketReadable);
  if (rc != 0) {
    napi_delete_reference(env, r->callback);
    delete r;
    Napi::Error::New(env, std::string("watching the terminal socket: ") + uv_strerror(rc)).ThrowAsJavaScriptException();
  }
  return env.Undefined();
}

}  // namespace

Napi::Function DefineReceiveFd(Napi::Env env) { return Napi::Function::New(env, ReceiveFd, "receiveFd"); }

}  // namespace msbx
