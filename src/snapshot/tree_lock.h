// One checkpoint of a process tree at a time, across processes: two
// `gpusnap checkpoint` runs of one tree would otherwise race into CRIU and
// fail with an error that names neither.
//
// The lock is <run dir>/locks/tree-<pid>-<start time>.lock (the start time
// tells a reused pid from its predecessor), a LockFile (util/lock_file.h):
// taken without waiting, released when it goes or its holder dies.
#pragma once

#include <sys/types.h>

#include "gpusnap/status.h"
#include "util/lock_file.h"

namespace gpusnap {

// kAlreadyExists naming `root` when another checkpoint holds the tree;
// kNotFound when `root` is gone; kIoError when the lock file cannot be made.
Result<LockFile> LockTreeForCheckpoint(pid_t root);

}  // namespace gpusnap
