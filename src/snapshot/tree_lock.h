// One checkpoint of a process tree at a time, across processes: two
// `gpusnap checkpoint` runs of one tree would otherwise race into CRIU and
// fail with an error that names neither.
//
// The lock is an flock on <run dir>/locks/tree-<pid>-<start time>.lock (the
// start time tells a reused pid from its predecessor), taken without waiting,
// released when the TreeLock is destroyed (or its holder dies).
#pragma once

#include <sys/types.h>

#include <string>

#include "gpusnap/status.h"
#include "util/fd.h"

namespace gpusnap {

class TreeLock {
 public:
  // kAlreadyExists naming `root` when another checkpoint holds the tree;
  // kNotFound when `root` is gone; kIoError when the lock file cannot be made.
  static Result<TreeLock> Acquire(pid_t root);

  TreeLock(TreeLock&&) noexcept = default;
  TreeLock& operator=(TreeLock&&) noexcept = default;
  ~TreeLock();

 private:
  TreeLock(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  std::string path_;
  UniqueFd fd_;
};

}  // namespace gpusnap
