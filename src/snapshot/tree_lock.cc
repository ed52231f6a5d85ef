#include "snapshot/tree_lock.h"

#include "gpusnap/workload.h"
#include "proc/proc.h"
#include "util/files.h"

namespace gpusnap {

Result<LockFile> LockTreeForCheckpoint(pid_t root) {
  GPUSNAP_ASSIGN_OR_RETURN(auto stat, proc::ReadStat(root));
  std::string dir = RunDir() + "/locks";
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  auto lock = LockFile::TryAcquire(fmt::format("{}/tree-{}-{}.lock", dir, root, stat.start_time));
  if (!lock.ok() && lock.status().code() == Code::kAlreadyExists)
    return Status::Error(Code::kAlreadyExists, "a checkpoint of pid {} is already running", root);
  return lock;
}

}  // namespace gpusnap
