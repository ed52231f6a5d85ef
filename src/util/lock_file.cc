#include "util/lock_file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gpusnap {

Result<LockFile> LockFile::TryAcquire(const std::string& path) {
  for (;;) {
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd.valid()) return Status::Errno(errno, "creating the lock file `{}`", path);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) return Status::Error(Code::kAlreadyExists, "`{}` is held", path);
      return Status::Errno(errno, "locking `{}`", path);
    }
    // The holder removes the file before it lets go: a lock on a file no
    // longer at `path` holds nothing.
    struct stat held{}, named{};
    if (::fstat(fd.get(), &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
        held.st_ino == named.st_ino)
      return LockFile(path, std::move(fd));
  }
}

LockFile& LockFile::operator=(LockFile&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    fd_ = std::move(other.fd_);
  }
  return *this;
}

void LockFile::Release() {
  // Removed while still locked, so whoever opened it meanwhile sees, once it
  // holds the lock, that the file is gone and starts over.
  if (fd_.valid()) ::unlink(path_.c_str());
  fd_ = UniqueFd();
}

}  // namespace gpusnap
