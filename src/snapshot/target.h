// What a checkpoint takes: a workload, a pid, a container or a pod's
// container, named where the request entered (TargetSpec) and resolved here,
// for every front door alike, to a process tree and the namespace CRIU must
// run in to dump it.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "container/containers.h"

#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"

namespace gpusnap {

// What a request names to checkpoint, parsed where it entered.
struct TargetSpec {
  enum class Kind { kWorkload, kPid, kContainer, kPod };
  Kind kind = Kind::kWorkload;
  std::string workload;         // kWorkload: a workload name (gpusnap ps)
  pid_t pid = 0;                // kPid: a host pid, the root of the tree
  std::string container;        // kContainer: a container id or a unique prefix (12-64 lowercase hex)
  container::PodRef pod;        // kPod: a pod's container, as the kubelet names it
  static TargetSpec Workload(std::string name);
  static TargetSpec Pid(pid_t pid);
  static TargetSpec Container(std::string id);
  static TargetSpec Pod(container::PodRef pod);
  // As written: the name, the pid, the id, or namespace/pod/container.
  std::string ToString() const;
};

// Pure: the CLI's target argument. Digits are a pid; 12-64 lowercase hex
// digits a container id, unless `is_workload` says a workload has that name;
// anything else a workload name (kInvalidArgument when it cannot be one).
Result<TargetSpec> ParseTargetArgument(std::string_view text,
                                       const std::function<bool(std::string_view)>& is_workload);

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
  std::string container_id;     // the container the tree runs in (its cgroup's), if any
};

// Pure: the process a checkpoint holds stopped while CRIU dumps `target`, or
// 0 for none. When the dump ends by killing the tree, a container's init
// that exits with its last child (sh, tini) would take the namespace, and
// CRIU in it, down before CRIU answers: such an init (the parent of the root
// and the init of its namespace, not a gpusnap reaper, which outlives its
// tree) is held until the dump is over. None with --leave-running.
pid_t InitToHoldDuringDump(const Target& target, bool leave_running);

// Pure: what a generated snapshot id of `target` starts with, for every front
// door: a workload's name, "ctr-" and a container's first 12 id digits, else
// "pid" and the root's pid.
std::string SnapshotIdPrefix(const Target& target);

// kNotFound: no such workload, pid, container or pod (or it has exited).
// kFailedPrecondition: the pid is a namespace's init (the reaper), a kernel
// thread, or gpusnap itself; a container whose init holds no one tree.
// kInvalidArgument: an ambiguous container id prefix. A pid that gpusnap
// started resolves as its workload. `kubelet_log_dir`: where a pod's
// container is found (the kubelet's log links).
Result<Target> ResolveTarget(const TargetSpec& spec, const std::string& kubelet_log_dir = "/var/log/containers");

// Pure but for the clock and the host's name: the metadata of a snapshot of
// `target` that snapshot `id` starts from (source, host, kernel, pids).
SnapshotMeta DescribeSource(const Target& target, const std::string& id, const std::string& criu_version,
                            bool tcp_established);

}  // namespace gpusnap
