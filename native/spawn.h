// The parent's side of a spawn, without N-API: clone the child, write its id
// maps, release it. Two callers run it: the addon itself (the in-process
// path, MINISANDBOX_SPAWNER=inprocess) and the spawner (native/spawner.cc),
// a small process of its own whose clones cost the same whatever Node's heap.
#pragma once

#include <sys/types.h>

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "plan.h"

namespace msbx {

// What a spawn asks for, beyond the plan: the child's ends of the channels
// the caller made (all fds of the process that runs CloneSandbox). The plan's
// own fds (plan.fds sources, plan.cgroup_fds) are fds of that process too.
struct SpawnRequest {
  Plan plan;
  bool enter = false;
  int target_pidfd = -1;   // enter: the sandbox's PID 1
  int err_write = -1;      // ErrorRecord channel
  int status_write = -1;   // PID 1's (or the monitor's) report of the wait status
  int pty_socket = -1;     // plan.pty: the terminal's master goes out here
  int control_read = -1;   // enter: the monitor's control channel
  // plan.prefix_ops is the one the spawner got last and keeps: the request
  // names it instead of carrying it again (see wire.cc).
  bool prefix_cached = false;
};

struct SpawnReply {
  long pid = -1;
  int pidfd = -1;  // owned by the caller on success
  // Sources cloned for an idmapped mount whose filesystem refused the
  // mapping: {op index, errno}.
  std::vector<std::pair<int, int>> idmap_fallbacks;
  // On failure: what failed, and its errno (0: none, `what` says it all).
  int err = 0;
  std::string what;
  // The spawner died before it answered (set by the addon's client).
  bool spawner_died = false;
};

// Clones the child (RunChild, or RunEnter into request.target_pidfd), clones
// the host sources the plan asks the parent for, writes the child's id maps
// and releases it. False with reply.err/what on failure; the child, if it
// was made, is killed and reaped. The caller keeps (and closes) every fd of
// `request`.
bool CloneSandbox(SpawnRequest& request, SpawnReply& reply);

// A child cloned before its request, which the spawner keeps one of for new
// sandboxes and one for monitors (`enter`). A sandbox's has its namespaces
// made and its id maps written, and waits on its socket for a request with
// the same namespaces and maps. Why: making the namespaces is the dearest
// step of a start (the network namespace above all, about a millisecond on
// the machines this was measured on), and a clone's first steps are slow
// where page faults are (a hypervisor shadowing page tables): both are paid
// while the caller does other things, not on the start's path. The child is
// a copy of the spawner as it was then, mount table included: the spawner
// hands it a new sandbox only while the host's mounts are unchanged since
// (see spawner.cc).
struct PooledChild {
  long pid = -1;
  int pidfd = -1;
  int sock = -1;        // ours: the request goes out here, the child's start byte comes back
  std::string key;      // PoolKey of the plan it was made for
  const void* prefix = nullptr;  // the spawner's kept prefix when it was made (spawner.cc)
};

// What a pooled child shares with the plan it was made for, and must share
// with a plan to serve it: for a new sandbox the namespaces and the id maps;
// a monitor (`enter`) is made in none, for any command.
std::string PoolKey(const Plan& plan, bool enter);

// Clones `pool` for plans like `plan`; the child runs `entry` with its end
// of the socket, and never returns. False with `error` if it cannot be made
// (the pool stays empty; the next request clones as usual).
bool ClonePooledChild(const Plan& plan, bool enter, void (*entry)(int sock), PooledChild& pool, std::string& error);

// CloneSandbox's work done with the pooled child instead of a new clone:
// clones the plan's host sources, sends them with the request (`payload`
// and `fds` as received) and waits until the child runs. The pool is empty
// afterwards, whatever happens. True once the request is handled as
// CloneSandbox would (reply.pid, or reply.what); false if the child was
// gone (killed meanwhile): nothing of the request was used, and the caller
// clones it as usual.
bool HandOffSandbox(SpawnRequest& request, const std::string& payload, const std::vector<int>& fds, PooledChild& pool,
                    SpawnReply& reply);

// Kills the pooled child, if any (the spawner reaps it).
void DiscardPooledChild(PooledChild& pool);

// This process's own pidfd, which every child inherits (see DieWithParent).
int OwnerPidfd();

// One fd a helper program starts with: `target` opened from `path`, or a
// copy (dup2) of our `source`.
struct HelperFd {
  int target;
  const char* path;  // nullptr: a copy of `source`
  int open_flags;
  int source;
  static HelperFd Open(int target, const char* path, int flags) { return {target, path, flags, -1}; }
  static HelperFd Dup(int source, int target) { return {target, nullptr, 0, source}; }
};

// Starts a helper program of ours (the spawner, newuidmap/newgidmap) with
// `argv`, an empty environment, `fds` set up in order, default signal
// dispositions and an empty signal mask: Node and the spawner block and
// handle signals of their own, none of which the helper should inherit.
// posix_spawn, in glibc a CLONE_VM|CLONE_VFORK clone: no copy of the
// caller's page tables, and safe in threaded Node. The caller waits for it
// by its pid (libuv reaps only its own children). The pid, or -errno.
pid_t SpawnHelper(const char* file, char* const argv[], std::initializer_list<HelperFd> fds);

// "what: ENOENT (No such file or directory)".
std::string ErrnoText(const std::string& what, int err);

// Reads where this process's argv and environment lie (/proc/self/stat)
// for PID 1 to wipe them in its copy (SetHostArgArea).
void ReadHostArgArea();

}  // namespace msbx
