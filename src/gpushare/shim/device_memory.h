// The shim's state in one process: the device allocations it made, the work
// gate, and the four transitions gpusnap asks for over the control socket:
//
//   running --quiesce--> quiesced --release--> released
//      ^                   |   ^                  |
//      +------resume-------+   +------load--------+
//
// Device memory is saved to and loaded from the chunk store through pinned
// staging buffers on several threads, each with its own stream.
//
// Thread-safety: Allocate/Free from any thread (behind the gate); the
// transitions from the control thread only.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "gpushare/allocation_registry.h"
#include "gpushare/chunk_manifest.h"
#include "gpushare/shim/real_driver.h"
#include "gpushare/shim/work_gate.h"
#include "gpusnap/status.h"

namespace gpusnap::gpushare {

// Allocations below this go to the driver's cuMemAlloc unchanged: they stay in
// the driver's own checkpoint.
inline constexpr uint64_t kVmmMinBytes = 2ull << 20;

enum class ShimState { kRunning, kQuiesced, kReleased };

class DeviceMemory {
 public:
  static DeviceMemory& Get();

  WorkGate& gate() { return gate_; }

  // cuMemAlloc_v2 and cuMemFree_v2 as the application sees them.
  abi::CUresult Allocate(abi::CUdeviceptr* ptr, size_t bytes);
  abi::CUresult Free(abi::CUdeviceptr ptr);

  Status Quiesce(int timeout_ms);
  Status Release(const std::string& chunk_store, const std::string& manifest);
  Status Load(const std::string& chunk_store, const std::string& manifest);
  Status Resume();
  // state, allocations, bytes, released_bytes, held_calls and the last
  // transition's figures.
  nlohmann::json Describe();

 private:
  DeviceMemory() = default;
  Status MapAll(std::vector<TrackedAllocation>& allocs);
  Status Fill(const std::string& chunk_store, const std::vector<TrackedAllocation>& allocs,
              const ChunkManifest& manifest);

  std::mutex mu_;
  AllocationRegistry registry_;  // GUARDED_BY(mu_)
  ShimState state_ = ShimState::kRunning;  // written by the control thread only
  bool vmm_disabled_ = false;    // GUARDED_BY(mu_): VMM refused once; plain cuMemAlloc from then on
  nlohmann::json last_;          // the last transition's figures
  WorkGate gate_;
};

}  // namespace gpusnap::gpushare
