// Raw syscall wrappers for the calls glibc 2.36 lacks or that we want
// without any libc bookkeeping. All are async-signal-safe.
#pragma once

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace msbx::sys {

inline long openat2(int dirfd, const char* path, struct open_how* how, size_t size) {
  return syscall(SYS_openat2, dirfd, path, how, size);
}
inline int open_tree(int dirfd, const char* path, unsigned flags) {
  return static_cast<int>(syscall(SYS_open_tree, dirfd, path, flags));
}
inline int move_mount(int from_dirfd, const char* from, int to_dirfd, const char* to, unsigned flags) {
  return static_cast<int>(syscall(SYS_move_mount, from_dirfd, from, to_dirfd, to, flags));
}
inline int fsopen(const char* fstype, unsigned flags) {
  return static_cast<int>(syscall(SYS_fsopen, fstype, flags));
}
inline int fsconfig(int fd, unsigned cmd, const char* key, const void* value, int aux) {
  return static_cast<int>(syscall(SYS_fsconfig, fd, cmd, key, value, aux));
}
inline int fsmount(int fd, unsigned flags, unsigned attrs) {
  return static_cast<int>(syscall(SYS_fsmount, fd, flags, attrs));
}
inline int mount_setattr(int dirfd, const char* path, unsigned flags, struct mount_attr* attr, size_t size) {
  return static_cast<int>(syscall(SYS_mount_setattr, dirfd, path, flags, attr, size));
}
inline int pivot_root(const char* new_root, const char* put_old) {
  return static_cast<int>(syscall(SYS_pivot_root, new_root, put_old));
}
inline int close_range(unsigned first, unsigned last, unsigned flags) {
  return static_cast<int>(syscall(SYS_close_range, first, last, flags));
}
inline int statx(int dirfd, const char* path, int flags, unsigned mask, struct statx* buf) {
  return static_cast<int>(syscall(SYS_statx, dirfd, path, flags, mask, buf));
}
// The raw id syscalls: glibc's wrappers broadcast the change to every thread
// the process had (__nptl_setxid), which in a clone of multithreaded Node
// means signalling threads that exist only in the parent.
inline int setgroups_none() { return static_cast<int>(syscall(SYS_setgroups, 0, nullptr)); }
inline int setresgid(gid_t gid) { return static_cast<int>(syscall(SYS_setresgid, gid, gid, gid)); }
inline int setresuid(uid_t uid) { return static_cast<int>(syscall(SYS_setresuid, uid, uid, uid)); }
inline int pidfd_send_signal(int pidfd, int sig) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

}  // namespace msbx::sys
