// The child's filesystem: the mount plan run inside a base tmpfs, then the
// pivot into the new root (SetUpFilesystem).
//
// Paths are resolved with openat2(RESOLVE_IN_ROOT) and mounts attached by
// file descriptor (open_tree/fsopen, fsmount, move_mount), so a symlink
// planted in a bound tree can never send a mount outside the new root.

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstring>

#include "child_internal.h"
#include "sys.h"

namespace msbx::child {
namespace {

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

// Opens (O_PATH) the directory `buf` names up to byte `end` inside the
// root: the string is cut there for the call and restored after.
int OpenDirPrefix(int rootfd, char* buf, size_t end) {
  char saved = buf[end];
  buf[end] = 0;
  int fd = OpenInRoot(rootfd, buf, O_PATH | O_DIRECTORY);
  buf[end] = saved;
  return fd;
}

// Opens (O_PATH) the directory `path` inside the root, creating missing
// components. The deepest existing ancestor is found first (most targets
// miss only their last component), then each missing component is created
// in its already resolved parent and resolved in turn, so nothing is ever
// created outside the root. Each syscall here counts: a sandbox's root
// takes dozens of these.
int EnsureDir(int rootfd, const char* path, mode_t last_mode) {
  int fd = OpenInRoot(rootfd, path, O_PATH | O_DIRECTORY);
  if (fd >= 0 || errno != ENOENT) return fd;

  char buf[PATH_MAX];
  size_t len = Len(path);
  if (len >= sizeof buf) {
    errno = ENAMETOOLONG;
    return -1;
  }
  memcpy(buf, path, len + 1);
  while (len > 1 && buf[len - 1] == '/') buf[--len] = 0;
  // Where each component ends; component k is buf[.., ends[k]).
  uint16_t ends[PATH_MAX / 2];
  size_t count = 0;
  for (size_t i = 0; i < len;) {
    while (i < len && buf[i] == '/') i++;
    if (i == len) break;
    while (i < len && buf[i] != '/') i++;
    ends[count++] = static_cast<uint16_t>(i);
  }
  // The full path is missing: look for its deepest existing ancestor, from
  // the parent upwards (the root itself at worst). `have` counts the
  // components of the one `parent` opens.
  size_t have = count > 0 ? count - 1 : 0;
  int parent;
  for (;;) {
    if (have == 0) {
      parent = OpenInRoot(rootfd, "/", O_PATH | O_DIRECTORY);
      break;
    }
    parent = OpenDirPrefix(rootfd, buf, ends[have - 1]);
    if (parent >= 0 || errno != ENOENT) break;
    have--;
  }
  if (parent < 0) return -1;
  for (size_t k = have; k < count; k++) {
    size_t start = k == 0 ? 0 : ends[k - 1];
    while (buf[start] == '/') start++;
    char name[NAME_MAX + 1];
    size_t nlen = ends[k] - start;
    if (nlen > NAME_MAX) {
      close(parent);
      errno = ENAMETOOLONG;
      return -1;
    }
    memcpy(name, buf + start, nlen);
    name[nlen] = 0;
    mode_t mode = k + 1 == count ? last_mode : 0755;
    if (mkdirat(parent, name, mode) < 0 && errno != EEXIST) {
      close(parent);
      return -1;
    }
    // Resolved again from the root: what now stands there (made by us, or
    // by whoever won a race) is followed only within the root.
    int next = OpenDirPrefix(rootfd, buf, ends[k]);
    close(parent);
    if (next < 0) return -1;
    parent = next;
  }
  return parent;
}

// Splits "/a/b/c": "c" into name_out; returns the length of "/a/b/", the
// directory part (-1 with errno for an empty or too long last name).
ssize_t SplitName(const char* path, char* name_out) {
  size_t len = Len(path);
  size_t slash = len;
  while (slash > 0 && path[slash - 1] != '/') slash--;
  size_t nlen = len - slash;
  if (nlen == 0 || nlen > NAME_MAX) {
    errno = nlen == 0 ? EINVAL : ENAMETOOLONG;
    return -1;
  }
  Prefix(name_out, path + slash, nlen);
  return static_cast<ssize_t>(slash);
}

// An O_PATH fd of the directory part of `path` (its first `dir_len`
// bytes, "/" if that is all), created if missing.
int OpenDirPart(int rootfd, const char* path, size_t dir_len) {
  char dir[PATH_MAX];
  if (dir_len >= sizeof dir) {
    errno = ENAMETOOLONG;
    return -1;
  }
  Prefix(dir, path, dir_len);
  if (dir_len <= 1) {
    dir[0] = '/';
    dir[1] = 0;
  }
  return EnsureDir(rootfd, dir, 0755);
}

// Splits "/a/b/c" into an O_PATH fd of "/a/b" (created if missing) and "c".
int ParentOf(int rootfd, const char* path, char* name_out) {
  ssize_t dir_len = SplitName(path, name_out);
  return dir_len < 0 ? -1 : OpenDirPart(rootfd, path, static_cast<size_t>(dir_len));
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

// The sources the parent cloned (plan.source_fds), and the next one to take:
// ops consume them in order.
const std::vector<int>* g_source_fds = nullptr;
size_t g_source_cursor = 0;

// The next source the parent cloned (already carrying its mount attributes
// and id mapping); -1 when an optional one is missing.
int TakeSourceFd(const MountOp& m, int op) {
  if (g_source_cursor >= g_source_fds->size()) {
    errno = EBADF;
    Fail(Step::OpSource, op);
  }
  int fd = (*g_source_fds)[g_source_cursor++];
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

// Sets mount attributes (MOUNT_ATTR_*) on the mount `fd`, and with
// `recursive` on every mount under it.
int SetMountAttrs(int fd, uint64_t attrs, bool recursive) {
  struct mount_attr attr;
  memset(&attr, 0, sizeof attr);
  attr.attr_set = attrs;
  return sys::mount_setattr(fd, "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0), &attr, sizeof attr);
}

// Opens the existing target of a remount or a mask (O_PATH and `flags`);
// -1 when an optional one is missing.
int OpenExistingTarget(int rootfd, const MountOp& m, int op, int flags) {
  int fd = OpenInRoot(rootfd, m.dst.c_str(), O_PATH | flags);
  if (fd < 0 && !SkipOptional(m)) Fail(Step::OpTarget, op);
  return fd;
}

void DoBind(const MountOp& m, int op, int rootfd, int oldrootfd) {
  int tree;
  if (m.flags & OP_CLONE_IN_PARENT) {
    tree = TakeSourceFd(m, op);
  } else {
    tree = CloneSource(m, m.src.c_str(), op, rootfd, oldrootfd);
    // One call makes every submount read-only/nosuid/nodev too, so a
    // read-only bind cannot be written through a mount nested inside it.
    uint64_t attrs = MountAttrs(m.flags);
    if (tree >= 0 && attrs && SetMountAttrs(tree, attrs, true) < 0) Fail(Step::OpMount, op);
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

// "/.o/<op>" then `leaf` and `num` (if >= 0) into buf: absolute, since the
// overlay's options show these paths.
void LayerPath(char* buf, size_t cap, int op, const char* leaf, long num) {
  size_t len = 0;
  buf[0] = 0;
  bool ok = Append(buf, cap, len, "/") && Append(buf, cap, len, kBaseLayers) && Append(buf, cap, len, "/") &&
            AppendNum(buf, cap, len, static_cast<unsigned long>(op));
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
  if (mkdir(kBaseLayers, 0700) < 0 && errno != EEXIST) Fail(Step::OpMount, op);
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
  } else if (m.flags & OP_UPPER_TMPFS) {
    // A private tmpfs for this overlay's upper and work: made in the
    // sandbox's user namespace, so its files belong to the sandbox's root.
    LayerPath(path, sizeof path, op, "u", -1);
    AttachLayer(NewFs("tmpfs", m, op, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV), path, op);
    int base = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (base < 0 || mkdirat(base, m.upper.c_str(), 0755) < 0 || mkdirat(base, m.work.c_str(), 0700) < 0)
      Fail(Step::OpMount, op);
    close(base);
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
  if (!m.upper.empty()) {
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

// The directory the last file or symlink op went into, kept open for the
// next one: a host root writes some thirty files into /etc in a row, and
// each reuse saves a lookup and a close. Forgotten before any other op:
// a mount on that directory would hide whatever went in through this fd.
struct {
  char path[PATH_MAX];
  size_t len = 0;
  int fd = -1;
} g_parent;

void ForgetParent() {
  if (g_parent.fd >= 0) close(g_parent.fd);
  g_parent.fd = -1;
}

// ParentOf, through g_parent: the fd stays ours (callers do not close it).
int CachedParentOf(int rootfd, const char* path, char* name_out) {
  ssize_t split = SplitName(path, name_out);
  if (split < 0) return -1;
  size_t dir_len = static_cast<size_t>(split);
  if (g_parent.fd >= 0 && dir_len == g_parent.len && memcmp(path, g_parent.path, dir_len) == 0) return g_parent.fd;
  ForgetParent();
  int fd = OpenDirPart(rootfd, path, dir_len);
  if (fd < 0 || dir_len >= sizeof g_parent.path) return fd;
  Prefix(g_parent.path, path, dir_len);
  g_parent.len = dir_len;
  g_parent.fd = fd;
  return fd;
}

// The umask this process creates files with (SetUpFilesystem reads it).
mode_t g_umask = 022;

void DoSymlink(const MountOp& m, int op, int rootfd) {
  char name[NAME_MAX + 1];
  int parent = CachedParentOf(rootfd, m.dst.c_str(), name);
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
}

void DoWriteFile(const MountOp& m, int op, int rootfd) {
  char name[NAME_MAX + 1];
  int parent = CachedParentOf(rootfd, m.dst.c_str(), name);
  if (parent < 0) Fail(Step::OpTarget, op);
  int fd = openat(parent, name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, m.mode);
  // A file made just now has its mode, unless the umask took some of it
  // (or the mode has bits beyond the permissions); one already there
  // keeps its own until the fchmod() below.
  bool exact_mode = fd >= 0 && (m.mode & ~0777u) == 0 && (m.mode & g_umask) == 0;
  if (fd < 0 && errno == EEXIST) fd = openat(parent, name, O_TRUNC | O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
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
  if (!exact_mode && fchmod(fd, m.mode) < 0) Fail(Step::OpWriteFile, op);
  close(fd);
}

void DoMkdir(const MountOp& m, int op, int rootfd) {
  int fd = EnsureDir(rootfd, m.dst.c_str(), m.mode);
  if (fd < 0) Fail(Step::OpTarget, op);
  close(fd);
}

void DoRemount(const MountOp& m, int op, int rootfd) {
  int fd = OpenExistingTarget(rootfd, m, op, 0);
  if (fd < 0) return;
  // mount_setattr() on a path inside a mount changes that whole mount;
  // insist on a mount root so a remount never reaches further than asked.
  struct statx stx;
  if (sys::statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &stx) < 0) Fail(Step::OpRemount, op);
  if (!(stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT) || !(stx.stx_attributes & STATX_ATTR_MOUNT_ROOT)) {
    errno = EINVAL;
    Fail(Step::OpRemount, op);
  }
  if (SetMountAttrs(fd, MountAttrs(m.flags), true) < 0) Fail(Step::OpRemount, op);
  close(fd);
}

void DoMaskFile(const MountOp& m, int op, int rootfd) {
  int target = OpenExistingTarget(rootfd, m, op, O_NOFOLLOW);
  if (target < 0) return;
  // An empty read-only file of the base tmpfs, so masking works with or
  // without a /dev in the new root.
  int null_fd = open(kBaseMasked, O_PATH | O_CLOEXEC);
  if (null_fd < 0) Fail(Step::OpSource, op);
  int tree = sys::open_tree(null_fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
  if (tree < 0) Fail(Step::OpMount, op);
  if (SetMountAttrs(tree, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, false) < 0) Fail(Step::OpMount, op);
  Attach(tree, target, op);
  close(tree);
  close(null_fd);
  close(target);
}

void DoMaskDir(const MountOp& m, int op, int rootfd) {
  int target = OpenExistingTarget(rootfd, m, op, O_DIRECTORY);
  if (target < 0) return;
  int mnt = NewFs("tmpfs", m, op, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC);
  Attach(mnt, target, op);
  close(mnt);
  close(target);
}

void RunOp(const MountOp& m, int op, int rootfd, int oldrootfd) {
  if (m.kind != OpKind::Symlink && m.kind != OpKind::WriteFile) ForgetParent();
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

}  // namespace

// Builds the sandbox's root and makes it the process root.
void SetUpFilesystem(const Plan& plan) {
  g_source_fds = &plan.source_fds;
  g_source_cursor = 0;
  g_umask = umask(0);
  umask(g_umask);

  // Slave, not shared: host mount events still reach us, but nothing we
  // mount or unmount can propagate back to the host.
  if (mount(nullptr, "/", nullptr, MS_REC | MS_SLAVE, nullptr) < 0) Fail(Step::Propagation);

  // A private tmpfs becomes the root while we work, with the host root at
  // /oldroot: host paths stay reachable (even those under /tmp, which this
  // tmpfs covers only until the pivot moves it) and the final root is
  // assembled at /newroot.
  if (mount("tmpfs", "/tmp", "tmpfs", MS_NODEV | MS_NOSUID, "mode=0755") < 0) Fail(Step::BaseTmpfs);
  if (chdir("/tmp") < 0 || mkdir(kBaseNewRoot, 0755) < 0 || mkdir(kBaseOldRoot, 0755) < 0)
    Fail(Step::BaseTmpfs);
  if (sys::pivot_root(".", kBaseOldRoot) < 0) Fail(Step::PivotToBase);
  if (chdir("/") < 0) Fail(Step::PivotToBase);
  int masked = open(kBaseMasked, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0444);
  if (masked < 0) Fail(Step::BaseTmpfs);
  close(masked);
  // pivot_root() needs the new root to be a mount point.
  if (mount(kBaseNewRoot, kBaseNewRoot, nullptr, MS_BIND | MS_REC, nullptr) < 0) Fail(Step::NewRootMount);

  int oldrootfd = open(kBaseOldRoot, O_PATH | O_DIRECTORY | O_CLOEXEC);
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
      rootfd = open(kBaseNewRoot, O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (rootfd < 0) Fail(Step::NewRootMount, static_cast<int>(i));
    }
    RunOp(m, static_cast<int>(i), rootfd, oldrootfd);
    if (m.dst == "/") {
      close(rootfd);
      rootfd = -1;
    }
  }
  ForgetParent();
  if (rootfd >= 0) close(rootfd);
  close(oldrootfd);

  if (plan.root_readonly) {
    int rootfd = open(kBaseNewRoot, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0 || SetMountAttrs(rootfd, MOUNT_ATTR_RDONLY, false) < 0)
      Fail(Step::RootReadonly);
    close(rootfd);
  }

  // Private before unmounting, or the unmount would propagate to the host.
  if (mount(kBaseOldRoot, kBaseOldRoot, nullptr, MS_REC | MS_PRIVATE, nullptr) < 0) Fail(Step::DetachOldRoot);
  if (umount2(kBaseOldRoot, MNT_DETACH) < 0) Fail(Step::DetachOldRoot);

  if (chdir(kBaseNewRoot) < 0) Fail(Step::PivotRoot);
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

}  // namespace msbx::child
