// A restore into a running container: the container's init must be an idle
// `gpusnap __placeholder` (ns/reaper.h), whose pid and mount namespaces CRIU
// enters and whose cgroups CRIU joins, so the restored tree becomes the
// container's. The container is found by id through /proc and cgroups, as the
// agent finds containers (container/containers.h).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap {

// True when `argv` (a process's /proc/<pid>/cmdline) is `<gpusnap> __placeholder`.
bool IsPlaceholderCommand(const std::vector<std::string>& argv);

// OK when the init of `container` (host pid `init`, command line `init_argv`)
// is a placeholder and no other process (`others_in_namespace`) is in its pid
// namespace yet; else kFailedPrecondition "container X is not an idle gpusnap
// placeholder: <why>". Pure.
Status CheckIdlePlaceholder(const std::string& container, pid_t init, const std::vector<std::string>& init_argv,
                            size_t others_in_namespace);

struct PlaceholderTarget {
  std::string container_id;               // the full id
  pid_t init_pid = 0;                     // as the host sees it: CRIU's namespace holder
  std::vector<std::string> cgroup_procs;  // the init's cgroup.procs files, which CRIU joins
};

// Resolves `container` (an id, or a unique prefix of one) to its idle
// placeholder. kNotFound for no such container; kInvalidArgument for an
// ambiguous prefix; kFailedPrecondition for an init that is no idle
// placeholder, or whose cgroups cannot be found. Reads only.
Result<PlaceholderTarget> FindIdlePlaceholder(const std::string& container);

}  // namespace gpusnap
