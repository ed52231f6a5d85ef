#include "snapshot/placeholder.h"

#include <filesystem>

#include "container/cgroup.h"
#include "container/containers.h"
#include "proc/proc.h"
#include "util/files.h"

namespace gpusnap {

bool IsPlaceholderCommand(const std::vector<std::string>& argv) {
  return argv.size() == 2 && argv[1] == "__placeholder" &&
         std::filesystem::path(argv[0]).filename().string().starts_with("gpusnap");
}

Status CheckIdlePlaceholder(const std::string& container, pid_t init, const std::vector<std::string>& init_argv,
                            size_t others_in_namespace) {
  auto refuse = [&](const std::string& why) {
    return Status::Error(Code::kFailedPrecondition, "container {} is not an idle gpusnap placeholder: {}", container,
                         why);
  };
  if (!IsPlaceholderCommand(init_argv)) {
    std::string command;
    for (const auto& a : init_argv) command += (command.empty() ? "" : " ") + a;
    return refuse(fmt::format("its init (pid {}) runs `{}`, not `gpusnap __placeholder`", init, command));
  }
  if (others_in_namespace > 0)
    return refuse(fmt::format("its pid namespace already holds {} process(es) besides its init (pid {}); a "
                              "placeholder takes one restore",
                              others_in_namespace, init));
  return Status::Ok();
}

Result<PlaceholderTarget> FindIdlePlaceholder(const std::string& container) {
  std::vector<container::NodeProcess> processes = container::ScanProcesses();
  PlaceholderTarget out;
  GPUSNAP_ASSIGN_OR_RETURN(out.container_id, container::ExpandContainerId(processes, container));
  GPUSNAP_ASSIGN_OR_RETURN(out.init_pid, container::ContainerInit(processes, out.container_id));
  uint64_t pid_ns = proc::NamespaceId(out.init_pid, "pid");
  if (pid_ns == 0) return Status::Error(Code::kNotFound, "container {}'s init (pid {}) is gone", container, out.init_pid);
  // Every process in the namespace, not only the init's children: a CRIU that
  // entered it to restore is not the init's child.
  size_t others = 0;
  for (const auto& p : processes)
    if (p.pid != out.init_pid && proc::NamespaceId(p.pid, "pid") == pid_ns) ++others;
  GPUSNAP_RETURN_IF_ERROR(
      CheckIdlePlaceholder(out.container_id, out.init_pid, proc::Cmdline(out.init_pid), others));
  auto cgroup = ReadFile("/proc/" + std::to_string(out.init_pid) + "/cgroup");
  auto mountinfo = ReadFile("/proc/self/mountinfo");
  if (!cgroup.ok()) return cgroup.status().Wrap(fmt::format("reading container {}'s cgroups", container));
  if (!mountinfo.ok()) return mountinfo.status().Wrap("reading the mounts");
  out.cgroup_procs = container::CgroupProcsFiles(*cgroup, *mountinfo);
  if (out.cgroup_procs.empty())
    return Status::Error(Code::kFailedPrecondition,
                         "container {}'s cgroups (of its init, pid {}) are mounted nowhere gpusnap can see", container,
                         out.init_pid);
  return out;
}

}  // namespace gpusnap
