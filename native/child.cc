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
#include <linux/filter.h>
#include <linux/seccomp.h>
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
    "pty",             "setns",         "monitor",       "init-ids",
    "cgroup-join",     "seccomp",
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
// Node's own command line and environment (SetHostArgArea).
uintptr_t g_arg_start, g_arg_end, g_env_start, g_env_end;

size_t Len(const char* s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}

// Bounded string building without allocation: each returns false (and
// leaves `buf` terminated) when the result would not fit in `cap`.
bool Append(char* buf, size_t cap, size_t& len, const char* s) {
  size_t n = Len(s);
  if (len + n + 1 > cap) return false;
  memcpy(buf + len, s, n + 1);
  len += n;
  return true;
}

bool AppendNum(char* buf, size_t cap, size_t& len, unsigned long v) {
  char digits[24];
  int d = 0;
  do digits[d++] = static_cast<char>('0' + v % 10); while ((v /= 10) > 0);
  char text[24];
  for (int i = 0; i < d; i++) text[i] = digits[d - 1 - i];
  text[d] = 0;
  return Append(buf, cap, len, text);
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
  int err = fstat(fd, &st) < 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : S_ISLNK(st.st_mode) ? ELOOP : 0;
  if (err) {
    close(fd);
    errno = err;
    return -1;
  }
  return fd;
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
  ApplyFsOptions(fsfd, m.data.c_str(), op);
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

const Plan* g_plan = nullptr;
// The next of plan.source_fds to take: ops consume them in order.
size_t g_source_cursor = 0;

// The next source the parent cloned (already carrying its mount attributes
// and id mapping); -1 when an optional one is missing.
int TakeSourceFd(const MountOp& m, int op) {
  if (g_source_cursor >= g_plan->source_fds.size()) {
    errno = EBADF;
    Fail(Step::OpSource, op);
  }
  int fd = g_plan->source_fds[g_source_cursor++];
  if (fd >= 0) return fd;
  errno = -fd;
  if (SkipOptional(m)) return -1;
  Fail(Step::OpSource, op);
}

// A detached recursive clone of `path` (under the old root or, with
// OP_SRC_IN_ROOT, the new one), made here; -1 when an optional one is missing.
int CloneSource(const MountOp& m, const char* path, int op, int rootfd, int oldrootfd) {
  int srcfd = OpenInRoot((m.flags & OP_SRC_IN_ROOT) ? rootfd : oldrootfd, path, O_PATH);
  if (srcfd < 0) {
    if (SkipOptional(m)) return -1;
    Fail(Step::OpSource, op);
  }
  // Always recursive: a non-recursive bind would uncover whatever the host
  // hid under submounts of the source.
  int tree = sys::open_tree(srcfd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE | AT_EMPTY_PATH);
  close(srcfd);
  if (tree < 0) Fail(Step::OpMount, op);
  return tree;
}

void SetAttrs(int tree, uint64_t attrs, int op) {
  if (!attrs) return;
  // One call makes every submount read-only/nosuid/nodev too, so a
  // read-only bind cannot be written through a mount nested inside it.
  struct mount_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.attr_set = attrs;
  if (sys::mount_setattr(tree, "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) < 0) Fail(Step::OpMount, op);
}

void DoBind(const MountOp& m, int op, int rootfd, int oldrootfd) {
  int tree;
  if (m.flags & OP_CLONE_IN_PARENT) {
    tree = TakeSourceFd(m, op);
  } else {
    tree = CloneSource(m, m.src.c_str(), op, rootfd, oldrootfd);
    if (tree >= 0) SetAttrs(tree, MountAttrs(m.flags), op);
  }
  if (tree < 0) return;  // optional and missing
  struct stat st;
  if (fstat(tree, &st) < 0) Fail(Step::OpSource, op);
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

// Attaches a layer's tree at `at` in the base tmpfs (the child's root
// while the new root is assembled), creating the directory.
void AttachLayer(int tree, const char* at, int op) {
  if (mkdir(at, 0700) < 0 && errno != EEXIST) Fail(Step::OpMount, op);
  if (sys::move_mount(tree, "", AT_FDCWD, at, MOVE_MOUNT_F_EMPTY_PATH) < 0) Fail(Step::OpMount, op);
  close(tree);
}

// "/.o/<op>" then `leaf` and `num` (if >= 0) into buf.
void LayerPath(char* buf, size_t cap, int op, const char* leaf, long num) {
  size_t len = 0;
  buf[0] = 0;
  bool ok = Append(buf, cap, len, "/.o/") && AppendNum(buf, cap, len, static_cast<unsigned long>(op));
  if (ok && leaf) ok = Append(buf, cap, len, "/") && Append(buf, cap, len, leaf);
  if (ok && num >= 0) ok = AppendNum(buf, cap, len, static_cast<unsigned long>(num));
  if (!ok) {
    errno = ENAMETOOLONG;
    Fail(Step::OpMount, op);
  }
}

// An overlay whose layers are first attached under /.o/<op>/ in the base
// tmpfs: its options (in /proc/self/mountinfo inside) then name only those
// paths, nothing of the host's layout, and the layers can be clones the
// parent made with the sandbox's id mapping.
void DoOverlay(const MountOp& m, int op, int rootfd, int oldrootfd) {
  char path[64];
  if (mkdir("/.o", 0700) < 0 && errno != EEXIST) Fail(Step::OpMount, op);
  LayerPath(path, sizeof path, op, nullptr, -1);
  if (mkdir(path, 0700) < 0) Fail(Step::OpMount, op);
  bool in_parent = m.flags & OP_CLONE_IN_PARENT;
  for (size_t j = 0; j < m.lowers.size(); j++) {
    int tree = in_parent ? TakeSourceFd(m, op) : CloneSource(m, m.lowers[j].c_str(), op, rootfd, oldrootfd);
    LayerPath(path, sizeof path, op, "l", static_cast<long>(j));
    AttachLayer(tree, path, op);
  }
  if (!m.upper_base.empty()) {
    int tree = in_parent ? TakeSourceFd(m, op) : CloneSource(m, m.upper_base.c_str(), op, rootfd, oldrootfd);
    LayerPath(path, sizeof path, op, "u", -1);
    AttachLayer(tree, path, op);
  }

  int fsfd = sys::fsopen("overlay", FSOPEN_CLOEXEC);
  if (fsfd < 0) Fail(Step::OpMount, op);
  // "lowerdir+" takes one layer per call (Linux >= 6.8), so any number of
  // layers fits; older kernels take them joined in one "lowerdir" value,
  // which fsconfig() caps at 256 bytes.
  char joined[256];
  size_t jlen = 0;
  joined[0] = 0;
  bool one_by_one = true;
  for (size_t j = 0; j < m.lowers.size(); j++) {
    LayerPath(path, sizeof path, op, "l", static_cast<long>(j));
    if (one_by_one && sys::fsconfig(fsfd, FSCONFIG_SET_STRING, "lowerdir+", path, 0) < 0) {
      if (j > 0 || errno != EINVAL) FailWithFsLog(Step::OpMount, op, fsfd);
      one_by_one = false;
    }
    if (!one_by_one && !((j == 0 || Append(joined, sizeof joined, jlen, ":")) && Append(joined, sizeof joined, jlen, path))) {
      errno = E2BIG;
      Fail(Step::OpMount, op);
    }
  }
  if (!one_by_one && sys::fsconfig(fsfd, FSCONFIG_SET_STRING, "lowerdir", joined, 0) < 0)
    FailWithFsLog(Step::OpMount, op, fsfd);
  if (!m.upper_base.empty()) {
    char dir[128];
    for (const std::string* rel : {&m.upper, &m.work}) {
      size_t len = 0;
      LayerPath(dir, sizeof dir, op, "u", -1);
      len = Len(dir);
      if (!Append(dir, sizeof dir, len, "/") || !Append(dir, sizeof dir, len, rel->c_str())) {
        errno = ENAMETOOLONG;
        Fail(Step::OpMount, op);
      }
      if (sys::fsconfig(fsfd, FSCONFIG_SET_STRING, rel == &m.upper ? "upperdir" : "workdir", dir, 0) < 0)
        FailWithFsLog(Step::OpMount, op, fsfd);
    }
  }
  if ((m.flags & OP_USERXATTR) && sys::fsconfig(fsfd, FSCONFIG_SET_FLAG, "userxattr", nullptr, 0) < 0)
    FailWithFsLog(Step::OpMount, op, fsfd);
  if (sys::fsconfig(fsfd, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) < 0) FailWithFsLog(Step::OpMount, op, fsfd);
  int mnt = sys::fsmount(fsfd, FSMOUNT_CLOEXEC, static_cast<unsigned>(MountAttrs(m.flags)));
  if (mnt < 0) FailWithFsLog(Step::OpMount, op, fsfd);
  close(fsfd);
  int target = EnsureDir(rootfd, m.dst.c_str(), m.mode);
  if (target < 0) Fail(Step::OpTarget, op);
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
    case OpKind::Overlay: DoOverlay(m, op, rootfd, oldrootfd); break;
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

// Closes every fd but the `n` in `keep` (sorted here, in place). The fds
// kept stay where they are: with many fds open in Node, no "high" region is
// known to be free.
void CloseAllExcept(int* keep, size_t n) {
  for (size_t i = 1; i < n; i++)
    for (size_t j = i; j > 0 && keep[j] < keep[j - 1]; j--) {
      int t = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  unsigned lo = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned fd = static_cast<unsigned>(keep[i]);
    if (fd > lo) sys::close_range(lo, fd - 1, 0);
    lo = fd + 1;
  }
  sys::close_range(lo, ~0u, 0);
}

void CloseAllExcept(int a) { CloseAllExcept(&a, 1); }

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

// Joins the sandbox's cgroups (fds the parent opened) before anything of
// the user's runs; "0" is the writing process itself.
void JoinCgroups(const Plan& plan) {
  for (int fd : plan.cgroup_fds) {
    if (write(fd, "0", 1) != 1) Fail(Step::CgroupJoin);
  }
}

void InstallSeccomp(const Plan& plan) {
  struct sock_fprog prog;
  prog.len = static_cast<unsigned short>(plan.seccomp.size() / sizeof(struct sock_filter));
  prog.filter = reinterpret_cast<struct sock_filter*>(const_cast<char*>(plan.seccomp.data()));
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0) Fail(Step::Seccomp);
}

// Credential changes clear the parent-death signal, so it is (re)armed
// after them. Node may have died just before: its pidfd (when still open
// here) then reads as exited, and we go too.
void DieWithParent(int owner_pidfd) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) Fail(Step::DeathSignal);
  if (owner_pidfd < 0) return;
  struct pollfd p = {owner_pidfd, POLLIN, 0};
  if (poll(&p, 1, 0) > 0 && (p.revents & POLLIN)) _exit(127);
}

void SetIds(uint32_t uid, uint32_t gid, bool keep_caps, Step gid_step, Step uid_step) {
  // setgroups is denied in unprivileged user namespaces; then the
  // supplementary groups are already empty of anything mapped.
  if (sys::setgroups_none() < 0 && errno != EPERM) Fail(Step::Setgroups);
  if (keep_caps) prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0);
  if (sys::setresgid(gid) < 0) Fail(gid_step);
  if (sys::setresuid(uid) < 0) Fail(uid_step);
}

[[noreturn]] void ExecMain(const Plan& plan, const ChildFds& fds) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  JoinCgroups(plan);

  // A new session detaches from any terminal the caller has, which is what
  // stops TIOCSTI from typing into it (CVE-2017-5226).
  if ((plan.new_session || plan.pty) && setsid() < 0) Fail(Step::NewSession);
  if (plan.pty && ioctl(g_pty_slave, TIOCSCTTY, 0) < 0) Fail(Step::ControllingTty);
  WireFds(plan);

  for (const Rlimit& r : plan.rlimits) {
    struct rlimit rl = {static_cast<rlim_t>(r.soft), static_cast<rlim_t>(r.hard)};
    if (setrlimit(r.resource, &rl) < 0) Fail(Step::Rlimit);
  }
  if (plan.set_ids) SetIds(plan.uid, plan.gid, plan.keep_caps != 0, Step::Setgid, Step::Setuid);
  // Our parent is PID 1 or the monitor, both outlived by nothing of ours;
  // Node's pidfd is closed by now.
  if (plan.die_with_parent) DieWithParent(-1);
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
  // Last before exec, as bubblewrap does, so that the filter need not allow
  // anything of the setup. Without no_new_privs the kernel takes a filter
  // only from a holder of CAP_SYS_ADMIN (the TypeScript side checks).
  if (!plan.seccomp.empty()) InstallSeccomp(plan);

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
// parent, and wait until the parent has finished its side (id maps).
void StartChild(const Plan& plan, const ChildFds& fds) {
  g_err_fd = fds.err_write;
  g_plan = &plan;
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

// Takes the sandbox's own root ids (plan.init_ids), once the maps are
// written (and, for enter, once inside the user namespace).
void TakeInitIds(const Plan& plan, const ChildFds& fds) {
  if (!plan.init_ids) return;
  SetIds(plan.init_uid, plan.init_gid, false, Step::InitIds, Step::InitIds);
  if (plan.die_with_parent) DieWithParent(fds.owner_pidfd);
}

// PID 1 is a copy of Node: its command line (/proc/1/cmdline needs no
// permission to read) would show Node's argv, secrets included, and its
// environment Node's. Both areas are wiped in this copy; Node's own stay.
void WipeHostArgs() {
  if (g_arg_end > g_arg_start) {
    char* p = reinterpret_cast<char*>(g_arg_start);
    size_t n = g_arg_end - g_arg_start;
    memset(p, 0, n);
    const char name[] = "msbx-init";
    if (n > sizeof name) memcpy(p, name, sizeof name);
  }
  if (g_env_end > g_env_start) memset(reinterpret_cast<char*>(g_env_start), 0, g_env_end - g_env_start);
}

// Pids of every live descendant of `root` (itself excluded), found by
// scanning /proc/*/stat for parent links (threads included). `procfd` is the
// host's /proc, so pids are the ones kill() takes here. Zombies are left
// out: they are dead, and their parent (or PID 1) reaps them. Fixed
// buffers: no allocation here.
constexpr int kMaxPids = 8192;

// The parent pid in /proc/<pid>/stat; -1 for a zombie or a vanished pid.
int ParentOfPid(int procfd, int pid) {
  char path[32], buf[512];
  size_t n = 0;
  if (!AppendNum(path, sizeof path, n, static_cast<unsigned long>(pid)) || !Append(path, sizeof path, n, "/stat"))
    return -1;
  int fd = openat(procfd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t len = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (len <= 0) return -1;
  buf[len] = 0;
  // The command name may hold spaces and ')': the state and ppid follow the
  // last ')'.
  char* close_paren = nullptr;
  for (char* p = buf; *p; p++)
    if (*p == ')') close_paren = p;
  if (!close_paren || !close_paren[1] || !close_paren[2]) return -1;
  char* p = close_paren + 2;  // state
  if (*p == 'Z' || *p == 'X') return -1;
  while (*p && *p != ' ') p++;
  int ppid = 0;
  for (p++; *p >= '0' && *p <= '9'; p++) ppid = ppid * 10 + (*p - '0');
  return ppid;
}

int CollectDescendants(int procfd, int root, int* out) {
  static int pids[kMaxPids], parents[kMaxPids];
  static bool mark[kMaxPids];
  int count = 0;
  int dir = openat(procfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
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
      int ppid = ParentOfPid(procfd, pid);
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

// The command a monitor runs (a host pid), and its wait status once reaped.
pid_t g_main_pid = -1;
bool g_main_done = false;
int32_t g_main_status = 0;

// Reaps every exited child without blocking, remembering the command's status.
void ReapChildren() {
  for (;;) {
    int st = 0;
    pid_t p = waitpid(-1, &st, WNOHANG | __WALL);
    if (p <= 0) return;
    if (p == g_main_pid) {
      g_main_done = true;
      g_main_status = st;
    }
  }
}

// Kills the command and its whole subtree. The command is a child
// subreaper: while it lives, every orphan of its tree comes back to it, so
// it is stopped (a stopped process cannot fork) and killed last, after
// rounds that stop then kill every descendant until none is left.
void KillTree(int procfd) {
  static int victims[kMaxPids];
  if (g_main_done) return;
  for (int round = 0; round < 1000; round++) {
    int n = CollectDescendants(procfd, g_main_pid, victims);
    if (n == 0) break;
    kill(g_main_pid, SIGSTOP);
    for (int i = 0; i < n; i++) kill(victims[i], SIGSTOP);
    for (int i = 0; i < n; i++) kill(victims[i], SIGKILL);
  }
  kill(g_main_pid, SIGKILL);
}

// The monitor of a command run in an existing sandbox: reaps it, reports
// its status, forwards signals, and kills its whole subtree on request.
[[noreturn]] void RunMonitor(int status_fd, int control_fd, int procfd) {
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) _exit(127);
  struct pollfd pfd[2] = {{sfd, POLLIN, 0}, {control_fd, POLLIN, 0}};
  for (;;) {
    ReapChildren();
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
        KillTree(procfd);
      } else if (!g_main_done) {
        kill(g_main_pid, cmd);
      }
    }
    struct signalfd_siginfo si;
    while (read(sfd, &si, sizeof si) == sizeof si) {
    }
  }
}

const ChildFds* g_fds = nullptr;

int MainEntry(void*) { ExecMain(*g_plan, *g_fds); }

// Starts the main process sharing our memory until it execs (vfork-like):
// no copy of the address space, and we resume once it has exec'd or failed.
pid_t StartMain(char* stack) {
  return clone(MainEntry, stack, CLONE_VM | CLONE_VFORK | SIGCHLD, nullptr);
}

// An exec'd command keeps its daemonized descendants (see KillTree).
int SubreaperMainEntry(void*) {
  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) Fail(Step::Monitor);
  ExecMain(*g_plan, *g_fds);
}

}  // namespace

void SetHostArgArea(uintptr_t arg_start, uintptr_t arg_end, uintptr_t env_start, uintptr_t env_end) {
  g_arg_start = arg_start;
  g_arg_end = arg_end;
  g_env_start = env_start;
  g_env_end = env_end;
}

[[noreturn]] void RunEnter(const Plan& plan, const ChildFds& fds, int target_pidfd) {
  StartChild(plan, fds);
  // The host's /proc, opened before we leave the host's mount namespace:
  // the monitor finds the command's descendants there, by the pids it
  // signals them with.
  int procfd = open("/proc", O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (procfd < 0) Fail(Step::Monitor);
  // One call joins every namespace of the sandbox's PID 1, the user
  // namespace first; the mount namespace brings its root and cwd. Joining a
  // PID namespace changes only where our children are born: the monitor
  // itself stays outside it, with no pid the sandbox could name to signal,
  // stop or trace it.
  if (setns(target_pidfd, static_cast<int>(NamespaceCloneFlags(plan.namespaces))) < 0) Fail(Step::Setns);
  TakeInitIds(plan, fds);
  prctl(PR_SET_NAME, "msbx-exec", 0, 0, 0);
  if (plan.pty) OpenSandboxPty(plan, fds.pty_socket);
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, nullptr);
  g_fds = &fds;
  // CLONE_VM|CLONE_VFORK: the command shares this copy of the address
  // space until it execs, so no second copy of Node's page tables is made.
  g_main_pid = clone(SubreaperMainEntry, fds.stack_a, CLONE_VM | CLONE_VFORK | SIGCHLD, nullptr);
  if (g_main_pid < 0) Fail(Step::Monitor);
  int keep[3] = {fds.status_write, fds.control_read, procfd};
  CloseAllExcept(keep, 3);
  RunMonitor(fds.status_write, fds.control_read, procfd);
}

[[noreturn]] void RunChild(const Plan& plan, const ChildFds& fds) {
  StartChild(plan, fds);
  TakeInitIds(plan, fds);
  WipeHostArgs();
  // Nothing of this copy of Node (its memory, fds, executable) may be read
  // from inside, even by a process granted CAP_SYS_PTRACE there: a
  // non-dumpable process is open only to holders of CAP_SYS_PTRACE in the
  // namespace its memory was made in, the host's. The monitors of `enter`
  // must pass the same check to join the sandbox, so only a root caller's
  // sandbox (init_ids) can afford it; without it the sandbox's processes,
  // holding no capability, still cannot trace or read PID 1, which holds all.
  if (plan.init_ids) prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);

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
