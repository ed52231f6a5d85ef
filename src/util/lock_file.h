// An exclusive lock on a file that exists only while it is held: taken without
// waiting, released (and the file removed) when the LockFile goes or its
// holder dies. The flock, not the file's existence, is the lock; a lock taken
// on a file its holder removed meanwhile is taken again on the new one.
//
// Not thread-safe; one holder per object. The fd is close-on-exec, so a child
// the holder starts never keeps the lock.
#pragma once

#include <string>

#include "gpusnap/status.h"
#include "util/fd.h"

namespace gpusnap {

class LockFile {
 public:
  // kAlreadyExists when another holder has `path`; kIoError (errno's) when it
  // cannot be made or locked. The directory must exist.
  static Result<LockFile> TryAcquire(const std::string& path);

  LockFile(LockFile&&) noexcept = default;
  LockFile& operator=(LockFile&& other) noexcept;
  LockFile(const LockFile&) = delete;
  LockFile& operator=(const LockFile&) = delete;
  ~LockFile() { Release(); }

  // For the holder to write into (what it names is its own business).
  int fd() const { return fd_.get(); }

 private:
  LockFile(std::string path, UniqueFd fd) : path_(std::move(path)), fd_(std::move(fd)) {}
  void Release();

  std::string path_;
  UniqueFd fd_;
};

}  // namespace gpusnap
