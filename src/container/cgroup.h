// Which container and pod a process belongs to, read from its cgroup path
// (/proc/<pid>/cgroup) the way the kubelet and the runtimes name cgroups, so
// the agent needs no runtime API. Pure functions over text.
//
// Recognised (cgroup v2 "0::<path>" and every v1 "N:controllers:<path>"):
//   containerd, systemd driver  .../kubepods-besteffort-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope
//   CRI-O, systemd driver       .../kubepods-pod<uid_with_underscores>.slice/crio-<id>.scope
//   docker, systemd driver      .../docker-<id>.scope
//   any runtime, cgroupfs       /kubepods/burstable/pod<uid>/<id>, /docker/<id>, /<anything>/<id>
// where <id> is 64 lowercase hex digits (crio-conmon-<id>.scope is CRI-O's
// monitor, not the container, and is not matched).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gpusnap::container {

struct CgroupIdentity {
  std::string container_id;  // 64 hex digits, empty when the process is in no container
  std::string pod_uid;       // with dashes, empty when not in a Kubernetes pod
};

// The container id one cgroup path component names, if it names one.
std::optional<std::string> ContainerIdFromComponent(std::string_view component);
// The pod uid one component names ("pod<uid>" or "kubepods-...-pod<uid_>.slice").
std::optional<std::string> PodUidFromComponent(std::string_view component);

// The identity of a process from the whole text of /proc/<pid>/cgroup: the
// innermost container id on any line, and the pod uid above it.
CgroupIdentity ParseProcCgroup(std::string_view text);

// The cgroup.procs files of the cgroups a process is in, from the text of its
// /proc/<pid>/cgroup and of /proc/self/mountinfo: for "0::<path>" the cgroup2
// mount, for a v1 line "N:<controllers>:<path>" the cgroup mount whose options
// name all of those controllers. Hierarchies mounted nowhere here are left
// out; a mount of a subtree ("root" field) is used only when the path lies
// under it. Writing "0" to each file moves the writer into the same cgroups.
std::vector<std::string> CgroupProcsFiles(std::string_view proc_cgroup, std::string_view mountinfo);

// A kubelet log link name in /var/log/containers:
// "<pod>_<namespace>_<container>-<64 hex id>.log".
struct KubeletLogName {
  std::string pod;
  std::string namespace_name;
  std::string container;
  std::string container_id;
};
std::optional<KubeletLogName> ParseKubeletLogName(std::string_view file_name);

}  // namespace gpusnap::container
