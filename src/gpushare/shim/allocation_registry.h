// The device allocations a gpushare process made through its own VMM path,
// keyed by virtual address. The shim keeps one registry per process; release
// and load walk it, cuMemFree consults it to tell its own allocations from the
// driver's.
//
// Thread-safety: none; the shim guards it with its own mutex.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace gpusnap::gpushare::shim {

struct TrackedAllocation {
  uint64_t va = 0;
  uint64_t size = 0;       // reserved and mapped: the request rounded up to the granularity
  uint64_t requested = 0;  // what cuMemAlloc was asked for
  int32_t device = 0;
  uint64_t handle = 0;     // CUmemGenericAllocationHandle while mapped; 0 while released
  uint64_t context = 0;    // the CUcontext current at allocation time
  bool released = false;   // the physical memory is saved and freed; the VA stays reserved

  bool operator==(const TrackedAllocation&) const = default;
};

struct RegistryTotals {
  uint64_t allocations = 0;
  uint64_t bytes = 0;           // sizes of all allocations
  uint64_t released_bytes = 0;  // of those, released
};

class AllocationRegistry {
 public:
  // False (and nothing changes) when `a` overlaps an allocation already tracked
  // or is empty.
  bool Add(const TrackedAllocation& a);
  // The allocation starting exactly at `va` (what cuMemFree receives).
  std::optional<TrackedAllocation> FindStart(uint64_t va) const;
  // The allocation containing `addr`.
  std::optional<TrackedAllocation> FindContaining(uint64_t addr) const;
  bool Remove(uint64_t va);
  // Replaces the allocation starting at a.va. False when there is none.
  bool Update(const TrackedAllocation& a);
  // By address.
  std::vector<TrackedAllocation> All() const;
  // The distinct contexts, in order of first allocation address.
  std::vector<uint64_t> Contexts() const;
  RegistryTotals Totals() const;
  bool empty() const { return by_va_.empty(); }

 private:
  std::map<uint64_t, TrackedAllocation> by_va_;
};

// `bytes` rounded up to a multiple of `granularity` (a power of two, > 0).
uint64_t RoundUpToGranularity(uint64_t bytes, uint64_t granularity);

}  // namespace gpusnap::gpushare::shim
