// Device memory to and from the chunk store, on several threads, each with
// its own pinned staging buffers and streams. The shim saves and loads a
// process's own memory with it; gpusnap fills memory it made for a restored
// process with it while CRIU restores the rest (preload.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "chunks/chunk_store.h"
#include "gpushare/common/driver_table.h"
#include "gpusnap/status.h"

namespace gpusnap::gpushare {

// Where an allocation is mapped in this process, and the context to copy in.
struct DeviceRange {
  uint64_t va = 0;
  uint64_t size = 0;
  uint64_t context = 0;
};

// One chunk of one range.
struct ChunkJob {
  size_t range = 0;
  size_t index = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};
std::vector<ChunkJob> ChunkJobs(const std::vector<DeviceRange>& ranges);

// A worker's pinned buffers and, per context, its streams. Pinned memory is
// allocated portable, so any context may copy through it.
class Staging {
 public:
  // `buffers` of `bytes` each, pinned the first time each is asked for: a
  // fill whose every chunk is zero or in the pinned tier pins none.
  Staging(const RealDriver& d, int buffers, uint64_t bytes)
      : d_(d), buffers_(static_cast<size_t>(buffers), nullptr), buffer_bytes_(bytes) {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging();
  Result<void*> buffer(size_t i);
  // Makes `ctx` current on this thread and returns its stream number `i`.
  Result<abi::CUstream> Stream(uint64_t ctx, size_t i);
  // A worker's own bookkeeping of its buffers: the stream whose copy last read
  // each one, and whose turn is next.
  std::vector<abi::CUstream> pending;
  size_t turn = 0;

 private:
  const RealDriver& d_;
  std::vector<void*> buffers_;  // nullptr: not pinned yet
  uint64_t buffer_bytes_ = 0;
  std::map<uint64_t, std::vector<abi::CUstream>> streams_;
};

// Runs `work(staging, job)` for every job on `threads` threads, each with its
// own Staging of `buffers` pinned buffers (allocated in `context`); then
// `work(staging, SIZE_MAX)` once per thread, to drain. The first failure
// stops the rest and is returned.
Status RunChunkJobs(const RealDriver& d, size_t jobs, unsigned threads, int buffers, uint64_t buffer_bytes,
                    uint64_t context, const std::function<Status(Staging&, size_t job)>& work);

// Fills each range from its allocation's chunks (`sources[i]` for
// `ranges[i]`, the same size): each worker reads a chunk in 16 MiB pieces
// into its two pinned buffers in turn (pinned when it first reads one), and
// copies each piece on while reading the next; zero chunks are a memset. A chunk's digest is checked as its
// pieces go by, and a mismatch fails the fill (kCorruption). A chunk that
// `pinned` finds already in pinned host memory (the agent's pinned tier,
// which checked it as it entered) is copied from there whole, unread and
// unchecked; empty: none is.
using PinnedLookup = std::function<const void*(const chunks::ChunkRef&)>;
Status FillFromChunks(const RealDriver& d, const chunks::ChunkStore& store, const std::vector<DeviceRange>& ranges,
                      const std::vector<const chunks::ChunkedAllocation*>& sources, unsigned threads,
                      const PinnedLookup& pinned = {});

// The value of the environment variable `name` if it is 1..64, else `fallback`.
unsigned ThreadsFromEnv(const char* name, unsigned fallback);

}  // namespace gpusnap::gpushare
