// The shim's control thread: it listens on the abstract unix socket
// ControlSocketName(<pid namespace inode>, getpid()) and serves one request
// per connection (gpushare/common/protocol.h).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>

namespace gpusnap::gpushare::shim {

// Starts the thread once per process (again in a forked child that calls
// cuInit). Failures are reported on stderr and leave the process running
// without a control socket: gpusnap then treats it as a GPU process without
// the shim.
void StartControlServer();

// The (pid namespace inode, pid) the socket was named with when it was bound:
// still its name after a restore into another namespace. nullopt without one.
struct ControlSocketId {
  uint64_t pid_namespace_inode = 0;
  int pid = 0;
  uint32_t generation = 0;
};
std::optional<ControlSocketId> ControlSocketIdentity();

}  // namespace gpusnap::gpushare::shim
