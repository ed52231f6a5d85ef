// A command started inside a running container, as its runtime's exec would
// start it: in the namespaces of the container's init (mount, UTS, IPC,
// network, cgroup, pid), its cgroups, its root, with the environment and
// working directory given, and re-parented to that init, which reaps it. What
// a rootfs restore runs its recorded command by (docs/CAPTURE-PATHS.md).
//
// The command takes the credentials of the container's init: its uid and
// gid, its capability sets (bounding, effective, permitted, inheritable) and
// its no_new_privs; a seccomp filter the runtime gave the init is not
// copied.
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
