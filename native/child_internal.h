// What the child's files share: error reporting, bounded string building,
// and each file's entry points. Internal to the child; the addon sees only
// child.h.
//
// Everything declared here runs between clone() and execve() in a copy of
// multithreaded Node: raw, async-signal-safe syscalls only, no allocation,
// no exceptions (see child.cc).
#pragma once

#include <errno.h>
#include <string.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "child.h"

namespace msbx::child {

// The base tmpfs: the child's root while the sandbox's root is assembled
// (SetUpFilesystem). The names are relative to the base's root, which is the
// child's cwd from the moment the base is mounted until the pivot out of it.
constexpr char kBaseNewRoot[] = "newroot";  // the sandbox's root, assembled here
constexpr char kBaseOldRoot[] = "oldroot";  // the host's root, until detached
constexpr char kBaseLayers[] = ".o";        // an overlay's layers: /.o/<op>/l<i>, /.o/<op>/u
constexpr char kBaseMasked[] = "masked";    // the empty read-only file a mask-file op binds

// The error pipe (ChildFds::err_write); a global so that every step can
// report without threading it through. Set by StartChild, moved above the
// command's fds by WireFds; each child is single-threaded.
inline int g_err_fd = -1;

// Writes one ErrorRecord to the error pipe.
void Report(Step step, int err, int op, const char* detail, size_t detail_len);

// Reports `step` with `err` (errno by default) and exits: the parent turns
// the record into a typed error naming the step, the path and errno.
[[noreturn]] void Fail(Step step, int op = -1, int err = errno);

// Bounded string building without allocation: each returns false (and
// leaves `buf` terminated) when the result would not fit in `cap`.
inline size_t Len(const char* s) {
  size_t n = 0;
  while (s[n]) n++;
  return n;
}

inline bool Append(char* buf, size_t cap, size_t& len, const char* s) {
  size_t n = Len(s);
  if (len + n + 1 > cap) return false;
  memcpy(buf + len, s, n + 1);
  len += n;
  return true;
}

inline bool AppendNum(char* buf, size_t cap, size_t& len, unsigned long v) {
  char digits[24];
  int d = 0;
  do digits[d++] = static_cast<char>('0' + v % 10); while ((v /= 10) > 0);
  char text[24];
  for (int i = 0; i < d; i++) text[i] = digits[d - 1 - i];
  text[d] = 0;
  return Append(buf, cap, len, text);
}

// child_mounts.cc: builds the sandbox's root from the mount plan and makes
// it the process root.
void SetUpFilesystem(const Plan& plan);

// child_exec.cc: the process.
//
// Closes every fd but the `n` in `keep` (sorted here, in place).
void CloseAllExcept(int* keep, size_t n);
void CloseAllExcept(int a);
// Takes the ids with raw syscalls; a failure is reported as `gid_step` or
// `uid_step`.
void SetIds(uint32_t uid, uint32_t gid, bool keep_caps, Step gid_step, Step uid_step);
// (Re)arms the parent-death signal and exits if Node (`owner_pidfd`, when
// >= 0) is already gone.
void DieWithParent(int owner_pidfd);
// Allocates the terminal in the sandbox's devpts and sends its master to
// the parent over `sock`.
void OpenSandboxPty(const Plan& plan, int sock);
// Starts the main process on fds.main_stack, sharing our memory until it
// execs; `subreaper`: it keeps its daemonized descendants (for a monitor's
// kill).
pid_t StartMain(const Plan& plan, const ChildFds& fds, bool subreaper);
// Sets up the process and execs the command.
[[noreturn]] void ExecMain(const Plan& plan, const ChildFds& fds);

// child_init.cc: the processes that stay behind.
//
// Wipes Node's command line and environment from PID 1's copy of them.
void WipeHostArgs();
// PID 1 of a sandbox; main_pid < 0: a persistent sandbox's, which only reaps.
[[noreturn]] void RunInit(pid_t main_pid, int status_fd);
// The monitor of a command in an existing sandbox.
[[noreturn]] void RunMonitor(pid_t main_pid, int status_fd, int control_fd, int procfd);

}  // namespace msbx::child
