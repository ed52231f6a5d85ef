// A container's cgroup frozen while its filesystem is read, so that a rootfs
// capture is one moment's: cgroup v2's cgroup.freeze where the process's v2
// cgroup has one, else the v1 freezer controller. The freeze is the cgroup's,
// not the processes': a child forked during it is frozen too, and nothing the
// processes can do (signals, ptrace) ends it early.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "gpusnap/status.h"

namespace gpusnap::container {

class FrozenCgroup {
 public:
  // Freezes the cgroup of host pid `pid` and waits for every task in it to be
  // frozen. kFailedPrecondition for a process in a root cgroup (nothing to
  // freeze it by), in gpusnap's own cgroup, or in none with a freezer;
  // kTimeout when its tasks are not all frozen in `timeout` (then thawed).
  static Result<FrozenCgroup> Freeze(pid_t pid, std::chrono::milliseconds timeout);

  FrozenCgroup(FrozenCgroup&& other) noexcept;
  FrozenCgroup& operator=(FrozenCgroup&&) = delete;
  FrozenCgroup(const FrozenCgroup&) = delete;
  ~FrozenCgroup();  // thaws, if Thaw was not called

  Status Thaw();
  const std::string& dir() const { return dir_; }

 private:
  FrozenCgroup(std::string dir, bool v2) : dir_(std::move(dir)), v2_(v2) {}
  std::string dir_;  // the cgroup's directory
  bool v2_ = true;
  bool frozen_ = true;
};

}  // namespace gpusnap::container
