#include "container/containers.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "container/cgroup.h"
#include "proc/proc.h"
#include "util/files.h"

namespace gpusnap::container {

std::vector<NodeProcess> ScanProcesses() {
  std::vector<NodeProcess> out;
  uint64_t our_pid_ns = proc::NamespaceId(::getpid(), "pid");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) continue;
    pid_t pid = std::atoi(name.c_str());
    auto stat = proc::ReadStat(pid);
    auto cgroup = ReadFile("/proc/" + name + "/cgroup");
    if (!stat.ok() || !cgroup.ok()) continue;
    NodeProcess p;
    p.pid = pid;
    p.ppid = stat->ppid;
    p.start_time = stat->start_time;
    CgroupIdentity id = ParseProcCgroup(*cgroup);
    p.container_id = std::move(id.container_id);
    p.pod_uid = std::move(id.pod_uid);
    if (auto nspids = proc::NsPids(pid); nspids.ok() && nspids->size() > 1 && nspids->back() == 1)
      p.namespace_init = proc::NamespaceId(pid, "pid") != our_pid_ns;
    if (auto comm = ReadFile("/proc/" + name + "/comm"); comm.ok()) {
      p.command = *comm;
      while (!p.command.empty() && p.command.back() == '\n') p.command.pop_back();
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::map<std::string, KubeletLogName> KubeletContainers(const std::string& log_dir) {
  std::map<std::string, KubeletLogName> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(log_dir, ec))
    if (auto name = ParseKubeletLogName(entry.path().filename().string())) out[name->container_id] = *name;
  return out;
}

Result<std::string> ExpandContainerId(const std::vector<NodeProcess>& processes, const std::string& prefix) {
  std::string found;
  for (const auto& p : processes) {
    if (p.container_id.compare(0, prefix.size(), prefix) != 0 || p.container_id.size() < prefix.size()) continue;
    if (!found.empty() && found != p.container_id)
      return Status::Error(Code::kInvalidArgument, "container id `{}` is ambiguous: `{}` and `{}` both start with it",
                           prefix, found, p.container_id);
    found = p.container_id;
  }
  if (found.empty()) return Status::Error(Code::kNotFound, "no running process is in container `{}`", prefix);
  return found;
}

Result<pid_t> ContainerInit(const std::vector<NodeProcess>& processes, const std::string& id) {
  std::vector<pid_t> inits;
  for (const auto& p : processes)
    if (p.container_id == id && p.namespace_init) inits.push_back(p.pid);
  if (inits.empty())
    return Status::Error(Code::kNotFound, "container `{}` has no process that is the init of a pid namespace", id);
  if (inits.size() > 1)
    return Status::Error(Code::kFailedPrecondition,
                         "container `{}` holds {} pid namespaces; which one is meant is unclear", id, inits.size());
  return inits.front();
}

Result<pid_t> ContainerTreeRoot(const std::vector<NodeProcess>& processes, const std::string& id) {
  GPUSNAP_ASSIGN_OR_RETURN(pid_t init_pid, ContainerInit(processes, id));
  const NodeProcess& init = *std::find_if(processes.begin(), processes.end(),
                                          [&](const NodeProcess& p) { return p.pid == init_pid; });
  std::vector<pid_t> children;
  for (const auto& p : processes)
    if (p.ppid == init.pid) children.push_back(p.pid);
  if (children.empty())
    return Status::Error(Code::kFailedPrecondition,
                         "container `{}`'s init (pid {}, `{}`) is its only process: gpusnap checkpoints the tree under "
                         "a container's init, so run the workload under one (tini, dumb-init, `sh -c`)",
                         id, init.pid, init.command);
  if (children.size() > 1)
    return Status::Error(Code::kFailedPrecondition,
                         "container `{}`'s init (pid {}) runs {} process trees; gpusnap checkpoints exactly one", id,
                         init.pid, children.size());
  return children.front();
}

Result<std::string> ContainerIdOfPod(const std::string& log_dir, const PodRef& pod,
                                     const std::vector<NodeProcess>& processes) {
  std::vector<std::string> candidates;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(log_dir, ec)) {
    auto name = ParseKubeletLogName(entry.path().filename().string());
    if (name && name->pod == pod.name && name->namespace_name == pod.namespace_name && name->container == pod.container)
      candidates.push_back(name->container_id);
  }
  if (ec)
    return Status::Error(Code::kNotFound,
                         "cannot find container `{}` of pod `{}/{}`: reading the kubelet's log links in `{}`: {}",
                         pod.container, pod.namespace_name, pod.name, log_dir, ec.message());
  for (const auto& id : candidates)
    for (const auto& p : processes)
      if (p.container_id == id) return id;
  return Status::Error(Code::kNotFound, "no running container `{}` of pod `{}/{}` on this node ({} log links in `{}`)",
                       pod.container, pod.namespace_name, pod.name, candidates.size(), log_dir);
}

}  // namespace gpusnap::container
