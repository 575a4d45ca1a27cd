// The child side of a spawn: what runs between clone() and execve().
#pragma once

#include <cstddef>
#include <cstdint>

#include "plan.h"

namespace msbx {

// Each setup step that can fail, and the name the parent reports it by
// (native.stepNames): the parent turns (step, errno, op) into a typed error
// naming the path. One list, so the enum and the names cannot drift apart.
#define MSBX_CHILD_STEPS(X) \
  X(Hostname, "hostname") \
  X(Loopback, "loopback") \
  X(Propagation, "propagation") \
  X(BaseTmpfs, "base-tmpfs") \
  X(PivotToBase, "pivot-to-base") \
  X(OpenOldRoot, "open-old-root") \
  X(NewRootMount, "new-root-mount") \
  X(OpSource, "op-source") \
  X(OpTarget, "op-target") \
  X(OpMount, "op-mount") \
  X(OpSymlink, "op-symlink") \
  X(OpWriteFile, "op-write-file") \
  X(OpRemount, "op-remount") \
  X(RootReadonly, "root-readonly") \
  X(DetachOldRoot, "detach-old-root") \
  X(PivotRoot, "pivot-root") \
  X(Chroot, "chroot") \
  X(ForkInit, "fork-init") \
  X(NewSession, "new-session") \
  X(ControllingTty, "controlling-tty") \
  X(Fds, "fds") \
  X(Rlimit, "rlimit") \
  X(Setgroups, "setgroups") \
  X(Setgid, "setgid") \
  X(Setuid, "setuid") \
  X(Capabilities, "capabilities") \
  X(NoNewPrivs, "no-new-privs") \
  X(Chdir, "chdir") \
  X(Exec, "exec") \
  X(DeathSignal, "death-signal") \
  X(Pty, "pty") \
  X(Setns, "setns") \
  X(Monitor, "monitor") \
  X(InitIds, "init-ids") \
  X(CgroupJoin, "cgroup-join") \
  X(Seccomp, "seccomp")

enum class Step : int32_t {
#define MSBX_STEP_ID(id, name) id,
  MSBX_CHILD_STEPS(MSBX_STEP_ID)
#undef MSBX_STEP_ID
  Count,
};

// The names of the steps, indexed by Step.
extern const char* const kStepNames[static_cast<size_t>(Step::Count)];

// Fixed-size record the child writes to the error pipe; one write() of it
// is atomic (< PIPE_BUF), so the parent never sees half a record.
struct ErrorRecord {
  int32_t step;
  int32_t err;
  int32_t op;          // index into plan.ops, or -1
  int32_t detail_len;  // bytes of kernel detail (fs context log), if any
  char detail[240];
};
static_assert(sizeof(ErrorRecord) == 256, "ErrorRecord layout is part of the JS ABI");

// File descriptors the child inherits, all opened O_CLOEXEC by the parent.
struct ChildFds {
  int sync_read;     // parent writes one byte once uid/gid maps are in place (-1: a pooled child)
  int sync_write;    // the parent's end; the child closes its copy
  int started_write; // the child writes one byte here once it runs (StartChild)
  int err_write;     // ErrorRecord channel; EOF at the parent means exec happened
  int status_write;  // PID 1 writes the main process's wait status here
  int pty_socket;    // plan.pty: the pty master is sent to the parent here
  int control_read;  // Enter: kill-tree and signal requests for the monitor
  int owner_pidfd;   // Node's own pidfd: tells a child whether Node is still alive
  // The top end of a spare stack for the main process, which shares our
  // memory until it execs (CLONE_VM): it costs no copy of Node's page tables.
  char* main_stack;
};

constexpr size_t kChildStackSize = 256 * 1024;

// Sent to a sandbox's PID 1: kill every other process in the sandbox, keep
// the sandbox. (A real-time signal no program is likely to forward.)
constexpr int kSignalKillAll = 64;

// Control bytes the parent writes to a monitor; any other byte is a signal
// number to forward to the command.
constexpr unsigned char kControlKillTree = 0xff;

// A new sandbox: namespaces, mounts, pivot, then PID 1 and the command.
[[noreturn]] void RunChild(const Plan& plan, const ChildFds& fds);

// A command in an existing sandbox: this child joins the namespaces of
// `target_pidfd` (its PID 1) and becomes the command's monitor, a process
// the sandbox cannot see: its command is born inside the sandbox's PID
// namespace, the monitor stays outside it. It reports the command's status
// and kills the command's whole subtree on request, and nothing the sandbox
// does can stop, kill or trace it.
[[noreturn]] void RunEnter(const Plan& plan, const ChildFds& fds, int target_pidfd);

// Where Node's own command line and environment lie in its memory
// (/proc/self/stat fields 48-51); PID 1, a copy of Node, wipes them so that
// /proc/1/cmdline inside shows nothing of the host. Set once by the addon.
void SetHostArgArea(uintptr_t arg_start, uintptr_t arg_end, uintptr_t env_start, uintptr_t env_end);

// Which signal dispositions a clone resets first. By default every one: a
// clone of Node carries Node's handlers, which would write into libuv's
// pipes. The spawner, exec'd with every disposition at its default, calls
// this once at its start: its clones then reset only what it changed (its
// SIGPIPE), sixty-odd syscalls fewer in each PID 1 and monitor.
void RecordChangedSignals();

}  // namespace msbx
