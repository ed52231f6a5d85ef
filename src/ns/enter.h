// A command started inside a running container, as its runtime's exec would
// start it: in the namespaces of the container's init (mount, UTS, IPC,
// network, cgroup, pid), its cgroups, its root, with the environment and
// working directory given, and re-parented to that init, which reaps it. What
// a rootfs restore runs its recorded command by (docs/CAPTURE-PATHS.md).
//
// The command runs with gpusnap's credentials inside those namespaces but
// the init's uid and gid: the container's own seccomp filter and
// capability set are not copied (the placeholder holds none of its own to
// copy from: it is gpusnap too).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::ns {

struct ContainerCommand {
  pid_t init = 0;                         // host pid of the container's init
  std::vector<std::string> argv;          // argv[0] without a `/` is looked up in env's PATH
  std::vector<std::string> env;
  std::string cwd = "/";                  // inside the container
  std::vector<std::string> cgroup_procs;  // host paths of the cgroup.procs files it joins
};

// Starts it and returns its host pid once it has exec'd. The init's stdout
// and stderr are its own (the container's log). kNotSupported for a
// container in a user namespace other than ours; exec's errno naming
// argv[0] when it cannot run (nothing is left running then).
Result<pid_t> SpawnInContainer(const ContainerCommand& command);

}  // namespace gpusnap::ns
