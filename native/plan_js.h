// Reading a Plan from its JavaScript description.
#pragma once

#include <napi.h>

#include <string>

#include "plan.h"

namespace msbx {

// Fills `plan` from `obj`, the only place that reads it; on a malformed
// object returns false with `error` naming the field. The caller then makes
// what the plan asks for: pipes, /dev/null, the terminal's socket.
bool ReadPlan(const Napi::Object& obj, Plan& plan, std::string& error);

// Reads an array of mount ops (for prepareOps: read once, reused by plans).
bool ReadOps(const Napi::Value& ops, std::vector<MountOp>& out, std::string& error);

// The handle prepareOps() returns to JavaScript.
using PreparedOps = std::shared_ptr<const std::vector<MountOp>>;

}  // namespace msbx
