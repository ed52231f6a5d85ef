#include "snapshot/tree_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gpusnap/workload.h"
#include "proc/proc.h"
#include "util/files.h"

namespace gpusnap {

Result<TreeLock> TreeLock::Acquire(pid_t root) {
  GPUSNAP_ASSIGN_OR_RETURN(auto stat, proc::ReadStat(root));
  std::string dir = RunDir() + "/locks";
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  std::string path = fmt::format("{}/tree-{}-{}.lock", dir, root, stat.start_time);
  // The holder removes the file as it lets go: a lock taken on a file that was
  // meanwhile removed (or replaced) holds nothing, so it is taken again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) return Status::Errno(errno, "creating the checkpoint lock `{}`", path);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK)
        return Status::Error(Code::kAlreadyExists, "a checkpoint of pid {} is already running", root);
      return Status::Errno(errno, "locking `{}`", path);
    }
    struct stat held{}, named{};
    if (::fstat(fd.get(), &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_ino == named.st_ino &&
        held.st_dev == named.st_dev)
      return TreeLock(path, std::move(fd));
  }
  return Status::Error(Code::kInternal, "the checkpoint lock `{}` kept changing", path);
}

TreeLock::~TreeLock() {
  if (fd_.valid()) ::unlink(path_.c_str());
}

}  // namespace gpusnap
