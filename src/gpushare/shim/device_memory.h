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

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "chunks/chunk_manifest.h"
#include "gpushare/common/fingerprint_kernel.h"
#include "gpushare/shim/allocation_registry.h"
#include "gpushare/shim/stored_chunks.h"
#include "gpushare/shim/vmm_table.h"
#include "gpushare/shim/real_driver.h"
#include "gpushare/shim/work_gate.h"
#include "gpusnap/status.h"
#include "util/fd.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::gpushare::shim {

// Allocations below this go to the driver's cuMemAlloc unchanged: they stay in
// the driver's own checkpoint.
inline constexpr uint64_t kVmmMinBytes = 2ull << 20;

enum class ShimState { kRunning, kQuiesced, kReleased };

// Maps `handle` at `va` (load, remap); when the restored process lost the
// reservation there, takes the same range again first.
abi::CUresult MapAt(uint64_t va, uint64_t size, uint64_t offset, abi::CUmemGenericAllocationHandle handle);

class DeviceMemory {
 public:
  static DeviceMemory& Get();

  WorkGate& gate() { return gate_; }

  // cuMemAlloc_v2 and cuMemFree_v2 as the application sees them.
  abi::CUresult Allocate(abi::CUdeviceptr* ptr, size_t bytes);
  abi::CUresult Free(abi::CUdeviceptr ptr);

  // The driver's VMM calls as the application sees them (shared_memory.cc):
  // device memory objects behind ids of the shim's (VmmTable), so they can be
  // saved, freed and made again behind the application's back. Handles that
  // are not the shim's pass to the driver unchanged.
  abi::CUresult Create(abi::CUmemGenericAllocationHandle* handle, size_t size, const abi::CUmemAllocationProp* prop,
                       unsigned long long flags);
  abi::CUresult ReleaseHandle(abi::CUmemGenericAllocationHandle handle);
  abi::CUresult Map(abi::CUdeviceptr va, size_t size, size_t offset, abi::CUmemGenericAllocationHandle handle,
                    unsigned long long flags);
  abi::CUresult Unmap(abi::CUdeviceptr va, size_t size);
  abi::CUresult SetAccess(abi::CUdeviceptr va, size_t size, const abi::CUmemAccessDesc* desc, size_t count);
  abi::CUresult Export(void* shareable, abi::CUmemGenericAllocationHandle handle, abi::CUmemAllocationHandleType type,
                       unsigned long long flags);
  abi::CUresult Import(abi::CUmemGenericAllocationHandle* handle, void* os_handle, abi::CUmemAllocationHandleType type);
  abi::CUresult Retain(abi::CUmemGenericAllocationHandle* handle, void* addr);
  abi::CUresult PropertiesOf(abi::CUmemAllocationProp* prop, abi::CUmemGenericAllocationHandle handle);
  // CUDA IPC of gpushare memory: the handle names this process's control
  // socket and the object; opening it asks that process for an fd. nullopt:
  // not gpushare memory, the caller asks the driver.
  std::optional<abi::CUresult> IpcGet(abi::CUipcMemHandle* out, abi::CUdeviceptr ptr);
  std::optional<abi::CUresult> IpcOpen(abi::CUdeviceptr* ptr, const abi::CUipcMemHandle& handle);
  std::optional<abi::CUresult> IpcClose(abi::CUdeviceptr ptr);

  // Control: a new fd of object `object` (an allocation's address or a VMM id)
  // for another process; and an imported object mapped again from `fd`.
  Result<UniqueFd> ExportFd(uint64_t object);
  Status Remap(uint64_t import, UniqueFd fd);
  // Control, while released: the allocation at `va` takes the device memory
  // behind `fd` (made and filled by gpusnap during the restore) instead of
  // new memory at load, which then fills only the rest.
  Status Adopt(uint64_t va, UniqueFd fd);

  // gpusnap_gpushare_mark_scratch / _unmark_scratch (gpusnap/gpushare_scratch.h):
  // 0 or an errno, as AllocationRegistry::MarkScratch. No driver call.
  int MarkScratch(uint64_t ptr, uint64_t bytes) EXCLUDES(mu_);
  int UnmarkScratch(uint64_t ptr, uint64_t bytes) EXCLUDES(mu_);
  // gpusnap_gpushare_loads: the loads that succeeded in this process.
  uint64_t Loads() const { return loads_.load(std::memory_order_acquire); }

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
  // After a failed load: every allocation mapped since the release (loaded
  // or adopted) and the application's objects freed again.
  Status DropLoaded();
  // A released allocation's range mapped onto `handle` again, with access for
  // its device, and recorded as live; on failure the handle is released.
  Status MapBack(TrackedAllocation& a, abi::CUmemGenericAllocationHandle handle);
  // shared_memory.cc: the VMM objects' part of release and load.
  // The created objects (mapped now, or released now), as the ranges through
  // which their bytes are read and written. REQUIRES: quiesced.
  Result<std::vector<TrackedAllocation>> ObjectRanges(bool released);
  Status FreeObjects();
  Status MakeObjects();
  void CloseExportedFds(uint64_t object) REQUIRES(mu_);  // 0: all
  void DropIfUnused(uint64_t id) REQUIRES(mu_);
  nlohmann::json DescribeSharing();
  Status Fill(const std::string& chunk_store, const std::vector<TrackedAllocation>& allocs,
              const chunks::ChunkManifest& manifest);

  Mutex mu_;
  AllocationRegistry registry_ GUARDED_BY(mu_);
  VmmTable objects_ GUARDED_BY(mu_);
  // Duplicates of the fds this process exported, by object: the same open
  // files its importers hold, which is how gpusnap pairs them (kcmp).
  std::vector<std::pair<uint64_t, int>> exported_fds_ GUARDED_BY(mu_);
  ShimState state_ = ShimState::kRunning;  // written by the control thread only
  bool vmm_disabled_ GUARDED_BY(mu_) = false;  // VMM refused once; plain cuMemAlloc from then on
  nlohmann::json last_;          // the last transition's figures
  // The fd each adopted allocation came with: an export of it is a duplicate
  // of that fd, not an export of the imported handle the process now holds.
  std::map<uint64_t, int> adopted_fds_ GUARDED_BY(mu_);  // allocation address -> fd
  void ForgetAdoptedFd(uint64_t va);
  // Unchanged chunks (stored_chunks.h): the kernel, loaded at the first
  // release, and what each chunk was when last stored. Control thread only.
  std::optional<FingerprintKernel> fingerprint_kernel_;
  StoredChunks stored_chunks_;
  // The fingerprints of `ranges` now, or none (and why, in `last`) when they
  // cannot be had: every chunk is then copied.
  RangeFingerprints FingerprintNow(const std::vector<DeviceRange>& ranges, nlohmann::json& figures);
  std::atomic<uint64_t> loads_{0};  // read by any thread, written by the control thread
  uint64_t adopted_ = 0;         // allocations adopted since the last release, and their bytes
  uint64_t adopted_bytes_ = 0;
  WorkGate gate_;
};

}  // namespace gpusnap::gpushare::shim
