// Observing a child's exit from the event loop: a pidfd becomes readable
// when its process exits, so one uv_poll per child replaces a blocked
// waiting thread per child.
#pragma once

#include <napi.h>

namespace msbx {

Napi::Function DefineExitWatch(Napi::Env env);

}  // namespace msbx
