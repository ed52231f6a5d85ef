#include "gpushare/shim/allocation_registry.h"

#include <cerrno>

#include <gtest/gtest.h>

namespace gpusnap::gpushare::shim {
namespace {

TrackedAllocation Alloc(uint64_t va, uint64_t size, uint64_t ctx = 1) {
  TrackedAllocation a;
  a.va = va;
  a.size = size;
  a.requested = size;
  a.context = ctx;
  a.handle = va + 1;
  return a;
}

TEST(AllocationRegistry, FindsByStartAndByContainedAddress) {
  AllocationRegistry r;
  ASSERT_TRUE(r.Add(Alloc(0x200000, 0x400000)));
  ASSERT_TRUE(r.Add(Alloc(0x800000, 0x200000)));
  EXPECT_EQ(r.FindStart(0x200000)->size, 0x400000u);
  EXPECT_FALSE(r.FindStart(0x200001).has_value());
  EXPECT_EQ(r.FindContaining(0x5fffff)->va, 0x200000u);
  EXPECT_FALSE(r.FindContaining(0x600000).has_value());  // the gap between the two
  EXPECT_EQ(r.FindContaining(0x9fffff)->va, 0x800000u);
  EXPECT_FALSE(r.FindContaining(0xa00000).has_value());
  EXPECT_FALSE(r.FindContaining(0x1fffff).has_value());
}

TEST(AllocationRegistry, RefusesOverlapsAndEmptyRanges) {
  AllocationRegistry r;
  ASSERT_TRUE(r.Add(Alloc(0x400000, 0x400000)));
  EXPECT_FALSE(r.Add(Alloc(0x200000, 0x200001)));  // runs into it from below
  EXPECT_FALSE(r.Add(Alloc(0x7fffff, 0x10)));      // starts inside it
  EXPECT_FALSE(r.Add(Alloc(0x400000, 0x200000)));  // same start
  EXPECT_FALSE(r.Add(Alloc(0x1000000, 0)));
  EXPECT_FALSE(r.Add(Alloc(~0ull - 0x10, 0x100)));  // wraps around
  EXPECT_TRUE(r.Add(Alloc(0x200000, 0x200000)));   // touches it exactly
  EXPECT_TRUE(r.Add(Alloc(0x800000, 0x200000)));
  EXPECT_EQ(r.Totals().allocations, 3u);
}

TEST(AllocationRegistry, UpdateMarksReleasedAndTotalsFollow) {
  AllocationRegistry r;
  ASSERT_TRUE(r.Add(Alloc(0x200000, 0x200000, 7)));
  ASSERT_TRUE(r.Add(Alloc(0x400000, 0x600000, 9)));
  TrackedAllocation a = *r.FindStart(0x400000);
  a.released = true;
  a.handle = 0;
  ASSERT_TRUE(r.Update(a));
  RegistryTotals t = r.Totals();
  EXPECT_EQ(t.bytes, 0x800000u);
  EXPECT_EQ(t.released_bytes, 0x600000u);
  a.size = 1;
  EXPECT_FALSE(r.Update(a));  // the size is not the registry's to change
  EXPECT_EQ((std::vector<uint64_t>{7, 9}), r.Contexts());
  EXPECT_TRUE(r.Remove(0x200000));
  EXPECT_FALSE(r.Remove(0x200000));
  EXPECT_EQ(r.All().size(), 1u);
}

TEST(AllocationRegistry, RoundsUpToGranularity) {
  EXPECT_EQ(RoundUpToGranularity(1, 2 << 20), 2u << 20);
  EXPECT_EQ(RoundUpToGranularity(2 << 20, 2 << 20), 2u << 20);
  EXPECT_EQ(RoundUpToGranularity((70 << 20) + 1, 2 << 20), 72u << 20);
}

// Scratch marks. Chunks of 16 (bytes) keep the numbers small; the shim uses kChunkBytes.
using Ranges = std::vector<std::pair<uint64_t, uint64_t>>;
using Chunks = std::vector<bool>;

TEST(AllocationRegistryScratch, MarksWholeChunksOnlyAndLeavesPartlyMarkedOnesSaved) {
  AllocationRegistry r;
  ASSERT_TRUE(r.Add(Alloc(0x1000, 64)));
  EXPECT_EQ(r.ScratchChunks(0x1000, 16), Chunks(4, false));
  EXPECT_EQ(r.MarkScratch(0x1008, 32), 0);  // [8, 40): chunk 1 whole, chunks 0 and 2 in part
  EXPECT_EQ(r.ScratchChunks(0x1000, 16), (Chunks{false, true, false, false}));
  EXPECT_EQ(r.ScratchRanges(0x1000), (Ranges{{0x1008, 0x1028}}));
  EXPECT_EQ(r.Totals().scratch_bytes, 32u);
  EXPECT_TRUE(r.ScratchChunks(0x2000, 16).empty());  // no allocation there
}

TEST(AllocationRegistryScratch, MarksAddUpAndTouchingOnesMerge) {
  AllocationRegistry r;
  ASSERT_TRUE(r.Add(Alloc(0x1000, 64)));
  ASSERT_EQ(r.MarkScratch(0x1000, 8), 0);
  ASSERT_EQ(r.MarkScratch(0x1008, 16), 0);  // touches the first
  EXPECT_EQ(r.ScratchRanges(0x1000), (Ranges{{0x1000, 0x1018}}));
  EXPECT_EQ(r.ScratchChunks(0x1000, 16), (Chunks{true, false, false, false}));
  ASSERT_EQ(r.MarkScratch(0x1020, 4), 0);
  ASSERT_EQ(r.MarkScratch(0x1030, 4), 0);
  EXPECT_EQ(r.ScratchRanges(0x1000), (Ranges{{0x1000, 0x1018}, {0x1020, 0x1024}, {0x1030, 0x1034}}));
  ASSERT_EQ(r.MarkScratch(0x1010, 0x24), 0);  // overlaps three: all one now
  EXPECT_EQ(r.ScratchRanges(0x1000), (Ranges{{0x1000, 0x1034}}));
  EXPECT_EQ(r.ScratchChunks(0x1000, 16), (Chunks{true, true, true, false}));
  ASSERT_EQ(r.MarkScratch(0x1000, 64), 0);  // marking again changes nothing but the extent
  EXPECT_EQ(r.ScratchChunks(0x1000, 16), Chunks(4, true));
  EXPECT_EQ(r.Totals().scratch_bytes, 64u);
}

TEST(AllocationRegistryScratch, ARangeReachingTheRequestedEndTakesInTheRounding) {
  AllocationRegistry r;
  TrackedAllocation a = Alloc(0x1000, 64);
  a.requested = 50;  // cuMemAlloc(50), rounded up to 64
  ASSERT_TRUE(r.Add(a));
  ASSERT_EQ(r.MarkScratch(0x1000, 50), 0);
  EXPECT_EQ(r.ScratchRanges(0x1000), (Ranges{{0x1000, 0x1040}}));
  EXPECT_EQ(r.ScratchChunks(0x1000, 16), Chunks(4, true));
  // Short of it, it does not.
  AllocationRegistry q;
  ASSERT_TRUE(q.Add(a));
  ASSERT_EQ(q.MarkScratch(0x1000, 49), 0);
  EXPECT_EQ(q.ScratchChunks(0x1000, 16), (Chunks{true, true, true, false}));
  // The unmark of the same range takes all of it off again.
  ASSERT_EQ(r.UnmarkScratch(0x1000, 50), 0);
  EXPECT_TRUE(r.ScratchRanges(0x1000).empty());
}

TEST(AllocationRegistryScratch, UnmarkCutsRanges) {
  AllocationRegistry r;
  ASSERT_TRUE(r.Add(Alloc(0x1000, 64)));
  ASSERT_EQ(r.MarkScratch(0x1000, 64), 0);
  ASSERT_EQ(r.UnmarkScratch(0x1014, 8), 0);  // a hole in chunk 1
  EXPECT_EQ(r.ScratchRanges(0x1000), (Ranges{{0x1000, 0x1014}, {0x101c, 0x1040}}));
  EXPECT_EQ(r.ScratchChunks(0x1000, 16), (Chunks{true, false, true, true}));
  EXPECT_EQ(r.UnmarkScratch(0x1038, 8), 0);
  EXPECT_EQ(r.ScratchChunks(0x1000, 16), (Chunks{true, false, true, false}));
  EXPECT_EQ(r.UnmarkScratch(0x1000, 64), 0);
  EXPECT_TRUE(r.ScratchRanges(0x1000).empty());
  EXPECT_EQ(r.UnmarkScratch(0x1000, 64), 0);  // nothing marked: not an error
  EXPECT_EQ(r.Totals().scratch_bytes, 0u);
}

TEST(AllocationRegistryScratch, RefusesWhatIsNotAllAllocationsAndChangesNothing) {
  AllocationRegistry r;
  ASSERT_TRUE(r.Add(Alloc(0x1000, 64)));
  ASSERT_TRUE(r.Add(Alloc(0x1040, 32)));  // touches the first
  ASSERT_TRUE(r.Add(Alloc(0x2000, 32)));
  EXPECT_EQ(r.MarkScratch(0x1000, 0), EINVAL);
  EXPECT_EQ(r.MarkScratch(~0ull - 4, 16), EINVAL);  // wraps
  EXPECT_EQ(r.MarkScratch(0x500, 16), ENOENT);      // not an allocation
  EXPECT_EQ(r.MarkScratch(0xff0, 32), ENOENT);      // starts before one
  EXPECT_EQ(r.MarkScratch(0x1050, 0x1000), ENOENT); // runs past the second into the gap
  EXPECT_EQ(r.UnmarkScratch(0x500, 16), ENOENT);
  EXPECT_EQ(r.Totals().scratch_bytes, 0u);
  // Through two allocations that touch: each gets its part.
  ASSERT_EQ(r.MarkScratch(0x1030, 0x20), 0);
  EXPECT_EQ(r.ScratchRanges(0x1000), (Ranges{{0x1030, 0x1040}}));
  EXPECT_EQ(r.ScratchRanges(0x1040), (Ranges{{0x1040, 0x1050}}));
  EXPECT_EQ(r.ScratchChunks(0x1040, 16), (Chunks{true, false}));
}

TEST(AllocationRegistryScratch, MarksOutliveUpdatesAndEndWithTheAllocation) {
  AllocationRegistry r;
  ASSERT_TRUE(r.Add(Alloc(0x1000, 32)));
  ASSERT_EQ(r.MarkScratch(0x1000, 32), 0);
  TrackedAllocation a = *r.FindStart(0x1000);
  a.released = true;
  ASSERT_TRUE(r.Update(a));  // a release records itself this way
  EXPECT_EQ(r.ScratchChunks(0x1000, 16), Chunks(2, true));
  ASSERT_TRUE(r.Remove(0x1000));  // cuMemFree
  ASSERT_TRUE(r.Add(Alloc(0x1000, 32)));  // the same range again: not marked
  EXPECT_EQ(r.ScratchChunks(0x1000, 16), Chunks(2, false));
  EXPECT_EQ(r.Totals().scratch_bytes, 0u);
}

}  // namespace
}  // namespace gpusnap::gpushare::shim
