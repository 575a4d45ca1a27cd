// The spawn plan: everything the child needs, prepared before the fork.
//
// The child runs between clone() and execve() in a copy of a multithreaded
// process, so it may not allocate, throw or touch V8. Every string it will
// use is built here, in the parent, and the child only reads it.
#pragma once

#include <sched.h>
#include <sys/mount.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace msbx {

// Mount-plan operations, executed in order inside the new root.
enum class OpKind : int32_t {
  Bind = 0,       // recursive bind of src (host path, or path in the new root) to dst
  Tmpfs = 1,      // fresh tmpfs at dst, options in `data` ("size=..,mode=..")
  Proc = 2,       // fresh procfs at dst
  Devpts = 3,     // private devpts instance at dst, options in `data`
  Mqueue = 4,     // POSIX message queue fs at dst
  Overlay = 5,    // overlay at dst: `lower` (host paths), optional upper/work
  Symlink = 6,    // symlink at dst pointing to `src` (text, not resolved)
  Mkdir = 7,      // directory at dst with `mode`
  WriteFile = 8,  // regular file at dst with `mode` and contents `data`
  Remount = 9,    // change flags of the mount already at dst (ro, nosuid...)
  MaskFile = 10,  // hide a file: bind an empty read-only file over it
  MaskDir = 11,   // hide a directory: read-only empty tmpfs over it
};

enum OpFlag : uint32_t {
  OP_READONLY = 1u << 0,
  OP_NOSUID = 1u << 1,
  OP_NODEV = 1u << 2,
  OP_NOEXEC = 1u << 3,
  OP_SRC_IN_ROOT = 1u << 4,  // bind source resolved inside the new root
  OP_OPTIONAL = 1u << 5,     // a missing source or target is not an error
  OP_USERXATTR = 1u << 6,    // overlay: user.overlay.* xattrs (user namespaces)
  // The parent clones the host sources (bind source; overlay lowers and
  // upper base) before the fork: a root caller's sandbox runs as an
  // unprivileged host id, which cannot traverse root's directories.
  OP_CLONE_IN_PARENT = 1u << 7,
  // ... and shows them through the sandbox's id mapping, so that root's
  // files look like root's inside (bind source, overlay lowers)...
  OP_IDMAP = 1u << 8,
  OP_UPPER_IDMAP = 1u << 9,  // ... and the overlay's upper base too
  // Overlay: the upper and work dirs live on a fresh tmpfs (options in
  // `data`) made for this overlay alone, instead of a host directory: a
  // one-shot sandbox's writable root, gone with its mount namespace.
  OP_UPPER_TMPFS = 1u << 10,
};

// The mount attributes (MOUNT_ATTR_*) an op's flags ask for.
inline uint64_t MountAttrs(uint32_t flags) {
  uint64_t a = 0;
  if (flags & OP_READONLY) a |= MOUNT_ATTR_RDONLY;
  if (flags & OP_NOSUID) a |= MOUNT_ATTR_NOSUID;
  if (flags & OP_NODEV) a |= MOUNT_ATTR_NODEV;
  if (flags & OP_NOEXEC) a |= MOUNT_ATTR_NOEXEC;
  return a;
}

struct MountOp {
  OpKind kind = OpKind::Mkdir;
  uint32_t flags = 0;
  uint32_t mode = 0755;
  std::string src;   // host path (already absolute, resolved under the old root)
  std::string dst;   // absolute path inside the new root
  std::string data;  // fs options or file contents
  // Overlay: host paths of the lower layers (highest first), and of the one
  // directory holding upper and work (overlayfs wants both on one mount),
  // with upper and work relative to it.
  std::vector<std::string> lowers;
  std::string upper_base, upper, work;
};

enum NsFlag : uint32_t {
  NS_USER = 1u << 0,
  NS_MOUNT = 1u << 1,
  NS_PID = 1u << 2,
  NS_IPC = 1u << 3,
  NS_UTS = 1u << 4,
  NS_NET = 1u << 5,
  NS_CGROUP = 1u << 6,
};

// CLONE_NEW* flags for a set of NsFlag bits: what clone3() creates for a
// new sandbox, and what setns() joins for a command in a running one.
inline uint64_t NamespaceCloneFlags(uint32_t ns) {
  uint64_t flags = 0;
  if (ns & NS_USER) flags |= CLONE_NEWUSER;
  if (ns & NS_MOUNT) flags |= CLONE_NEWNS;
  if (ns & NS_PID) flags |= CLONE_NEWPID;
  if (ns & NS_IPC) flags |= CLONE_NEWIPC;
  if (ns & NS_UTS) flags |= CLONE_NEWUTS;
  if (ns & NS_NET) flags |= CLONE_NEWNET;
  if (ns & NS_CGROUP) flags |= CLONE_NEWCGROUP;
  return flags;
}

struct Rlimit {
  int resource;
  uint64_t soft;
  uint64_t hard;
};

// A child fd wired to a parent-provided fd (dup2(src, target)).
struct FdMapping {
  int target;
  int source;  // kPtySlave: the terminal the child allocates itself
};
constexpr int kPtySlave = -2;

// A standard stream of the command as the plan asks for it; the addon makes
// the pipe or opens /dev/null just before the clone.
struct Stdio {
  enum class Kind { Pipe, Null, Pty, Fd };
  Kind kind = Kind::Null;
  int fd = -1;  // Kind::Fd: the caller's open fd, inherited
};

struct Plan {
  uint32_t namespaces = 0;
  std::string uid_map;      // written by the parent to /proc/<pid>/uid_map
  std::string gid_map;
  // Instead of uid_map/gid_map: the setuid helpers (newuidmap, newgidmap)
  // that write maps of ids an unprivileged caller may not write itself
  // (its /etc/subuid range). argv as TypeScript built it; the parent puts
  // the child's pid in argv[1] and runs them before releasing the child.
  std::vector<std::string> uid_mapper;
  std::vector<std::string> gid_mapper;
  bool deny_setgroups = true;
  // The ids every process of the sandbox takes first, once the maps are
  // written: a root caller is unmapped in its own sandbox until it takes the
  // root of the range it is mapped to.
  bool init_ids = false;
  uint32_t init_uid = 0, init_gid = 0;
  std::string hostname;
  bool pivot = true;        // false: chroot fallback (documented as weaker)
  bool root_readonly = false;
  // Ops read once and reused by many plans (the host root), run before `ops`.
  std::shared_ptr<const std::vector<MountOp>> prefix_ops;
  std::vector<MountOp> ops;

  // The process.
  std::vector<std::string> argv;
  std::vector<std::string> env;
  std::vector<std::string> exec_candidates;  // argv[0] resolved against PATH
  std::string cwd;
  uint32_t uid = 0, gid = 0;  // inside the sandbox
  bool set_ids = false;
  bool no_new_privs = true;
  uint64_t keep_caps = 0;     // bit mask of capabilities kept, 0 = drop all
  bool new_session = true;
  bool die_with_parent = true;
  bool pty = false;            // a new terminal, allocated in the sandbox's devpts
  uint16_t pty_cols = 80, pty_rows = 24;
  std::vector<Rlimit> rlimits;
  Stdio stdio[3];              // fds 0-2; none with `hold`
  // Sorted by target: the plan's extra fds (3-255), then the addon puts
  // the standard streams (0-2) in front.
  std::vector<FdMapping> fds;

  // A classic BPF program (struct sock_filter[]) installed as the last step
  // before execve; empty: none.
  std::string seccomp;

  // A persistent sandbox: PID 1 holds the namespaces and starts nothing;
  // commands join later with Enter().
  bool hold = false;
  // cgroup.procs files of the sandbox's limits. The parent opens them; the
  // command writes "0" to each before it runs anything of the user's, so
  // every process of the sandbox is counted from birth, and the sandbox's
  // own PID 1 and monitors (copies of Node) are never its OOM victims.
  std::vector<std::string> cgroup_procs;
  std::vector<int> cgroup_fds;
  // Per spawn: the sources the parent cloned (OP_CLONE_IN_PARENT), in op order
  // (a bind: 1; an overlay: each lower, then the upper base). A negative
  // entry is -errno of a source that could not be cloned.
  std::vector<int> source_fds;

  // Pointers into the strings above, built last (vectors must not move).
  std::vector<char*> argv_ptrs;
  std::vector<char*> env_ptrs;
  void finalize();
};

}  // namespace msbx
