// The device memory of a restore, made and filled by gpusnap itself while
// CRIU restores the processes' CPU memory, then handed to them.
//
// A shim can only load its process's device memory once CRIU and the driver
// have restored the process: the load would then follow CRIU instead of
// running beside it. So gpusnap, before CRIU starts, makes each allocation the
// shims made (cuMemAlloc; origin kShim in the manifest) on the GPU it will
// be on (through the GPU map), fills it from the chunks on all GPUs at once,
// and exports it as a POSIX fd. After the driver restore each shim adopts its
// allocations from those fds (`adopt`: import, map at the same address) and
// its `load` fills only what is left: the application's own VMM objects, and
// anything not made here. Preloading is an optimisation: whatever fails here
// is loaded by the shims as before.
//
// With a pinned tier (pinned_tier.h: the agent's), the chunks found there are
// copied to the GPU straight from pinned host memory; the others are read
// from the chunk store, and are then kept in the tier as recently used, off
// the fill's path.
#pragma once

#include <array>
#include <cstdint>
#include <chrono>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chunks/chunk_store.h"
#include "cuda/gpu_session.h"
#include "gpushare/common/driver_table.h"
#include "gpushare/control/pinned_tier.h"
#include "gpusnap/status.h"
#include "util/beside.h"
#include "util/fd.h"

namespace gpusnap::gpushare::control {

struct PreloadTarget {
  int ns_pid = 0;             // the process, by its pid in its namespace
  std::string manifest_path;  // its gpu/<ns pid>.chunks
};

struct PreloadedAllocation {
  uint64_t va = 0;  // where the process has it
  uint64_t size = 0;
  UniqueFd fd;      // the memory, for the process to import
};

// The GPU (this process's device ordinal) memory checkpointed on the GPU
// with this UUID goes to now; nullopt: not preloaded.
using PreloadDevice = std::function<std::optional<int>(const std::array<uint8_t, 16>& checkpoint_uuid)>;

class PreloadedMemory {
 public:
  // Makes and fills the shim allocations of every target, in the primary
  // contexts of `session` (kept as long as this object). `tier`: where to
  // look for chunks first; null: none. Errors: the manifests (kCorruption,
  // kIoError), the driver (kExternal), a chunk (kCorruption).
  static Result<PreloadedMemory> Make(std::shared_ptr<cuda::GpuSession> session, const std::string& chunk_store,
                                      const std::vector<PreloadTarget>& targets, const PreloadDevice& device_for,
                                      unsigned threads,
                                      std::chrono::milliseconds arrival_wait = std::chrono::milliseconds(0),
                                      chunks::ChunkStore::Bringer bringer = {}, PinnedTier* tier = nullptr);

  PreloadedMemory(PreloadedMemory&&) = default;
  PreloadedMemory& operator=(PreloadedMemory&&) = default;
  // Unmaps and releases this process's hold on the memory; what a process
  // adopted lives on in it.
  ~PreloadedMemory();

  // The allocations made for the process `ns_pid`; the caller passes each fd
  // on (and may take it).
  std::vector<PreloadedAllocation>& Of(int ns_pid) { return by_pid_[ns_pid]; }
  uint64_t bytes() const { return bytes_; }
  // Where the preload's time went: making and mapping the memory, then filling it.
  double map_seconds() const { return map_seconds_; }
  double fill_seconds() const { return fill_seconds_; }
  size_t count() const { return mappings_.size(); }
  // Chunks copied from the pinned tier, and chunks read from the store
  // instead (both 0 without a tier).
  uint64_t pinned_hits() const { return pinned_hits_; }
  uint64_t pinned_misses() const { return pinned_misses_; }

 private:
  PreloadedMemory() = default;
  struct Mapping {
    abi::CUdeviceptr va = 0;  // in this process
    uint64_t size = 0;
    abi::CUmemGenericAllocationHandle handle = 0;
  };
  std::shared_ptr<cuda::GpuSession> session_;  // its contexts hold the memory made in them
  RealDriver d_;
  std::vector<Mapping> mappings_;
  std::map<int, std::vector<PreloadedAllocation>> by_pid_;
  uint64_t bytes_ = 0;
  double map_seconds_ = 0;
  double fill_seconds_ = 0;
  uint64_t pinned_hits_ = 0;
  uint64_t pinned_misses_ = 0;
  PinnedTier::AdmissionHold admissions_held_;  // until what it made is adopted, or undone
};

inline constexpr unsigned kPreloadThreadsBesideCriu = 12;
// With no CRIU beside it (a standby's wake, a resume in place): every core.
unsigned PreloadThreadsAlone();
// Off only where GPUSNAP_GPUSHARE_PRELOAD=0 says so.
bool PreloadEnabled();

// A preload running beside a restore's other steps (an invalid future: none).
using PendingPreload = std::future<Timed<Result<PreloadedMemory>>>;

// Starts PreloadedMemory::Make for the processes `ns_pids` (their manifests
// in `manifest_dir`) on a thread of its own, with
// GPUSNAP_GPUSHARE_PRELOAD_THREADS copy threads (else `default_threads`: 12 beside
// CRIU, which needs cores of its own; a wake has the machine). With
// GPUSNAP_GPUSHARE_PRELOAD=0 it starts nothing: the shims' load does it all.
// `arrival_wait`: how long a chunk not yet in the store may take to arrive
// (a restore that pulls as it goes; `bringer` says when the pull failed); 0: none.
// `tier` as Make takes it (held until the preload is done); null: none.
PendingPreload StartPreload(std::shared_ptr<cuda::GpuSession> session, const std::string& chunk_store,
                            const std::string& manifest_dir, const std::vector<int>& ns_pids, PreloadDevice device_for,
                            std::chrono::milliseconds arrival_wait = std::chrono::milliseconds(0),
                            chunks::ChunkStore::Bringer bringer = {},
                            unsigned default_threads = kPreloadThreadsBesideCriu,
                            std::shared_ptr<PinnedTier> tier = nullptr);

}  // namespace gpusnap::gpushare::control
