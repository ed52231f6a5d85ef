// The chunk store's lock, <store>/chunks.lock: it keeps garbage collection
// (chunk_gc.h) from deleting a chunk that a checkpoint is about to name.
//
// The race it closes: a release stores each chunk unless a file of that name
// is there already (ChunkStore::SaveChunk). A chunk found present becomes
// referenced only when the release writes its manifest, at the end. A
// collection marking in between finds no manifest naming the chunk and
// deletes it; the snapshot would then name a chunk that is gone.
//
// So whoever makes chunks live before a manifest names them holds the lock
// shared, and a collection holds it exclusive from its mark through its sweep.
// The chunks are written by the shim inside the workload, but the lock is
// held by gpusnap, the process that asks for the release: a checkpoint from
// before the release until it returns (past the publish, and past the load
// that brings the memory back on failure or with --leave-running); an
// in-place suspend from before the release until the manifests are under
// <store>/suspended/; a restore from its check that every chunk is there
// until the last one is loaded (a `gpusnap rm` of the snapshot meanwhile
// must not take them away mid-load). Shared holders do not exclude one another.
//
// flock(2) belongs to the open file: two holders in one process (the agent's
// threads) each open the file and exclude each other as two processes do. The
// descriptor is close-on-exec, so CRIU and workloads started meanwhile do not
// inherit it, and the kernel drops the lock when its holder dies.
//
// Thread-safety: a ChunkStoreLock is a value owned by one thread at a time.
#pragma once

#include <string>

#include "gpusnap/status.h"
#include "util/fd.h"

namespace gpusnap::chunks {

// How long a writer (checkpoint, suspend) waits for a collection to end.
inline constexpr int kChunkWriterWaitMs = 10 * 60 * 1000;

// <store_root>/chunks.lock
std::string ChunkStoreLockPath(const std::string& store_root);

class ChunkStoreLock {
 public:
  enum class Mode { kShared, kExclusive };

  // Takes the lock of the store at `store_root` (an existing directory),
  // creating the lock file if missing. Waits at most `wait_ms` (0: one try).
  // Errors: kTimeout naming the lock file when it stays held the other way;
  // the errno's code naming the file when it cannot be opened or locked.
  static Result<ChunkStoreLock> Acquire(const std::string& store_root, Mode mode, int wait_ms);

  Mode mode() const { return mode_; }

 private:
  ChunkStoreLock(UniqueFd fd, Mode mode) : fd_(std::move(fd)), mode_(mode) {}
  UniqueFd fd_;  // flock'd while this object lives
  Mode mode_;
};

}  // namespace gpusnap::chunks
