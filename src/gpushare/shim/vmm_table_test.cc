#include "gpushare/shim/vmm_table.h"

#include <gtest/gtest.h>

namespace gpusnap::gpushare::shim {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

TEST(VmmTable, IdsAreTheShimsAndNeverDriverHandles) {
  VmmTable t;
  uint64_t a = t.AddObject({.real = 0x1000, .size = 2 * kMiB});
  uint64_t b = t.AddObject({.real = 0x1001, .size = 2 * kMiB});
  EXPECT_NE(a, b);
  EXPECT_TRUE(VmmTable::IsObjectId(a));
  EXPECT_FALSE(VmmTable::IsObjectId(0x1000));
  EXPECT_FALSE(VmmTable::IsObjectId(0x7f0000200000));
  EXPECT_EQ(t.Find(a)->real, 0x1000u);
  EXPECT_EQ(t.Find(0x1000), nullptr);
}

TEST(VmmTable, MappingsDoNotOverlapAndRangesMustHoldWholeOnes) {
  VmmTable t;
  uint64_t o = t.AddObject({.real = 1, .size = 4 * kMiB});
  const uint64_t base = 0x7f0000000000;
  EXPECT_TRUE(t.AddMapping({base, 2 * kMiB, 0, o, 0, {}}));
  EXPECT_TRUE(t.AddMapping({base + 2 * kMiB, 2 * kMiB, 2 * kMiB, o, 0, {}}));
  EXPECT_FALSE(t.AddMapping({base + kMiB, 2 * kMiB, 0, o, 0, {}}));  // overlaps both
  EXPECT_FALSE(t.AddMapping({base + 8 * kMiB, 2 * kMiB, 0, 12345, 0, {}}));  // no such object
  EXPECT_EQ(t.MappingsIn(base, 4 * kMiB)->size(), 2u);
  EXPECT_FALSE(t.MappingsIn(base, 3 * kMiB).has_value());  // cuts the second
  EXPECT_FALSE(t.MappingsIn(base + 8 * kMiB, kMiB).has_value());
  EXPECT_EQ(t.MappingContaining(base + 3 * kMiB)->offset, 2 * kMiB);
  EXPECT_FALSE(t.MappingContaining(base + 4 * kMiB).has_value());
  // Neither piece is the whole object at offset 0.
  EXPECT_FALSE(t.WholeMappingOf(o).has_value());
}

TEST(VmmTable, AnObjectLivesWhileHeldOrMapped) {
  VmmTable t;
  uint64_t o = t.AddObject({.real = 1, .size = 2 * kMiB, .app_refs = 1});
  ASSERT_TRUE(t.AddMapping({0x10000000, 2 * kMiB, 0, o, 0, {}}));
  EXPECT_EQ(t.WholeMappingOf(o)->va, 0x10000000u);
  t.Find(o)->app_refs = 0;  // released by the application, still mapped (NCCL does this)
  EXPECT_FALSE(t.Unused(o));
  t.RemoveMapping(0x10000000);
  EXPECT_TRUE(t.Unused(o));
}

TEST(VmmTable, AccessIsRecordedPerMapping) {
  VmmTable t;
  uint64_t o = t.AddObject({.real = 1, .size = 2 * kMiB});
  ASSERT_TRUE(t.AddMapping({0x10000000, 2 * kMiB, 0, o, 0, {}}));
  EXPECT_TRUE(t.SetAccess(0x10000000, 2 * kMiB, {{0, 3}, {1, 3}}));
  EXPECT_EQ(t.MappingsOf(o).front().access, (std::vector<AccessGrant>{{0, 3}, {1, 3}}));
  EXPECT_FALSE(t.SetAccess(0x20000000, 2 * kMiB, {{0, 3}}));
}

}  // namespace
}  // namespace gpusnap::gpushare::shim
