// Turns the JavaScript plan object into a Plan. Validation of meaning (which
// paths, which defaults) belongs to the TypeScript side; this file checks
// only shapes and types, so a malformed object is a TypeError, never a crash.
#include "plan_js.h"

#include <fcntl.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace msbx {

namespace {

// Reads fields of one object, naming them under `prefix` in its errors
// ("plan.", "plan.pty."); keeps the first error.
struct Reader {
  std::string prefix;
  std::string error;

  bool Fail(const std::string& what) {
    if (error.empty()) error = what;
    return false;
  }

  std::string Name(const char* key) const { return prefix + key; }

  bool Str(const Napi::Object& o, const char* key, std::string& out, bool required) {
    Napi::Value v = o.Get(key);
    if (v.IsUndefined() || v.IsNull()) return required ? Fail(Name(key) + " is required") : true;
    if (!v.IsString()) return Fail(Name(key) + " must be a string");
    out = v.As<Napi::String>().Utf8Value();
    if (out.find('\0') != std::string::npos) return Fail(Name(key) + " contains a NUL byte");
    return true;
  }

  bool Bool(const Napi::Object& o, const char* key, bool& out) {
    Napi::Value v = o.Get(key);
    if (v.IsUndefined()) return true;
    if (!v.IsBoolean()) return Fail(Name(key) + " must be a boolean");
    out = v.As<Napi::Boolean>().Value();
    return true;
  }

  // An integer from `min` to `max`, optional unless `required`.
  bool Int(const Napi::Object& o, const char* key, int64_t min, int64_t max, int64_t& out, bool required = false) {
    Napi::Value v = o.Get(key);
    if (v.IsUndefined() && !required) return true;
    if (v.IsNumber()) {
      double d = v.As<Napi::Number>().DoubleValue();
      if (d >= static_cast<double>(min) && d <= static_cast<double>(max) && d == std::trunc(d)) {
        out = static_cast<int64_t>(d);
        return true;
      }
    }
    return Fail(Name(key) + " must be an integer from " + std::to_string(min) + " to " + std::to_string(max));
  }

  bool U32(const Napi::Object& o, const char* key, uint32_t& out) {
    int64_t v = out;
    if (!Int(o, key, 0, UINT32_MAX, v)) return false;
    out = static_cast<uint32_t>(v);
    return true;
  }

  // An optional { uid, gid } object; `set` tells whether it was there.
  bool Ids(const Napi::Object& o, const char* key, uint32_t& uid, uint32_t& gid, bool& set) {
    Napi::Value v = o.Get(key);
    if (v.IsUndefined()) return true;
    if (!v.IsObject()) return Fail(Name(key) + " must be { uid, gid }");
    Napi::Object ids = v.As<Napi::Object>();
    set = true;
    Reader r{Name(key) + ".", {}};
    return (r.U32(ids, "uid", uid) && r.U32(ids, "gid", gid)) || Fail(r.error);
  }

  bool StrList(const Napi::Object& o, const char* key, std::vector<std::string>& out) {
    Napi::Value v = o.Get(key);
    if (v.IsUndefined()) return true;
    if (!v.IsArray()) return Fail(Name(key) + " must be an array of strings");
    Napi::Array a = v.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); i++) {
      Napi::Value e = a.Get(i);
      if (!e.IsString()) return Fail(Name(key) + " must be an array of strings");
      std::string s = e.As<Napi::String>().Utf8Value();
      if (s.find('\0') != std::string::npos) return Fail(Name(key) + " has a NUL byte");
      out.push_back(std::move(s));
    }
    return true;
  }
};

struct KindName {
  const char* name;
  OpKind kind;
};
const KindName kKinds[] = {
    {"bind", OpKind::Bind},         {"tmpfs", OpKind::Tmpfs},         {"proc", OpKind::Proc},
    {"devpts", OpKind::Devpts},     {"mqueue", OpKind::Mqueue},       {"overlay", OpKind::Overlay},
    {"symlink", OpKind::Symlink},   {"mkdir", OpKind::Mkdir},         {"write-file", OpKind::WriteFile},
    {"remount", OpKind::Remount},   {"mask-file", OpKind::MaskFile},  {"mask-dir", OpKind::MaskDir},
};

bool ReadOp(Reader& r, const Napi::Object& o, MountOp& m) {
  std::string kind;
  if (!r.Str(o, "kind", kind, true)) return false;
  bool found = false;
  for (const auto& k : kKinds) {
    if (kind == k.name) {
      m.kind = k.kind;
      found = true;
    }
  }
  if (!found) return r.Fail("unknown mount op kind '" + kind + "'");
  if (!r.Str(o, "dst", m.dst, true)) return false;
  if (m.dst.empty() || m.dst[0] != '/') return r.Fail("mount op dst must be absolute: '" + m.dst + "'");
  if (!r.Str(o, "src", m.src, false)) return false;
  // File contents may be binary (ld.so.cache): a Buffer is taken byte for byte.
  Napi::Value data = o.Get("data");
  if (data.IsBuffer()) {
    Napi::Buffer<char> b = data.As<Napi::Buffer<char>>();
    m.data.assign(b.Data(), b.Length());
  } else if (!r.Str(o, "data", m.data, false)) {
    return false;
  }
  if (!r.U32(o, "mode", m.mode)) return false;
  bool ro = false, nosuid = false, nodev = false, noexec = false, in_root = false, optional = false,
       userxattr = false, in_parent = false, idmap = false, upper_idmap = false, upper_tmpfs = false;
  if (!r.Bool(o, "readOnly", ro) || !r.Bool(o, "nosuid", nosuid) || !r.Bool(o, "nodev", nodev) ||
      !r.Bool(o, "noexec", noexec) || !r.Bool(o, "srcInRoot", in_root) || !r.Bool(o, "optional", optional) ||
      !r.Bool(o, "userxattr", userxattr) || !r.Bool(o, "cloneInParent", in_parent) || !r.Bool(o, "idmap", idmap) ||
      !r.Bool(o, "upperIdmap", upper_idmap) || !r.Bool(o, "upperTmpfs", upper_tmpfs))
    return false;
  const std::pair<bool, uint32_t> bits[] = {
      {ro, OP_READONLY},         {nosuid, OP_NOSUID},     {nodev, OP_NODEV},        {noexec, OP_NOEXEC},
      {in_root, OP_SRC_IN_ROOT}, {optional, OP_OPTIONAL}, {userxattr, OP_USERXATTR}, {in_parent, OP_CLONE_IN_PARENT},
      {idmap, OP_IDMAP},         {upper_idmap, OP_UPPER_IDMAP}, {upper_tmpfs, OP_UPPER_TMPFS},
  };
  m.flags = 0;
  for (const auto& [on, bit] : bits) m.flags |= on ? bit : 0u;
  if (m.kind == OpKind::Bind && (m.src.empty() || m.src[0] != '/'))
    return r.Fail("bind src must be absolute: '" + m.src + "'");
  if (m.kind == OpKind::Symlink && m.src.empty()) return r.Fail("symlink needs src (the link text)");
  if ((m.flags & (OP_IDMAP | OP_UPPER_IDMAP)) && !(m.flags & OP_CLONE_IN_PARENT))
    return r.Fail("idmap needs cloneInParent");
  if ((m.flags & OP_CLONE_IN_PARENT) && m.kind != OpKind::Bind && m.kind != OpKind::Overlay)
    return r.Fail("cloneInParent applies to bind and overlay ops only");
  if ((m.flags & OP_CLONE_IN_PARENT) && (m.flags & OP_SRC_IN_ROOT))
    return r.Fail("cloneInParent applies to host sources only");
  if (m.kind == OpKind::Overlay) {
    if (!r.StrList(o, "lower", m.lowers)) return false;
    if (m.lowers.empty()) return r.Fail("overlay needs at least one lower dir");
    for (const std::string& l : m.lowers) {
      if (l.empty() || l[0] != '/') return r.Fail("overlay lower dirs must be absolute");
    }
    if (!r.Str(o, "upperBase", m.upper_base, false) || !r.Str(o, "upper", m.upper, false) ||
        !r.Str(o, "work", m.work, false))
      return false;
    if (m.flags & OP_UPPER_TMPFS) {
      if (!m.upper_base.empty()) return r.Fail("overlay upperTmpfs and upperBase exclude each other");
      if (m.flags & OP_UPPER_IDMAP) return r.Fail("overlay upperTmpfs cannot be idmapped");
      // Fixed names on the overlay's own tmpfs.
      m.upper = "upper";
      m.work = "work";
    } else if (m.upper.empty() != m.work.empty() || m.upper.empty() != m.upper_base.empty()) {
      return r.Fail("overlay upperBase, upper and work go together");
    }
    if (!m.upper_base.empty()) {
      if (m.upper_base[0] != '/') return r.Fail("overlay upperBase must be absolute");
      // Relative to upperBase, without '..': they must stay on its mount.
      for (const std::string* rel : {&m.upper, &m.work}) {
        if ((*rel)[0] == '/' || rel->find("..") != std::string::npos || rel->find(':') != std::string::npos ||
            rel->find(',') != std::string::npos)
          return r.Fail("overlay upper and work must be plain paths relative to upperBase");
      }
    }
  }
  return true;
}

struct NsName {
  const char* name;
  uint32_t flag;
};
const NsName kNamespaces[] = {
    {"user", NS_USER}, {"mount", NS_MOUNT}, {"pid", NS_PID}, {"ipc", NS_IPC},
    {"uts", NS_UTS},   {"net", NS_NET},     {"cgroup", NS_CGROUP},
};

// plan.pty: { cols, rows } of a terminal the child allocates.
bool ReadPty(Reader& r, const Napi::Object& o, Plan& plan) {
  Napi::Value v = o.Get("pty");
  if (v.IsUndefined()) return true;
  if (!v.IsObject()) return r.Fail("plan.pty must be { cols, rows }");
  plan.pty = true;
  Reader size{"plan.pty.", {}};
  int64_t cols = plan.pty_cols, rows = plan.pty_rows;
  if (!size.Int(v.As<Napi::Object>(), "cols", 0, UINT16_MAX, cols) ||
      !size.Int(v.As<Napi::Object>(), "rows", 0, UINT16_MAX, rows))
    return r.Fail(size.error);
  plan.pty_cols = static_cast<uint16_t>(cols);
  plan.pty_rows = static_cast<uint16_t>(rows);
  return true;
}

bool IsOpenFd(int64_t fd) { return fcntl(static_cast<int>(fd), F_GETFD) >= 0; }

// plan.stdio: for fds 0-2, "pipe", "null", "pty" (needs plan.pty) or an
// open fd of the caller's, inherited.
bool ReadStdio(Reader& r, const Napi::Object& o, Plan& plan) {
  Napi::Value v = o.Get("stdio");
  if (!v.IsArray() || v.As<Napi::Array>().Length() != 3) return r.Fail("plan.stdio must be an array of three entries");
  Napi::Array a = v.As<Napi::Array>();
  for (uint32_t i = 0; i < 3; i++) {
    std::string name = "plan.stdio[" + std::to_string(i) + "]";
    Napi::Value e = a.Get(i);
    Stdio& s = plan.stdio[i];
    if (e.IsString()) {
      std::string kind = e.As<Napi::String>().Utf8Value();
      if (kind == "pipe") s.kind = Stdio::Kind::Pipe;
      else if (kind == "null") s.kind = Stdio::Kind::Null;
      else if (kind == "pty") s.kind = Stdio::Kind::Pty;
      else return r.Fail(name + ": unknown value '" + kind + "'");
      if (s.kind == Stdio::Kind::Pty && !plan.pty) return r.Fail(name + ": 'pty' needs plan.pty");
      continue;
    }
    double d = e.IsNumber() ? e.As<Napi::Number>().DoubleValue() : -1;
    if (!(d >= 0 && d <= INT32_MAX && d == std::trunc(d)))
      return r.Fail(name + " must be 'pipe', 'null', 'pty' or an fd number");
    s.kind = Stdio::Kind::Fd;
    s.fd = static_cast<int>(d);
    if (!IsOpenFd(s.fd)) return r.Fail(name + ": fd " + std::to_string(s.fd) + " is not open");
  }
  return true;
}

// plan.extraFds: open fds of the caller's, each wired to a target from 3 to
// 255 (the child moves its own fds above those while it rewires).
bool ReadExtraFds(Reader& r, const Napi::Object& o, Plan& plan) {
  Napi::Value v = o.Get("extraFds");
  if (v.IsUndefined()) return true;
  if (!v.IsArray()) return r.Fail("plan.extraFds must be an array of { target, fd }");
  Napi::Array a = v.As<Napi::Array>();
  for (uint32_t i = 0; i < a.Length(); i++) {
    std::string name = "plan.extraFds[" + std::to_string(i) + "]";
    if (!a.Get(i).IsObject()) return r.Fail(name + " must be { target, fd }");
    Napi::Object e = a.Get(i).As<Napi::Object>();
    Reader f{name + ".", {}};
    int64_t target = 0, fd = 0;
    if (!f.Int(e, "target", 3, 255, target, true) || !f.Int(e, "fd", 0, INT32_MAX, fd, true)) return r.Fail(f.error);
    if (!IsOpenFd(fd)) return r.Fail(name + ": fd " + std::to_string(fd) + " is not open");
    plan.fds.push_back({static_cast<int>(target), static_cast<int>(fd)});
  }
  std::sort(plan.fds.begin(), plan.fds.end(), [](const FdMapping& a, const FdMapping& b) { return a.target < b.target; });
  for (size_t i = 1; i < plan.fds.size(); i++) {
    if (plan.fds[i].target == plan.fds[i - 1].target)
      return r.Fail("plan.extraFds: fd " + std::to_string(plan.fds[i].target) + " is wired twice");
  }
  return true;
}

}  // namespace

bool ReadOps(const Napi::Value& ops, std::vector<MountOp>& out, std::string& error) {
  if (!ops.IsArray()) return error = "plan.ops must be an array", false;
  Reader r;
  Napi::Array a = ops.As<Napi::Array>();
  for (uint32_t i = 0; i < a.Length(); i++) {
    if (!a.Get(i).IsObject()) return error = "plan.ops entries must be objects", false;
    MountOp m;
    if (!ReadOp(r, a.Get(i).As<Napi::Object>(), m)) return error = "plan.ops[" + std::to_string(i) + "]: " + r.error, false;
    out.push_back(std::move(m));
  }
  return true;
}

bool ReadPlan(const Napi::Object& o, Plan& plan, std::string& error) {
  Reader r{"plan.", {}};
  std::vector<std::string> ns;
  if (!r.StrList(o, "namespaces", ns)) return error = r.error, false;
  for (const auto& n : ns) {
    bool found = false;
    for (const auto& k : kNamespaces) {
      if (n == k.name) {
        plan.namespaces |= k.flag;
        found = true;
      }
    }
    if (!found) return error = "unknown namespace '" + n + "'", false;
  }
  if (!(plan.namespaces & NS_MOUNT)) return error = "the mount namespace is required", false;

  bool ok = r.Str(o, "uidMap", plan.uid_map, false) && r.Str(o, "gidMap", plan.gid_map, false) &&
            r.Bool(o, "denySetgroups", plan.deny_setgroups) && r.Str(o, "hostname", plan.hostname, false) &&
            r.Bool(o, "pivot", plan.pivot) && r.Bool(o, "rootReadOnly", plan.root_readonly) &&
            r.StrList(o, "argv", plan.argv) && r.StrList(o, "env", plan.env) &&
            r.StrList(o, "execCandidates", plan.exec_candidates) && r.Str(o, "cwd", plan.cwd, true) &&
            r.Bool(o, "noNewPrivs", plan.no_new_privs) && r.Bool(o, "newSession", plan.new_session) &&
            r.Bool(o, "dieWithParent", plan.die_with_parent) && r.Bool(o, "hold", plan.hold) &&
            r.StrList(o, "cgroupProcs", plan.cgroup_procs) && r.StrList(o, "uidMapper", plan.uid_mapper) &&
            r.StrList(o, "gidMapper", plan.gid_mapper);
  if (!ok) return error = r.error, false;
  for (const auto* mapper : {&plan.uid_mapper, &plan.gid_mapper}) {
    if (mapper->empty()) continue;
    if (mapper->size() < 2 || (*mapper)[0].empty() || (*mapper)[0][0] != '/')
      return error = "plan.uidMapper/gidMapper must be [absolute helper path, pid slot, map...]", false;
  }
  if (!plan.uid_mapper.empty() && !plan.uid_map.empty()) return error = "plan.uidMap and plan.uidMapper exclude each other", false;
  if (!plan.gid_mapper.empty() && !plan.gid_map.empty()) return error = "plan.gidMap and plan.gidMapper exclude each other", false;
  if (!plan.hold && plan.argv.empty()) return error = "plan.argv must not be empty", false;
  if (!plan.hold && plan.exec_candidates.empty()) return error = "plan.execCandidates must not be empty", false;

  if (!r.Ids(o, "initUser", plan.init_uid, plan.init_gid, plan.init_ids) ||
      !r.Ids(o, "user", plan.uid, plan.gid, plan.set_ids))
    return error = r.error, false;

  Napi::Value filter = o.Get("seccomp");
  if (filter.IsBuffer()) {
    Napi::Buffer<char> b = filter.As<Napi::Buffer<char>>();
    // struct sock_filter is 8 bytes; the kernel takes at most 4096 of them.
    if (b.Length() == 0 || b.Length() % 8 != 0 || b.Length() > 4096 * 8)
      return error = "plan.seccomp must hold 1 to 4096 BPF instructions of 8 bytes", false;
    plan.seccomp.assign(b.Data(), b.Length());
  } else if (!filter.IsUndefined()) {
    return error = "plan.seccomp must be a Buffer", false;
  }

  Napi::Value caps = o.Get("keepCaps");
  if (caps.IsArray()) {
    Napi::Array a = caps.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); i++) {
      Napi::Value c = a.Get(i);
      if (!c.IsNumber()) return error = "plan.keepCaps must hold capability numbers", false;
      int n = c.As<Napi::Number>().Int32Value();
      if (n < 0 || n > 63) return error = "plan.keepCaps: capability out of range", false;
      plan.keep_caps |= 1ull << n;
    }
  }

  Napi::Value rl = o.Get("rlimits");
  if (rl.IsArray()) {
    Napi::Array a = rl.As<Napi::Array>();
    for (uint32_t i = 0; i < a.Length(); i++) {
      if (!a.Get(i).IsObject()) return error = "plan.rlimits entries must be objects", false;
      Napi::Object e = a.Get(i).As<Napi::Object>();
      Rlimit lim{};
      Napi::Value res = e.Get("resource"), soft = e.Get("soft"), hard = e.Get("hard");
      if (!res.IsNumber() || !soft.IsNumber() || !hard.IsNumber())
        return error = "plan.rlimits entries need numeric resource, soft and hard", false;
      lim.resource = res.As<Napi::Number>().Int32Value();
      double s = soft.As<Napi::Number>().DoubleValue(), h = hard.As<Napi::Number>().DoubleValue();
      lim.soft = s < 0 ? RLIM_INFINITY : static_cast<uint64_t>(s);
      lim.hard = h < 0 ? RLIM_INFINITY : static_cast<uint64_t>(h);
      plan.rlimits.push_back(lim);
    }
  }

  Napi::Value prefix = o.Get("opsPrefix");
  if (prefix.IsExternal()) plan.prefix_ops = *prefix.As<Napi::External<PreparedOps>>().Data();
  else if (!prefix.IsUndefined()) return error = "plan.opsPrefix must come from prepareOps()", false;
  if (!ReadOps(o.Get("ops"), plan.ops, error)) return false;

  if (!ReadPty(r, o, plan) || (!plan.hold && !ReadStdio(r, o, plan)) || !ReadExtraFds(r, o, plan))
    return error = r.error, false;
  return true;
}

}  // namespace msbx
