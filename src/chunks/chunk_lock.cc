#include "chunks/chunk_lock.h"

#include <fcntl.h>
#include <sys/file.h>

#include <chrono>
#include <thread>

namespace gpusnap::chunks {

std::string ChunkStoreLockPath(const std::string& store_root) { return store_root + "/chunks.lock"; }

Result<ChunkStoreLock> ChunkStoreLock::Acquire(const std::string& store_root, Mode mode, int wait_ms) {
  std::string path = ChunkStoreLockPath(store_root);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) return Status::Errno(errno, "opening the chunk store lock `{}`", path);
  const int op = (mode == Mode::kShared ? LOCK_SH : LOCK_EX) | LOCK_NB;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  while (::flock(fd.get(), op) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) return Status::Errno(errno, "locking `{}`", path);
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Error(Code::kTimeout, "the chunk store lock `{}` is held {} (waited {} ms)", path,
                           mode == Mode::kShared ? "by a garbage collection" : "by a checkpoint or suspend writing chunks, a restore reading them, or another collection",
                           wait_ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return ChunkStoreLock(std::move(fd), mode);
}

}  // namespace gpusnap::chunks
