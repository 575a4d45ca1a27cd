#include "watchers.h"

#include <sys/socket.h>

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

namespace msbx {
namespace {

struct Watch {
  uv_poll_t poll;
  int pidfd;
  int status_fd;  // PID 1's report of the main process's status, or -1
  Napi::FunctionReference callback;
  Napi::ObjectReference owner;
  bool done = false;
};

void OnClosed(uv_handle_t* h) { delete static_cast<Watch*>(h->data); }

void Finish(Watch* w, const siginfo_t& si) {
  w->done = true;
  uv_poll_stop(&w->poll);
  int code = -1, sig = 0;
  if (si.si_code == CLD_EXITED) code = si.si_status;
  else sig = si.si_status;
  // PID 1 writes the main process's wait status before it exits; it is
  // already dead here, so this read cannot block.
  bool from_init = false;
  if (w->status_fd >= 0) {
    int32_t st = 0;
    ssize_t n = read(w->status_fd, &st, sizeof st);
    if (n == sizeof st) {
      from_init = true;
      if (WIFEXITED(st)) code = WEXITSTATUS(st), sig = 0;
      else if (WIFSIGNALED(st)) code = -1, sig = WTERMSIG(st);
    }
    close(w->status_fd);
    w->status_fd = -1;
  }
  close(w->pidfd);
  w->pidfd = -1;

  Napi::Env env = w->callback.Env();
  Napi::HandleScope scope(env);
  Napi::Value code_v = code >= 0 ? Napi::Number::New(env, code) : env.Null();
  Napi::Value sig_v = sig ? Napi::Number::New(env, sig) : env.Null();
  Napi::Function cb = w->callback.Value();
  w->callback.Reset();
  if (!w->owner.IsEmpty()) w->owner.Value().Set("_watch", env.Null());
  w->owner.Reset();
  uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), OnClosed);
  cb.MakeCallback(env.Global(), {code_v, sig_v, Napi::Boolean::New(env, from_init)}, nullptr);
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
    Napi::TypeError::New(env, "watchExit(pidfd, statusFd, callback)").ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Watch* w = new Watch();
  w->pidfd = info[0].As<Napi::Number>().Int32Value();
  w->status_fd = info[1].As<Napi::Number>().Int32Value();
  w->callback = Napi::Persistent(info[2].As<Napi::Function>());
  w->poll.data = w;
  uv_loop_t* loop = nullptr;
  napi_get_uv_event_loop(env, &loop);
  int rc = uv_poll_init(loop, &w->poll, w->pidfd);
  if (rc == 0) rc = uv_poll_start(&w->poll, UV_READABLE, OnReadable);
  if (rc != 0) {
    delete w;
    Napi::Error::New(env, std::string("watching the sandbox's pidfd: ") + uv_strerror(rc))
        .ThrowAsJavaScriptException();
    return env.Undefined();
  }
  Napi::Object self = Napi::Object::New(env);
  self.Set("_watch", Napi::External<Watch>::New(env, w));
  self.Set("ref", Napi::Function::New(env, Ref, "ref"));
  self.Set("unref", Napi::Function::New(env, Unref, "unref"));
  w->owner = Napi::Persistent(self);
  return self;
}

// The loop stays alive while a sandbox runs, as with child_process; unref()
// lets a long-lived sandbox not hold the process open.
Napi::Value Ref(const Napi::CallbackInfo& info) {
  if (Watch* w = Get(info)) uv_ref(reinterpret_cast<uv_handle_t*>(&w->poll));
  return info.Env().Undefined();
}
Napi::Value Unref(const Napi::CallbackInfo& info) {
  if (Watch* w = Get(info)) uv_unref(reinterpret_cast<uv_handle_t*>(&w->poll));
  return info.Env().Undefined();
}

}  // namespace

Napi::Function DefineExitWatch(Napi::Env env) { return Napi::Function::New(env, WatchExit, "watchExit"); }

namespace {

struct Receive {
  uv_poll_t poll;
  int sock;
  Napi::FunctionReference callback;
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
  Napi::Env env = r->callback.Env();
  Napi::HandleScope scope(env);
  Napi::Function cb = r->callback.Value();
  r->callback.Reset();
  uv_close(reinterpret_cast<uv_handle_t*>(&r->poll), OnReceiveClosed);
  cb.MakeCallback(env.Global(), {err ? Napi::Number::New(env, err) : env.Null(), fd >= 0 ? Napi::Number::New(env, fd) : env.Null()}, nullptr);
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
  r->callback = Napi::Persistent(info[1].As<Napi::Function>());
  r->poll.data = r;
  uv_loop_t* loop = nullptr;
  napi_get_uv_event_loop(env, &loop);
  int rc = uv_poll_init(loop, &r->poll, r->sock);
  if (rc == 0) rc = uv_poll_start(&r->poll, UV_READABLE | UV_DISCONNECT, OnSocketReadable);
  if (rc != 0) {
    delete r;
    Napi::Error::New(env, std::string("watching the terminal socket: ") + uv_strerror(rc)).ThrowAsJavaScriptException();
  }
  return env.Undefined();
}

}  // namespace

Napi::Function DefineReceiveFd(Napi::Env env) { return Napi::Function::New(env, ReceiveFd, "receiveFd"); }

}  // namespace msbx
