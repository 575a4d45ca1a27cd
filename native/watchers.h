// Watchers on the event loop: no thread ever blocks on a sandbox.
// - watchExit: a pidfd becomes readable when its process exits, so one
//   uv_poll per child replaces a blocked waiting thread per child.
// - receiveFd: the child sends the terminal it allocated over a socket.
#pragma once

#include <napi.h>

namespace msbx {

Napi::Function DefineExitWatch(Napi::Env env);
Napi::Function DefineReceiveFd(Napi::Env env);

}  // namespace msbx
