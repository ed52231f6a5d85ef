// The shim's control thread: it listens on the abstract unix socket
// ControlSocketName(<pid namespace inode>, getpid()) and serves one request
// per connection (gpushare/protocol.h).
#pragma once

namespace gpusnap::gpushare {

// Starts the thread once per process (again in a forked child that calls
// cuInit). Failures are reported on stderr and leave the process running
// without a control socket: gpusnap then treats it as a GPU process without
// the shim.
void StartControlServer();

}  // namespace gpusnap::gpushare
