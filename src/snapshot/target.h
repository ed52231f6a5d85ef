// What a checkpoint takes: a workload name or a pid, resolved to a process
// tree and the namespace CRIU must run in to dump it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"

namespace gpusnap {

struct Target {
  std::string name;             // workload name, empty for a bare pid
  pid_t host_pid = 0;           // root of the tree
  pid_t ns_pid = 0;             // the same task inside its pid namespace
  pid_t ns_holder = 0;          // a process whose pid+mnt namespaces CRIU enters; 0 = ours
  std::vector<pid_t> tree;      // host pids, root first
  std::vector<std::string> cmdline;
  std::string log;
  std::string started;
  bool shell_job = false;       // the root's session leader is outside the tree
  pid_t parent = 0;             // the root's parent, as the host sees it
  bool workload = false;        // a workload gpusnap started or restored (under its own reaper)
};

// Pure: the process a checkpoint holds stopped while CRIU dumps `target`, or
// 0 for none. When the dump ends by killing the tree, a container's init
// that exits with its last child (sh, tini) would take the namespace, and
// CRIU in it, down before CRIU answers: such an init (the parent of the root
// and the init of its namespace, not a gpusnap reaper, which outlives its
// tree) is held until the dump is over. None with --leave-running.
pid_t InitToHoldDuringDump(const Target& target, bool leave_running);

// kNotFound: no such workload or pid (or it has exited).
// kFailedPrecondition: the pid is a namespace's init (the reaper), or gpusnap itself.
Result<Target> ResolveTarget(const std::string& name_or_pid);

// Pure but for the clock and the host's name: the metadata of a snapshot of
// `target` that snapshot `id` starts from (source, host, kernel, pids).
SnapshotMeta DescribeSource(const Target& target, const std::string& id, const std::string& criu_version,
                            bool tcp_established);

}  // namespace gpusnap
