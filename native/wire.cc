// Encoding of spawn requests and replies (see wire.h). One Visit per
// message walks its fields for both directions (Out encodes, In decodes), so
// encoder and decoder cannot drift apart: a field is added in one place.
#include "wire.h"

#include <errno.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <type_traits>

namespace msbx::wire {
namespace {

// int fields (fds, targets, errnos) go on the wire as int32_t as they are.
static_assert(std::is_same_v<int, int32_t>);

struct Out {
  std::string& buf;
  std::vector<int>& fds;
  static constexpr bool kDecoding = false;
  bool ok = true;
  void Raw(const void* p, size_t n) { buf.append(static_cast<const char*>(p), n); }
  void U32(uint32_t& v) { Raw(&v, 4); }
  void U64(uint64_t& v) { Raw(&v, 8); }
  void I32(int32_t& v) { Raw(&v, 4); }
  void Bool(bool& v) {
    uint32_t x = v;
    U32(x);
  }
  void Str(std::string& s) {
    uint64_t n = s.size();
    U64(n);
    Raw(s.data(), s.size());
  }
  // An fd of ours: its index in `fds`; a negative value (none, kPtySlave,
  // -errno of a source) as it is.
  void Fd(int& fd) {
    int32_t v = fd;
    if (fd >= 0) {
      v = static_cast<int32_t>(fds.size());
      fds.push_back(fd);
    }
    I32(v);
  }
  template <class T, class F>
  void List(std::vector<T>& v, F each) {
    uint32_t n = static_cast<uint32_t>(v.size());
    U32(n);
    for (T& x : v) each(x);
  }
};

struct In {
  const char* p;
  const char* end;
  const std::vector<int>& fds;
  static constexpr bool kDecoding = true;
  bool ok = true;
  void Raw(void* dst, size_t n) {
    if (!ok || static_cast<size_t>(end - p) < n) {
      ok = false;
      return;
    }
    memcpy(dst, p, n);
    p += n;
  }
  void U32(uint32_t& v) { Raw(&v, 4); }
  void U64(uint64_t& v) { Raw(&v, 8); }
  void I32(int32_t& v) { Raw(&v, 4); }
  void Bool(bool& v) {
    uint32_t x = 0;
    U32(x);
    v = x != 0;
  }
  void Str(std::string& s) {
    uint64_t n = 0;
    U64(n);
    if (!ok || static_cast<uint64_t>(end - p) < n) {
      ok = false;
      return;
    }
    s.assign(p, n);
    p += n;
  }
  void Fd(int& fd) {
    int32_t v = -1;
    I32(v);
    if (v >= 0 && static_cast<size_t>(v) >= fds.size()) ok = false;
    fd = v >= 0 && ok ? fds[static_cast<size_t>(v)] : v;
  }
  template <class T, class F>
  void List(std::vector<T>& v, F each) {
    uint32_t n = 0;
    U32(n);
    // Every element takes at least 4 bytes: a count past the buffer is garbage.
    if (!ok || n > static_cast<size_t>(end - p) / 4 + 1) {
      ok = false;
      return;
    }
    v.resize(n);
    for (T& x : v) {
      if (!ok) return;
      each(x);
    }
  }
};

// A field held in memory as another type than the one on the wire (an enum,
// a uint16_t, a long), converted each way.
template <class Wire, class V, class T>
void As(V& v, T& field) {
  Wire x = static_cast<Wire>(field);
  if constexpr (std::is_same_v<Wire, uint32_t>) v.U32(x);
  else if constexpr (std::is_same_v<Wire, uint64_t>) v.U64(x);
  else {
    static_assert(std::is_same_v<Wire, int32_t>, "on the wire: uint32_t, uint64_t or int32_t");
    v.I32(x);
  }
  if constexpr (V::kDecoding) field = static_cast<T>(x);
}

template <class V>
void VisitStrs(V& v, std::vector<std::string>& list) {
  v.List(list, [&](std::string& s) { v.Str(s); });
}

template <class V>
void VisitOps(V& v, std::vector<MountOp>& ops) {
  v.List(ops, [&](MountOp& m) {
    As<int32_t>(v, m.kind);
    v.U32(m.flags);
    v.U32(m.mode);
    v.Str(m.src);
    v.Str(m.dst);
    v.Str(m.data);
    VisitStrs(v, m.lowers);
    v.Str(m.upper_base);
    v.Str(m.upper);
    v.Str(m.work);
  });
}

// Every field of the request the spawner's side reads (CloneSandbox and the
// child). Not sent: plan.stdio (the addon has turned it into plan.fds),
// plan.source_fds (made by the spawner), the argv/env pointers (finalize()).
template <class V>
void Visit(V& v, SpawnRequest& rq) {
  Plan& p = rq.plan;
  v.Bool(rq.enter);
  v.Fd(rq.target_pidfd);
  v.Fd(rq.err_write);
  v.Fd(rq.status_write);
  v.Fd(rq.pty_socket);
  v.Fd(rq.control_read);
  v.U32(p.namespaces);
  v.Str(p.uid_map);
  v.Str(p.gid_map);
  VisitStrs(v, p.uid_mapper);
  VisitStrs(v, p.gid_mapper);
  v.Bool(p.deny_setgroups);
  v.Bool(p.init_ids);
  v.U32(p.init_uid);
  v.U32(p.init_gid);
  v.Str(p.hostname);
  v.Bool(p.pivot);
  v.Bool(p.root_readonly);
  // The shared prefix (the host root's ops, with its copies of /etc files,
  // the bulk of a request) travels only when it is not the one the spawner
  // kept from the request before: sending, decoding and freeing it again
  // made every spawn pay for the whole host root. The decoder leaves a
  // cached prefix unset; the spawner fills it in.
  bool has_prefix = p.prefix_ops != nullptr || rq.prefix_cached;
  v.Bool(has_prefix);
  if (has_prefix) v.Bool(rq.prefix_cached);
  if (has_prefix && !rq.prefix_cached) {
    if constexpr (V::kDecoding) {
      auto ops = std::make_shared<std::vector<MountOp>>();
      VisitOps(v, *ops);
      p.prefix_ops = ops;
    } else {
      VisitOps(v, const_cast<std::vector<MountOp>&>(*p.prefix_ops));
    }
  }
  VisitOps(v, p.ops);
  VisitStrs(v, p.argv);
  VisitStrs(v, p.env);
  VisitStrs(v, p.exec_candidates);
  v.Str(p.cwd);
  v.U32(p.uid);
  v.U32(p.gid);
  v.Bool(p.set_ids);
  v.Bool(p.no_new_privs);
  v.U64(p.keep_caps);
  v.Bool(p.new_session);
  v.Bool(p.die_with_parent);
  v.Bool(p.pty);
  As<uint32_t>(v, p.pty_cols);
  As<uint32_t>(v, p.pty_rows);
  v.List(p.rlimits, [&](Rlimit& r) {
    v.I32(r.resource);
    v.U64(r.soft);
    v.U64(r.hard);
  });
  v.List(p.fds, [&](FdMapping& f) {
    v.I32(f.target);
    v.Fd(f.source);
  });
  v.Str(p.seccomp);
  v.Bool(p.hold);
  VisitStrs(v, p.cgroup_procs);
  v.List(p.cgroup_fds, [&](int& fd) { v.Fd(fd); });
}

// The reply: the child's pid and pidfd, or the failing step.
template <class V>
void Visit(V& v, SpawnReply& r) {
  As<uint64_t>(v, r.pid);
  v.Fd(r.pidfd);
  v.List(r.idmap_fallbacks, [&](std::pair<int, int>& f) {
    v.I32(f.first);
    v.I32(f.second);
  });
  v.I32(r.err);
  v.Str(r.what);
}

// The encoder only reads `msg`; Visit takes it non-const for the decoder.
template <class Message>
void Encode(const Message& msg, std::string& out, std::vector<int>& fds) {
  Out o{out, fds};
  Visit(o, const_cast<Message&>(msg));
}

// False on a malformed buffer: short, or with bytes left over.
template <class Message>
bool Decode(const std::string& in, const std::vector<int>& fds, Message& msg) {
  In i{in.data(), in.data() + in.size(), fds};
  Visit(i, msg);
  return i.ok && i.p == i.end;
}

}  // namespace

void EncodeRequest(const SpawnRequest& rq, std::string& out, std::vector<int>& fds) { Encode(rq, out, fds); }

bool DecodeRequest(const std::string& in, const std::vector<int>& fds, SpawnRequest& rq, std::string& error) {
  if (!Decode(in, fds, rq)) return error = "malformed spawn request", false;
  if (rq.plan.fds.size() > 64) return error = "too many fds in the spawn request", false;
  rq.plan.finalize();
  return true;
}

void EncodeReply(const SpawnReply& reply, std::string& out, std::vector<int>& fds) { Encode(reply, out, fds); }

bool DecodeReply(const std::string& in, const std::vector<int>& fds, SpawnReply& reply) { return Decode(in, fds, reply); }

namespace {

struct FdList {
  std::vector<int> values;
};

template <class V>
void Visit(V& v, FdList& l) {
  v.List(l.values, [&](int& fd) { v.Fd(fd); });
}

}  // namespace

void EncodeFds(const std::vector<int>& values, std::string& out, std::vector<int>& fds) { Encode(FdList{values}, out, fds); }

bool DecodeFds(const std::string& in, const std::vector<int>& fds, std::vector<int>& values) {
  FdList l;
  if (!Decode(in, fds, l)) return false;
  values = std::move(l.values);
  return true;
}

namespace {

bool WriteAll(int sock, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = send(sock, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

union FdControl {
  char buf[CMSG_SPACE(sizeof(int) * kMaxFds)];
  struct cmsghdr align;
};

}  // namespace

bool Send(int sock, Kind kind, const std::string& payload, const std::vector<int>& fds) {
  if (fds.size() > kMaxFds) return errno = EMFILE, false;
  Header h{kMagic, kVersion, static_cast<uint32_t>(kind), static_cast<uint32_t>(fds.size()), payload.size()};
  struct iovec iov = {&h, sizeof h};
  struct msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  FdControl ctl;
  if (!fds.empty()) {
    memset(&ctl, 0, sizeof ctl);
    msg.msg_control = ctl.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do n = sendmsg(sock, &msg, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
  if (n < 0) return false;
  // The fds went with the first byte; the rest of the header, if the socket
  // took only part of it, and the payload follow as plain bytes.
  const char* hp = reinterpret_cast<const char*>(&h);
  return WriteAll(sock, hp + n, sizeof h - static_cast<size_t>(n)) && WriteAll(sock, payload.data(), payload.size());
}

int Receive(int sock, Kind& kind, std::string& payload, std::vector<int>& fds) {
  Header h;
  char* hp = reinterpret_cast<char*>(&h);
  size_t got = 0;
  fds.clear();
  bool truncated = false;
  while (got < sizeof h) {
    struct iovec iov = {hp + got, sizeof h - got};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    FdControl ctl;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof ctl.buf;
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return -1;
    for (struct cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
        fds.push_back(fd);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) truncated = true;
    if (n == 0) {
      for (int fd : fds) close(fd);
      fds.clear();
      if (got == 0) return 0;
      errno = EPIPE;  // EOF inside a header: the peer died mid-message
      return -1;
    }
    got += static_cast<size_t>(n);
  }
  auto bad = [&](int err) {
    for (int fd : fds) close(fd);
    fds.clear();
    errno = err;
    return -1;
  };
  if (truncated || h.magic != kMagic || h.version != kVersion || h.nfds != fds.size() || h.length > (1ull << 30))
    return bad(EPROTO);
  kind = static_cast<Kind>(h.kind);
  payload.resize(h.length);
  for (size_t off = 0; off < h.length;) {
    ssize_t n = recv(sock, payload.data() + off, h.length - off, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return bad(n == 0 ? EPIPE : errno);
    off += static_cast<size_t>(n);
  }
  return 1;
}

}  // namespace msbx::wire
