// What CRIU cannot take, found before anything is frozen: a tree holding it
// is refused up front, naming the process and the file, instead of failing
// halfway through the dump with CRIU's log as the only explanation.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap {

struct ProcessFiles {
  pid_t pid = 0;
  std::vector<std::string> cmdline;
  std::vector<std::pair<int, std::string>> fds;  // descriptor, what /proc/<pid>/fd says it is
  std::vector<std::string> mapped;                // the path column of /proc/<pid>/maps
};

// kFailedPrecondition naming the first process that holds what CRIU cannot
// checkpoint (an io_uring instance, open or only mapped), and what to do
// about it; Ok otherwise.
Status CheckCheckpointable(const std::vector<ProcessFiles>& tree);

// What each process of `tree` has open and mapped, read from /proc once for
// every check of a checkpoint (this one, TreeListeningPorts).
std::vector<ProcessFiles> ReadProcessFiles(const std::vector<pid_t>& tree);

// The TCP ports the tree listens on (its sockets, as the network namespace of
// its first process shows them; net/tcp_ports.h), for a restore to free.
std::vector<uint16_t> TreeListeningPorts(const std::vector<ProcessFiles>& tree);

}  // namespace gpusnap
