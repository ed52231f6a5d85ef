// The processes of this node and the containers they run in, found through
// /proc and cgroups (container/cgroup.h), and a container's process tree: what a
// checkpoint of a container takes.
//
// A container's tree is dumped from inside its own pid namespace, as gpusnap
// dumps the workloads it runs: the container's init (pid 1 there) stays, the
// tree under it is checkpointed. A container whose init is its only process,
// or whose init runs several trees, is refused with kFailedPrecondition.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "container/cgroup.h"
#include "gpusnap/status.h"

namespace gpusnap::container {

// A container of a pod, as the kubelet names it.
struct PodRef {
  std::string namespace_name;  // DNS-1123 label
  std::string name;            // DNS-1123 subdomain
  std::string container;       // DNS-1123 label
};

struct NodeProcess {
  pid_t pid = 0;
  pid_t ppid = 0;
  uint64_t start_time = 0;
  bool namespace_init = false;  // pid 1 of a pid namespace other than ours
  std::string container_id;     // empty: in no container
  std::string pod_uid;
  std::string command;          // /proc/<pid>/comm
};

// Every process of the node (those that vanish while read are skipped).
std::vector<NodeProcess> ScanProcesses();

// The kubelet's log links in `log_dir`, by container id (none if unreadable).
std::map<std::string, KubeletLogName> KubeletContainers(const std::string& log_dir);

// The full id of the one container whose id starts with `prefix`.
// kNotFound: no process is in such a container; kInvalidArgument: ambiguous.
Result<std::string> ExpandContainerId(const std::vector<NodeProcess>& processes, const std::string& prefix);

// The host pid of container `id`'s init (pid 1 of its pid namespace). Pure.
// kNotFound when it has none; kFailedPrecondition when it holds several.
Result<pid_t> ContainerInit(const std::vector<NodeProcess>& processes, const std::string& id);

// The pid whose tree a checkpoint of container `id` takes: the one child of
// the container's init. Pure. kNotFound, kFailedPrecondition (see above).
Result<pid_t> ContainerTreeRoot(const std::vector<NodeProcess>& processes, const std::string& id);

// The id of a pod's container, from the kubelet's log links in `log_dir`
// (/var/log/containers: "<pod>_<namespace>_<container>-<id>.log"); of several
// (restarts), the one with running processes. kNotFound naming the pod.
Result<std::string> ContainerIdOfPod(const std::string& log_dir, const PodRef& pod,
                                     const std::vector<NodeProcess>& processes);

}  // namespace gpusnap::container
