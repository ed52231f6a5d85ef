#include "gpushare/shim/allocation_registry.h"

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

}  // namespace
}  // namespace gpusnap::gpushare::shim
