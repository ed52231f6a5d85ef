// The device allocations a gpushare process made through its own VMM path,
// keyed by virtual address. The shim keeps one registry per process; release
// and load walk it, cuMemFree consults it to tell its own allocations from the
// driver's.
//
// Thread-safety: none; the shim guards it with its own mutex.
#pragma once

#include <cstddef>
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
  uint64_t scratch_bytes = 0;   // of all, marked scratch
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

  // Marks [ptr, ptr + bytes) scratch, or takes the marks off it. A range
  // reaching the end of what an allocation was asked for (`requested`) takes
  // in its rounding up to `size` too. 0, or (nothing changed) EINVAL for an
  // empty or wrapping range, ENOENT when a byte of it is in no allocation
  // (a range may run through several allocations that touch).
  int MarkScratch(uint64_t ptr, uint64_t bytes);
  int UnmarkScratch(uint64_t ptr, uint64_t bytes);
  // For each `chunk_bytes` chunk of the allocation at `va` (counted from va,
  // the last one short): whether it lies wholly in marked ranges. Empty when
  // there is no allocation at `va`.
  std::vector<bool> ScratchChunks(uint64_t va, uint64_t chunk_bytes) const;
  // The marked ranges of the allocation at `va`, [start, end) by address, in
  // order, touching ones merged.
  std::vector<std::pair<uint64_t, uint64_t>> ScratchRanges(uint64_t va) const;

 private:
  // The parts of [ptr, ptr + bytes) in each allocation, as [start, end), the
  // end stretched to the allocation's size where it reaches `requested`; an
  // errno as MarkScratch's when the range is not all allocations'.
  int Pieces(uint64_t ptr, uint64_t bytes, std::vector<std::pair<uint64_t, uint64_t>>* out) const;
  std::map<uint64_t, TrackedAllocation> by_va_;
  // Allocation address -> its marked ranges, start -> end, disjoint and not touching.
  std::map<uint64_t, std::map<uint64_t, uint64_t>> scratch_;
};

// `bytes` rounded up to a multiple of `granularity` (a power of two, > 0).
uint64_t RoundUpToGranularity(uint64_t bytes, uint64_t granularity);

}  // namespace gpusnap::gpushare::shim
