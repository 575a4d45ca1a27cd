// The child side of a spawn.
//
// Everything here runs in a clone of Node, a multithreaded process: other
// threads may have held malloc or stdio locks at the moment of the clone, so
// this file calls only raw, async-signal-safe syscalls on memory prepared by
// the parent (see plan.h). No allocation, no exceptions, no C++ library
// calls that might allocate. Every failure is reported to the parent as an
// ErrorRecord naming the step, the errno and the plan op.
//
// The order follows bubblewrap's: propagation first, then a base tmpfs that
// becomes the root so the host root can be kept at /oldroot while the new
// root is assembled, then the mount plan, then the old root is detached and
// the new root pivoted in, then the process itself is set up.

#include "child.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/openat2.h>
#include <net/if.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <dirent.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <grp.h>

#include <climits>

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif
#include <cstring>

#include "sys.h"

namespace msbx {

const char* const kStepNames[] = {
    "wait-parent",     "signal-reset",  "hostname",      "loopback",
    "propagation",     "base-tmpfs",    "pivot-to-base", "open-old-root",
    "new-root-mount",  "op-source",     "op-target",     "op-mount",
    "op-symlink",      "op-write-file", "op-remount",    "root-readonly",
    "detach-old-root", "pivot-root",    "chroot",        "fork-init",
    "new-session",     "controlling-tty", "fds",         "rlimit",
    "setgroups",       "setgid",        "setuid",        "capabilities",
    "no-new-privs",    "chdir",         "exec",          "death-signal",
    "pty",             "setns",         "monitor",
};
static_assert(sizeof(kStepNames) / sizeof(kStepNames[0]) == static_cast<size_t>(Step::Count),
              "kStepNames must name every Step");

namespace {

// Where the child keeps its own fds while it rewires 0..N: far above any
// target the plan may ask for (the TypeScript side caps targets below 256).
constexpr int kHighFd = 512;

// The error pipe; a global so every helper can report without threading it
// through. Set once at the start of RunChild (the child is single-threaded).
int g_err_fd = -1;
// The terminal's slave side once allocated (plan.pty), for kPtySlave.
int g_pty_slave = -1;

size_t Len(const char* s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}

void Report(Step step, int err, int op, const char* detail, size_t detail_len) {
  ErrorRecord rec;
  memset(&rec, 0, sizeof rec);
  rec.step = static_cast<int32_t>(step);
  rec.err = err;
  rec.op = op;
  if (detail_len > sizeof rec.detail) detail_len = sizeof rec.detail;
  if (detail) memcpy(rec.detail, detail, detail_len);
  rec.detail_len = static_cast<int32_t>(detail_len);
  ssize_t unused = write(g_err_fd, &rec, sizeof rec);
  (void)unused;
}

[[noreturn]] void Fail(Step step, int op = -1, int err = errno) {
  Report(step, err, op, nullptr, 0);
  _exit(127);
}

// A failed fsconfig()/fsmount() leaves the kernel's reason in the fs context
// log ("e overlay: workdir and upperdir must be separate subtrees"); it is far
// more useful to the user than a bare EINVAL.
[[noreturn]] void FailWithFsLog(Step step, int op, int fsfd) {
  int err = errno;
  char buf[240];
  ssize_t n = fsfd >= 0 ? read(fsfd, buf, sizeof buf) : -1;
  Report(step, err, op, buf, n > 0 ? static_cast<size_t>(n) : 0);
  _exit(127);
}

int OpenInRoot(int rootfd, const char* path, int flags, mode_t mode = 0) {
  struct open_how how;
  memset(&how, 0, sizeof how);
  how.flags = static_cast<uint64_t>(flags) | O_CLOEXEC;
  how.mode = (flags & O_CREAT) ? mode : 0;
  // RESOLVE_IN_ROOT: absolute symlinks and ".." stay inside rootfd, so a
  // symlink planted in a bound tree can never send us out of the new root.
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(sys::openat2(rootfd, path, &how, sizeof how));
}

// Copies the first `n` bytes of `path` into `buf` as a C string.
void Prefix(char* buf, const char* path, size_t n) {
  memcpy(buf, path, n);
  buf[n] = 0;
}

// Opens (O_PATH) the directory `path` inside the root, creating missing
// components. Components are created one at a time in their already
// resolved parent, so nothing is ever created outside the root.
int EnsureDir(int rootfd, const char* path, mode_t last_mode) {
  int fd = OpenInRoot(rootfd, path, O_PATH | O_DIRECTORY);
  if (fd >= 0 || errno != ENOENT) return fd;

  char buf[PATH_MAX];
  size_t len = Len(path);
  if (len >= sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int parent = OpenInRoot(rootfd, "/", O_PATH | O_DIRECTORY);
  if (parent < 0) return -1;
  size_t i = 0;
  while (i < len) {
    while (i < len && path[i] == '/') i++;
    size_t start = i;
    while (i < len && path[i] != '/') i++;
    if (i == start) break;
    Prefix(buf, path, i);
    int next = OpenInRoot(rootfd, buf, O_PATH | O_DIRECTORY);
    if (next < 0 && errno == ENOENT) {
      char name[NAME_MAX + 1];
      size_t nlen = i - start;
      if (nlen > NAME_MAX) {
        close(parent);
        errno = ENAMETOOLONG;
        return -1;
      }
      memcpy(name, path + start, nlen);
      name[nlen] = 0;
      mode_t mode = i >= len ? last_mode : 0755;
      if (mkdirat(parent, name, mode) < 0 && errno != EEXIST) {
        close(parent);
        return -1;
      }
      next = OpenInRoot(rootfd, buf, O_PATH | O_DIRECTORY);
    }
    close(parent);
    if (next < 0) return -1;
    parent = next;
  }
  return parent;
}

// Splits "/a/b/c" into an O_PATH fd of "/a/b" (created if missing) and "c".
int ParentOf(int rootfd, const char* path, char* name_out) {
  size_t len = Len(path);
  size_t slash = len;
  while (slash > 0 && path[slash - 1] != '/') slash--;
  size_t nlen = len - slash;
  if (nlen == 0 || nlen > NAME_MAX) {
    errno = nlen == 0 ? EINVAL : ENAMETOOLONG;
    return -1;
  }
  memcpy(name_out, path + slash, nlen);
  name_out[nlen] = 0;
  char dir[PATH_MAX];
  if (slash >= sizeof dir) {
    errno = ENAMETOOLONG;
    return -1;
  }
  Prefix(dir, path, slash == 0 ? 0 : slash);
  if (slash <= 1) {
    dir[0] = '/';
    dir[1] = 0;
  }
  return EnsureDir(rootfd, dir, 0755);
}

// Opens (O_PATH) a non-directory target for a file bind, creating an empty
// file if needed. The last component is never followed if it is a symlink.
int EnsureFile(int rootfd, const char* path) {
  char name[NAME_MAX + 1];
  int parent = ParentOf(rootfd, path, name);
  if (parent < 0) return -1;
  int fd = openat(parent, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    int created = openat(parent, name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (created >= 0) close(created);
    fd = openat(parent, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  }
  close(parent);
  if (fd < 0) return -1;
  struct stat st;
  if (fstat(fd, &st) < 0 || S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode)) {
    int err = S_ISDIR(st.st_mode) ? EISDIR : ELOOP;
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

uint64_t MountAttrs(uint32_t flags) {
  uint64_t a = 0;
  if (flags & OP_READONLY) a |= MOUNT_ATTR_RDONLY;
  if (flags & OP_NOSUID) a |= MOUNT_ATTR_NOSUID;
  if (flags & OP_NODEV) a |= MOUNT_ATTR_NODEV;
  if (flags & OP_NOEXEC) a |= MOUNT_ATTR_NOEXEC;
  return a;
}

void Attach(int mntfd, int targetfd, int op) {
  if (sys::move_mount(mntfd, "", targetfd, "",
                      MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) < 0)
    Fail(Step::OpMount, op);
}

// Applies "key=value,key,..." options to an fs context; a bare key is a flag.
void ApplyFsOptions(int fsfd, const char* opts, int op) {
  char buf[1024];
  size_t len = Len(opts);
  if (len >= sizeof buf) {
    errno = E2BIG;
    Fail(Step::OpMount, op);
  }
  memcpy(buf, opts, len + 1);
  char* p = buf;
  while (*p) {
    char* key = p;
    while (*p && *p != ',') p++;
    if (*p) *p++ = 0;
    if (!*key) continue;
    char* eq = key;
    while (*eq && *eq != '=') eq++;
    int rc;
    if (*eq) {
      *eq = 0;
      rc = sys::fsconfig(fsfd, FSCONFIG_SET_STRING, key, eq + 1, 0);
    } else {
      rc = sys::fsconfig(fsfd, FSCONFIG_SET_FLAG, key, nullptr, 0);
    }
    if (rc < 0) FailWithFsLog(Step::OpMount, op, fsfd);
  }
}

// Creates a detached mount of a fresh filesystem, ready for Attach().
int NewFs(const char* fstype, const MountOp& m, int op, uint64_t attrs) {
  int fsfd = sys::fsopen(fstype, FSOPEN_CLOEXEC);
  if (fsfd < 0) Fail(Step::OpMount, op);
  if (m.kind == OpKind::Overlay) {
    if (sys::fsconfig(fsfd, FSCONFIG_SET_STRING, "lowerdir", m.lower.c_str(), 0) < 0)
      FailWithFsLog(Step::OpMount, op, fsfd);
    if (!m.upper.empty()) {
      if (sys::fsconfig(fsfd, FSCONFIG_SET_STRING, "upperdir", m.upper.c_str(), 0) < 0 ||
          sys::fsconfig(fsfd, FSCONFIG_SET_STRING, "workdir", m.work.c_str(), 0) < 0)
        FailWithFsLog(Step::OpMount, op, fsfd);
    }
    if ((m.flags & OP_USERXATTR) && sys::fsconfig(fsfd, FSCONFIG_SET_FLAG, "userxattr", nullptr, 0) < 0)
      FailWithFsLog(Step::OpMount, op, fsfd);
  } else {
    ApplyFsOptions(fsfd, m.data.c_str(), op);
  }
  if (sys::fsconfig(fsfd, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0)
    FailWithFsLog(Step::OpMount, op, fsfd);
  int mntfd = sys::fsmount(fsfd, FSMOUNT_CLOEXEC, static_cast<unsigned>(attrs));
  if (mntfd < 0) FailWithFsLog(Step::OpMount, op, fsfd);
  close(fsfd);
  return mntfd;
}

bool SkipOptional(const MountOp& m) {
  return (m.flags & OP_OPTIONAL) && (errno == ENOENT || errno == ENOTDIR);
}

void DoBind(const MountOp& m, int op, int rootfd, int oldrootfd) {
  int srcfd = OpenInRoot((m.flags & OP_SRC_IN_ROOT) ? rootfd : oldrootfd, m.src.c_str(), O_PATH);
  if (srcfd < 0) {
    if (SkipOptional(m)) return;
    Fail(Step::OpSource, op);
  }
  struct stat st;
  if (fstat(srcfd, &st) < 0) Fail(Step::OpSource, op);
  // Always recursive: a non-recursive bind would uncover whatever the host
  // hid under submounts of the source.
  int tree = sys::open_tree(srcfd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH);
  close(srcfd);
  if (tree < 0) Fail(Step::OpMount, op);
  uint64_t attrs = MountAttrs(m.flags);
  if (attrs) {
    // One call makes every submount read-only/nosuid/nodev too, so a
    // read-only bind cannot be written through a mount nested inside it.
    struct mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = attrs;
    if (sys::mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0)
      Fail(Step::OpMount, op);
  }
  int target = S_ISDIR(st.st_mode) ? EnsureDir(rootfd, m.dst.c_str(), 0755)
                                   : EnsureFile(rootfd, m.dst.c_str());
  if (target < 0) Fail(Step::OpTarget, op);
  Attach(tree, target, op);
  close(target);
  close(tree);
}

void DoNewFs(const char* fstype, const MountOp& m, int op, int rootfd) {
  int target = EnsureDir(rootfd, m.dst.c_str(), m.mode);
  if (target < 0) Fail(Step::OpTarget, op);
  int mnt = NewFs(fstype, m, op, MountAttrs(m.flags));
  Attach(mnt, target, op);
  close(mnt);
  close(target);
}

void DoSymlink(const MountOp& m, int op, int rootfd) {
  char name[NAME_MAX + 1];
  int parent = ParentOf(rootfd, m.dst.c_str(), name);
  if (parent < 0) Fail(Step::OpTarget, op);
  if (symlinkat(m.src.c_str(), parent, name) < 0) {
    // An identical link already there (e.g. from a bound tree) is fine.
    char existing[PATH_MAX];
    ssize_t n = errno == EEXIST ? readlinkat(parent, name, existing, sizeof existing - 1) : -1;
    if (n < 0 || static_cast<size_t>(n) != m.src.size() || memcmp(existing, m.src.data(), n) != 0) {
      if (n >= 0) errno = EEXIST;
      Fail(Step::OpSymlink, op);
    }
  }
  close(parent);
}

void DoWriteFile(const MountOp& m, int op, int rootfd) {
  char name[NAME_MAX + 1];
  int parent = ParentOf(rootfd, m.dst.c_str(), name);
  if (parent < 0) Fail(Step::OpTarget, op);
  int fd = openat(parent, name, O_CREAT | O_TRUNC | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, m.mode);
  if (fd < 0) Fail(Step::OpWriteFile, op);
  const char* p = m.data.data();
  size_t left = m.data.size();
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      Fail(Step::OpWriteFile, op);
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  if (fchmod(fd, m.mode) < 0) Fail(Step::OpWriteFile, op);
  close(fd);
  close(parent);
}

void DoMkdir(const MountOp& m, int op, int rootfd) {
  int fd = EnsureDir(rootfd, m.dst.c_str(), m.mode);
  if (fd < 0) Fail(Step::OpTarget, op);
  close(fd);
}

void DoRemount(const MountOp& m, int op, int rootfd) {
  int fd = OpenInRoot(rootfd, m.dst.c_str(), O_PATH);
  if (fd < 0) {
    if (SkipOptional(m)) return;
    Fail(Step::OpTarget, op);
  }
  // mount_setattr() on a path inside a mount changes that whole mount;
  // insist on a mount root so a remount never reaches further than asked.
  struct statx stx;
  if (sys::statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &stx) < 0) Fail(Step::OpRemount, op);
  if (!(stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) || !(stx.stx_attributes & STATX_ATTR_MOUNT_ROOT)) {
    errno = EINVAL;
    Fail(Step::OpRemount, op);
  }
  struct mount_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.attr_set = MountAttrs(m.flags);
  if (sys::mount_setattr(fd, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0)
    Fail(Step::OpRemount, op);
  close(fd);
}

void DoMaskFile(const MountOp& m, int op, int rootfd) {
  int target = OpenInRoot(rootfd, m.dst.c_str(), O_PATH | O_NOFOLLOW);
  if (target < 0) {
    if (SkipOptional(m)) return;
    Fail(Step::OpTarget, op);
  }
  // An empty read-only file of the base tmpfs, so masking works with or
  // without a /dev in the new root.
  int null_fd = open("/masked", O_PATH | O_CLOEXEC);
  if (null_fd < 0) Fail(Step::OpSource, op);
  int tree = sys::open_tree(null_fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
  if (tree < 0) Fail(Step::OpMount, op);
  struct mount_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;
  if (sys::mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0) Fail(Step::OpMount, op);
  Attach(tree, target, op);
  close(tree);
  close(null_fd);
  close(target);
}

void DoMaskDir(const MountOp& m, int op, int rootfd) {
  int target = OpenInRoot(rootfd, m.dst.c_str(), O_PATH | O_DIRECTORY);
  if (target < 0) {
    if (SkipOptional(m)) return;
    Fail(Step::OpTarget, op);
  }
  int mnt = NewFs("tmpfs", m, op, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
  Attach(mnt, target, op);
  close(mnt);
  close(target);
}

void RunOp(const MountOp& m, int op, int rootfd, int oldrootfd) {
  switch (m.kind) {
    case OpKind::Bind: DoBind(m, op, rootfd, oldrootfd); break;
    case OpKind::Tmpfs: DoNewFs("tmpfs", m, op, rootfd); break;
    case OpKind::Proc: DoNewFs("proc", m, op, rootfd); break;
    case OpKind::Devpts: DoNewFs("devpts", m, op, rootfd); break;
    case OpKind::Mqueue: DoNewFs("mqueue", m, op, rootfd); break;
    case OpKind::Overlay: DoNewFs("overlay", m, op, rootfd); break;
    case OpKind::Symlink: DoSymlink(m, op, rootfd); break;
    case OpKind::Mkdir: DoMkdir(m, op, rootfd); break;
    case OpKind::WriteFile: DoWriteFile(m, op, rootfd); break;
    case OpKind::Remount: DoRemount(m, op, rootfd); break;
    case OpKind::MaskFile: DoMaskFile(m, op, rootfd); break;
    case OpKind::MaskDir: DoMaskDir(m, op, rootfd); break;
  }
}

void BringUpLoopback() {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) Fail(Step::Loopback);
  struct ifreq ifr;
  memset(&ifr, 0, sizeof ifr);
  memcpy(ifr.ifr_name, "lo", 3);
  if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) Fail(Step::Loopback);
  ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
  if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0) Fail(Step::Loopback);
  close(s);
}

// Builds the sandbox's root and makes it the process root.
void SetUpFilesystem(const Plan& plan) {
  // Slave, not shared: host mount events still reach us, but nothing we
  // mount or unmount can propagate back to the host.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) < 0) Fail(Step::Propagation);

  // A private tmpfs becomes the root while we work, with the host root at
  // /oldroot: host paths stay reachable (even those under /tmp, which this
  // tmpfs covers only until the pivot moves it) and the final root is
  // assembled at /newroot.
  if (mount("tmpfs", "/tmp", "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755") < 0) Fail(Step::BaseTmpfs);
  if (chdir("/tmp") < 0 || mkdir("newroot", 0755) < 0 || mkdir("oldroot", 0755) < 0)
    Fail(Step::BaseTmpfs);
  if (sys::pivot_root(".", "oldroot") < 0) Fail(Step::PivotToBase);
  if (chdir("/") < 0) Fail(Step::PivotToBase);
  int masked = open("masked", O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0444);
  if (masked < 0) Fail(Step::BaseTmpfs);
  close(masked);
  // pivot_root() needs the new root to be a mount point.
  if (mount("newroot", "newroot", nullptr, MS_BIND | MS_REC, nullptr) < 0) Fail(Step::NewRootMount);

  int oldrootfd = open("/oldroot", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (oldrootfd < 0) Fail(Step::OpenOldRoot);
  int rootfd = -1;
  // The prepared prefix (the host root) first, then the plan's own ops; an
  // op's index counts across both, as the parent numbers them.
  size_t n_prefix = plan.prefix_ops ? plan.prefix_ops->size() : 0;
  for (size_t i = 0; i < n_prefix + plan.ops.size(); i++) {
    const MountOp& m = i < n_prefix ? (*plan.prefix_ops)[i] : plan.ops[i - n_prefix];
    // A mount stacked on "/" is only seen through a fresh lookup of
    // /newroot: reopen after one (and before the first op).
    if (rootfd < 0) {
      rootfd = open("/newroot", O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (rootfd < 0) Fail(Step::NewRootMount, static_cast<int>(i));
    }
    RunOp(m, static_cast<int>(i), rootfd, oldrootfd);
    if (m.dst == "/") {
      close(rootfd);
      rootfd = -1;
    }
  }
  if (rootfd >= 0) close(rootfd);
  close(oldrootfd);

  if (plan.root_readonly) {
    int rootfd = open("/newroot", O_PATH | O_DIRECTORY | O_CLOEXEC);
    struct mount_attr attr;
    memset(&attr, 0, sizeof attr);
    attr.attr_set = MOUNT_ATTR_RDONLY;
    if (rootfd < 0 || sys::mount_setattr(rootfd, "", AT_EMPTY_PATH, &attr, sizeof attr) < 0)
      Fail(Step::RootReadonly);
    close(rootfd);
  }

  // Private before unmounting, or the unmount would propagate to the host.
  if (mount("oldroot", "oldroot", nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) Fail(Step::DetachOldRoot);
  if (umount2("oldroot", MNT_DETACH) < 0) Fail(Step::DetachOldRoot);

  if (chdir("/newroot") < 0) Fail(Step::PivotRoot);
  if (plan.pivot) {
    // pivot_root(".", ".") stacks the old root under the new one; unmounting
    // "." then drops it, leaving no path back to the base tmpfs.
    if (sys::pivot_root(".", ".") < 0) Fail(Step::PivotRoot);
    if (umount2(".", MNT_DETACH) < 0) Fail(Step::PivotRoot);
  } else {
    // Documented fallback: the host root is already detached above, so even
    // a chroot escape only reaches the empty base tmpfs.
    if (chroot(".") < 0) Fail(Step::Chroot);
  }
  if (chdir("/") < 0) Fail(Step::PivotRoot);
}

// Closes every fd but the `n` in `keep` (ascending). The fds kept stay
// where they are: with many fds open in Node, no "high" region is known to
// be free.
void CloseAllExcept(const int* keep, size_t n) {
  unsigned lo = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned fd = static_cast<unsigned>(keep[i]);
    if (fd > lo) sys::close_range(lo, fd - 1, 0);
    lo = fd + 1;
  }
  sys::close_range(lo, ~0u, 0);
}

void CloseAllExcept(int a) { CloseAllExcept(&a, 1); }

void CloseAllExcept(int a, int b) {
  int keep[2] = {a < b ? a : b, a < b ? b : a};
  CloseAllExcept(keep, 2);
}

// Moves every fd the plan maps (and the error pipe) above kHighFd, then
// dup2()s them into place and closes everything else: no host fd survives.
void WireFds(const Plan& plan) {
  int high[64];
  size_t n = plan.fds.size();
  if (n > 64) {
    errno = EMFILE;
    Fail(Step::Fds);
  }
  int err_high = fcntl(g_err_fd, F_DUPFD_CLOEXEC, kHighFd);
  if (err_high < 0) Fail(Step::Fds);
  g_err_fd = err_high;
  for (size_t i = 0; i < n; i++) {
    int src = plan.fds[i].source == kPtySlave ? g_pty_slave : plan.fds[i].source;
    high[i] = fcntl(src, F_DUPFD_CLOEXEC, kHighFd);
    if (high[i] < 0) Fail(Step::Fds);
  }
  for (size_t i = 0; i < n; i++) {
    if (dup2(high[i], plan.fds[i].target) < 0) Fail(Step::Fds);
  }
  // Keep the targets (sorted, all below kHighFd) and the error pipe (above).
  int keep[65];
  for (size_t i = 0; i < n; i++) keep[i] = plan.fds[i].target;
  keep[n] = g_err_fd;
  CloseAllExcept(keep, n + 1);
}

void DropCapabilities(uint64_t keep) {
  for (int cap = 0; cap <= 63; cap++) {
    if (keep & (1ull << cap)) continue;
    if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      Fail(Step::Capabilities);
    }
  }
  if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0) Fail(Step::Capabilities);
  struct __user_cap_header_struct hdr;
  struct __user_cap_data_struct data[2];
  memset(&hdr, 0, sizeof hdr);
  memset(data, 0, sizeof data);
  hdr.version = _LINUX_CAPABILITY_VERSION_3;
  for (int i = 0; i < 2; i++) {
    uint32_t bits = static_cast<uint32_t>(keep >> (32 * i));
    data[i].effective = data[i].permitted = data[i].inheritable = bits;
  }
  if (syscall(SYS_capset, &hdr, data) < 0) Fail(Step::Capabilities);
  // Ambient capabilities carry the kept set across execve() for a non-root
  // uid, which would otherwise lose everything.
  for (int cap = 0; cap <= 63; cap++) {
    if ((keep & (1ull << cap)) && prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) < 0)
      Fail(Step::Capabilities);
  }
}

[[noreturn]] void ExecMain(const Plan& plan, const ChildFds& fds) {
  if (plan.die_with_parent && prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) Fail(Step::DeathSignal);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);

  // A new session detaches from any terminal the caller has, which is what
  // stops TIOCSTI from typing into it (CVE-2017-5226).
  if ((plan.new_session || plan.pty) && setsid() < 0) Fail(Step::NewSession);
  if (plan.pty && ioctl(g_pty_slave, TIOCSCTTY, 0) < 0) Fail(Step::ControllingTty);
  WireFds(plan);

  for (const Rlimit& r : plan.rlimits) {
    struct rlimit rl = {static_cast<rlim_t>(r.soft), static_cast<rlim_t>(r.hard)};
    if (setrlimit(r.resource, &rl) < 0) Fail(Step::Rlimit);
  }
  if (plan.set_ids) {
    // setgroups is denied in unprivileged user namespaces; then the
    // supplementary groups are already empty of anything mapped.
    if (setgroups(0, nullptr) < 0 && errno != EPERM) Fail(Step::Setgroups);
    if (plan.keep_caps) prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0);
    if (setresgid(plan.gid, plan.gid, plan.gid) < 0) Fail(Step::Setgid);
    if (setresuid(plan.uid, plan.uid, plan.uid) < 0) Fail(Step::Setuid);
  }
  DropCapabilities(plan.keep_caps);
  if (plan.no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) Fail(Step::NoNewPrivs);

  // All host fds are closed by now, so a cwd like /proc/self/fd/N cannot
  // lead back to the host (runc CVE-2024-21626); the raw getcwd() reports
  // "(unreachable)" for a directory outside the root, checked anyway.
  if (chdir(plan.cwd.c_str()) < 0) Fail(Step::Chdir);
  char cwd[PATH_MAX];
  long n = syscall(SYS_getcwd, cwd, sizeof cwd);
  if (n < 0 || cwd[0] != '/') {
    errno = n < 0 ? errno : EXDEV;
    Fail(Step::Chdir);
  }

  int err = ENOENT;
  for (const std::string& path : plan.exec_candidates) {
    execve(path.c_str(), const_cast<char* const*>(plan.argv_ptrs.data()),
           const_cast<char* const*>(plan.env_ptrs.data()));
    // Keep looking on ENOENT/ENOTDIR like execvp; remember a permission
    // problem so "found but not executable" is what gets reported.
    if (errno != ENOENT && errno != ENOTDIR) err = errno;
    if (errno != ENOENT && errno != ENOTDIR && errno != EACCES) break;
  }
  Fail(Step::Exec, -1, err);
}

// Allocates the terminal in the sandbox's own devpts, so ttyname() and
// /dev/pts inside the sandbox agree, and hands the master to the parent.
void OpenSandboxPty(const Plan& plan, int sock) {
  int master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) Fail(Step::Pty);
  int unlock = 0;
  if (ioctl(master, TIOCSPTLCK, &unlock) < 0) Fail(Step::Pty);
  struct winsize ws;
  memset(&ws, 0, sizeof ws);
  ws.ws_col = plan.pty_cols;
  ws.ws_row = plan.pty_rows;
  if (ioctl(master, TIOCSWINSZ, &ws) < 0) Fail(Step::Pty);
  g_pty_slave = static_cast<int>(ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (g_pty_slave < 0) Fail(Step::Pty);

  char byte = 'T';
  struct iovec iov = {&byte, 1};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } ctl;
  memset(&ctl, 0, sizeof ctl);
  struct msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = ctl.buf;
  msg.msg_controllen = sizeof ctl.buf;
  struct cmsghdr* cm = CMSG_FIRSTHDR(&msg);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &master, sizeof(int));
  if (sendmsg(sock, &msg, MSG_NOSIGNAL) != 1) Fail(Step::Pty);
  close(master);
  close(sock);
}

void NoopHandler(int) {}

// PID 1 of the sandbox: reaps every orphan, forwards signals to the tree,
// and when the main process exits reports its wait status and exits, which
// makes the kernel kill everything left in the PID namespace. With no main
// process (main_pid < 0, a persistent sandbox) it only reaps, until killed.
[[noreturn]] void RunInit(pid_t main_pid, int status_fd) {
  prctl(PR_SET_NAME, "msbx-init", 0, 0, 0);
  // Without a handler the kernel drops signals sent to a namespace's init,
  // even from the parent; a no-op handler makes them deliverable while they
  // stay blocked for sigwaitinfo().
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = NoopHandler;
  for (int sig = 1; sig < 32; sig++) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    sigaction(sig, &sa, nullptr);
  }
  sigaction(kSignalKillAll, &sa, nullptr);
  sigset_t all;
  sigfillset(&all);
  for (;;) {
    siginfo_t si;
    int sig = sigwaitinfo(&all, &si);
    if (sig < 0) continue;
    if (sig == kSignalKillAll) {
      // kill(-1) spares the caller: everything but PID 1 goes.
      kill(-1, SIGKILL);
      continue;
    }
    if (sig != SIGCHLD) {
      if (sig != SIGTSTP && sig != SIGTTIN && sig != SIGTTOU) kill(-1, sig);
      continue;
    }
    for (;;) {
      int st = 0;
      pid_t p = waitpid(-1, &st, WNOHANG);
      if (p <= 0) break;
      if (p == main_pid) {
        int32_t status = st;
        ssize_t unused = write(status_fd, &status, sizeof status);
        (void)unused;
        _exit(0);
      }
    }
  }
}

// First steps of every child: forget Node's signal handlers, die with the
// parent, and wait until the parent has finished its side (id maps, cgroups).
void StartChild(const Plan& plan, const ChildFds& fds) {
  g_err_fd = fds.err_write;
  // Node's signal handlers were copied by clone(); left in place they would
  // write into libuv's pipes shared with the parent.
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < 65; sig++) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    sigaction(sig, &dfl, nullptr);
  }
  if (plan.die_with_parent && prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) Fail(Step::DeathSignal);

  close(fds.sync_write);
  char go = 0;
  ssize_t got;
  do got = read(fds.sync_read, &go, 1); while (got < 0 && errno == EINTR);
  if (got != 1) _exit(127);  // the parent gave up (or died) before releasing us
  close(fds.sync_read);
}

// Pids of every descendant of `root` in the PID namespace /proc shows, found
// by scanning /proc/*/stat for parent links (threads and orphans included,
// since a subreaper adopts them). Fixed buffers: no allocation here.
constexpr int kMaxPids = 8192;

int ParentOfPid(int pid) {
  char path[64], buf[512];
  // "/proc/<pid>/stat"
  const char* pre = "/proc/";
  size_t n = 0;
  for (const char* p = pre; *p; p++) path[n++] = *p;
  char digits[16];
  int d = 0;
  for (int v = pid; v > 0; v /= 10) digits[d++] = static_cast<char>('0' + v % 10);
  while (d > 0) path[n++] = digits[--d];
  for (const char* p = "/stat"; *p; p++) path[n++] = *p;
  path[n] = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t len = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (len <= 0) return -1;
  buf[len] = 0;
  // The command name may hold spaces and ')': the ppid follows the last ')'.
  char* close_paren = nullptr;
  for (char* p = buf; *p; p++)
    if (*p == ')') close_paren = p;
  if (!close_paren) return -1;
  char* p = close_paren + 2;  // state
  while (*p && *p != ' ') p++;
  int ppid = 0;
  for (p++; *p >= '0' && *p <= '9'; p++) ppid = ppid * 10 + (*p - '0');
  return ppid;
}

int CollectDescendants(int root, int* out) {
  static int pids[kMaxPids], parents[kMaxPids];
  int count = 0;
  int dir = open("/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return 0;
  char buf[4096];
  for (;;) {
    long n = syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n <= 0) break;
    for (long off = 0; off < n;) {
      struct linux_dirent64 {
        uint64_t d_ino;
        int64_t d_off;
        unsigned short d_reclen;
        unsigned char d_type;
        char d_name[];
      };
      auto* e = reinterpret_cast<linux_dirent64*>(buf + off);
      off += e->d_reclen;
      int pid = 0;
      bool numeric = e->d_name[0] != 0;
      for (const char* c = e->d_name; *c; c++) {
        if (*c < '0' || *c > '9') numeric = false;
        else pid = pid * 10 + (*c - '0');
      }
      if (!numeric || count >= kMaxPids) continue;
      int ppid = ParentOfPid(pid);
      if (ppid < 0) continue;
      pids[count] = pid;
      parents[count] = ppid;
      count++;
    }
  }
  close(dir);
  // Fixed point: a pid is a descendant if its parent is root or a descendant.
  int found = 0;
  bool grew = true;
  static bool mark[kMaxPids];
  for (int i = 0; i < count; i++) mark[i] = false;
  while (grew) {
    grew = false;
    for (int i = 0; i < count; i++) {
      if (mark[i]) continue;
      bool child = parents[i] == root;
      for (int j = 0; !child && j < found; j++) child = parents[i] == out[j];
      if (child) {
        mark[i] = true;
        out[found++] = pids[i];
        grew = true;
      }
    }
  }
  return found;
}

// The command a monitor runs, and its wait status once reaped.
pid_t g_main_pid = -1;
bool g_main_done = false;
int32_t g_main_status = 0;

// Reaps every exited child without blocking, remembering the command's status.
void ReapChildren() {
  for (;;) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG);
    if (p <= 0) return;
    if (p == g_main_pid) {
      g_main_done = true;
      g_main_status = st;
    }
  }
}

// Stops then kills every descendant, again and again until none is left: a
// stopped process cannot fork, and orphans of killed ones come back to us
// (we are their subreaper) for the next round.
void KillTree() {
  static int victims[kMaxPids];
  int self = static_cast<int>(syscall(SYS_getpid));
  for (int round = 0; round < 1000; round++) {
    int n = CollectDescendants(self, victims);
    if (n == 0) return;
    for (int i = 0; i < n; i++) kill(victims[i], SIGSTOP);
    for (int i = 0; i < n; i++) kill(victims[i], SIGKILL);
    ReapChildren();
  }
}

// The monitor of a command run in an existing sandbox: reaps it, reports
// its status, forwards signals, and kills its whole subtree on request.
[[noreturn]] void RunMonitor(int status_fd, int control_fd) {
  prctl(PR_SET_NAME, "msbx-exec", 0, 0, 0);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) _exit(127);
  struct pollfd pfd[2] = {{sfd, POLLIN, 0}, {control_fd, POLLIN, 0}};
  for (;;) {
    if (g_main_done) {
      ssize_t unused = write(status_fd, &g_main_status, sizeof g_main_status);
      (void)unused;
      _exit(0);
    }
    int n = poll(pfd, control_fd >= 0 ? 2 : 1, -1);
    if (n < 0) continue;
    if (control_fd >= 0 && (pfd[1].revents & (POLLIN | POLLHUP))) {
      unsigned char cmd;
      ssize_t got = read(control_fd, &cmd, 1);
      if (got <= 0) {
        control_fd = -1;  // the parent closed it: nothing more will come
      } else if (cmd == kControlKillTree) {
        KillTree();
      } else if (!g_main_done) {
        kill(g_main_pid, cmd);
      }
    }
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) == sizeof si) {
    }
    ReapChildren();
  }
}

// What the CLONE_VM children below run; they share these with their parent.
const Plan* g_plan = nullptr;
const ChildFds* g_fds = nullptr;

int MainEntry(void*) { ExecMain(*g_plan, *g_fds); }

// Starts the main process sharing our memory until it execs (vfork-like):
// no copy of the address space, and we resume once it has exec'd or failed.
pid_t StartMain(char* stack) {
  return clone(MainEntry, stack, CLONE_VM | CLONE_VFORK | SIGCHLD, nullptr);
}

[[noreturn]] void RunMonitorProcess() {
  const Plan& plan = *g_plan;
  const ChildFds& fds = *g_fds;
  if (plan.die_with_parent && prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) Fail(Step::DeathSignal);
  // Orphans of the command come back to the monitor, so KillTree sees them.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) Fail(Step::Monitor);
  if (plan.pty) OpenSandboxPty(plan, fds.pty_socket);
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  pid_t main_pid = StartMain(fds.stack_b);
  if (main_pid < 0) Fail(Step::Monitor);
  g_main_pid = main_pid;
  CloseAllExcept(fds.status_write, fds.control_read);
  RunMonitor(fds.status_write, fds.control_read);
}

int MonitorEntry(void*) { RunMonitorProcess(); }

}  // namespace

[[noreturn]] void RunEnter(const Plan& plan, const ChildFds& fds, int target_pidfd) {
  StartChild(plan, fds);
  // One call joins every namespace of the sandbox's PID 1, the user
  // namespace first; the mount namespace brings its root and cwd.
  if (setns(target_pidfd, static_cast<int>(NamespaceCloneFlags(plan.namespaces))) < 0) Fail(Step::Setns);

  // The monitor is born inside the sandbox's PID namespace (only children
  // enter it) and, with CLONE_PARENT, as a child of Node itself: Node can
  // watch it with a pidfd, and this go-between exits at once. CLONE_VM: it
  // inherits this copy of the address space instead of making another.
  g_plan = &plan;
  g_fds = &fds;
  pid_t monitor = clone(MonitorEntry, fds.stack_a, CLONE_VM | CLONE_PARENT, nullptr);
  if (monitor < 0) Fail(Step::Monitor);
  int32_t pid = monitor;
  ssize_t unused = write(fds.pid_write, &pid, sizeof pid);
  (void)unused;
  _exit(0);
}

[[noreturn]] void RunChild(const Plan& plan, const ChildFds& fds) {
  StartChild(plan, fds);

  if ((plan.namespaces & NS_UTS) && !plan.hostname.empty() &&
      sethostname(plan.hostname.c_str(), plan.hostname.size()) < 0)
    Fail(Step::Hostname);
  if (plan.namespaces & NS_NET) BringUpLoopback();
  SetUpFilesystem(plan);
  if (plan.pty) OpenSandboxPty(plan, fds.pty_socket);

  if (plan.hold) {
    CloseAllExcept(fds.status_write);
    RunInit(-1, fds.status_write);
  }
  if (plan.namespaces & NS_PID) {
    // Signals stay blocked across the fork so init cannot miss the main
    // process's SIGCHLD; the main process unblocks them before exec.
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, nullptr);
    g_plan = &plan;
    g_fds = &fds;
    pid_t main_pid = StartMain(fds.stack_a);
    if (main_pid < 0) Fail(Step::ForkInit);
    {
      // Init keeps only the status pipe: the error pipe must reach EOF at the
      // parent as soon as the main process has exec'd.
      CloseAllExcept(fds.status_write);
      RunInit(main_pid, fds.status_write);
    }
  }
  ExecMain(plan, fds);
}

}  // namespace msbx
