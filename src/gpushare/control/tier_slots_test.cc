#include "gpushare/control/tier_slots.h"

#include <gtest/gtest.h>

namespace gpusnap::gpushare::control {
namespace {

chunks::ChunkDigest D(uint8_t n) {
  chunks::ChunkDigest d{};
  d[15] = n;
  return d;
}

// Places and fills `digest`, then lets it go idle; the slot it took.
size_t Admit(TierSlots& t, uint8_t n) {
  TierSlots::Placement p = t.Place(D(n));
  EXPECT_EQ(p.placed, TierSlots::Placed::kFill);
  t.Filled(D(n));
  t.Release(D(n));
  return p.slot;
}

TEST(TierSlots, HoldsNoMoreChunksThanItsSlots) {
  TierSlots t(2);
  EXPECT_EQ(Admit(t, 1), 0u);
  EXPECT_EQ(Admit(t, 2), 1u);
  EXPECT_EQ(t.used(), 2u);
  Admit(t, 3);
  EXPECT_EQ(t.used(), 2u);
  EXPECT_EQ(t.evictions(), 1u);
}

TEST(TierSlots, EvictsTheLeastRecentlyUsedFirst) {
  TierSlots t(3);
  Admit(t, 1);
  Admit(t, 2);
  Admit(t, 3);
  // A fill used 1: 2 is now the least recently used.
  ASSERT_TRUE(t.Hold(D(1)).has_value());
  t.Release(D(1));
  TierSlots::Placement p = t.Place(D(4));
  ASSERT_EQ(p.placed, TierSlots::Placed::kFill);
  EXPECT_EQ(p.evicted, D(2));
  EXPECT_EQ(p.slot, 1u);  // 2's slot, reused
  t.Filled(D(4));
  t.Release(D(4));
  EXPECT_TRUE(t.Contains(D(1)));
  EXPECT_FALSE(t.Contains(D(2)));
  // Then 3, then 1.
  EXPECT_EQ(t.Place(D(5)).evicted, D(3));
  t.Filled(D(5));
  t.Release(D(5));
  EXPECT_EQ(t.Place(D(6)).evicted, D(1));
}

TEST(TierSlots, NeverEvictsAChunkAFillHolds) {
  TierSlots t(2);
  Admit(t, 1);
  Admit(t, 2);
  ASSERT_TRUE(t.Hold(D(1)).has_value());
  ASSERT_TRUE(t.Hold(D(2)).has_value());
  EXPECT_EQ(t.Place(D(3)).placed, TierSlots::Placed::kFull);
  EXPECT_EQ(t.evictions(), 0u);
  // Once its fill is done with 1, 1 can go; 2, still held, stays.
  t.Release(D(1));
  TierSlots::Placement p = t.Place(D(3));
  EXPECT_EQ(p.placed, TierSlots::Placed::kFill);
  EXPECT_EQ(p.evicted, D(1));
  EXPECT_TRUE(t.Contains(D(2)));
}

TEST(TierSlots, AnAdmissionKeepsWhatItAdmittedTillItIsDone) {
  // A snapshot larger than the tier: its first chunks, still held by their
  // admission, are not evicted for its last ones.
  TierSlots t(2);
  for (uint8_t n : {1, 2}) {
    ASSERT_EQ(t.Place(D(n)).placed, TierSlots::Placed::kFill);
    t.Filled(D(n));
  }
  EXPECT_EQ(t.Place(D(3)).placed, TierSlots::Placed::kFull);
  EXPECT_TRUE(t.Contains(D(1)));
  EXPECT_TRUE(t.Contains(D(2)));
}

TEST(TierSlots, AChunkTwoSnapshotsShareTakesOneSlot) {
  TierSlots t(4);
  Admit(t, 1);
  Admit(t, 2);
  // The second snapshot names 2 and 3: 2 is found, held, not placed again.
  TierSlots::Placement shared = t.Place(D(2));
  EXPECT_EQ(shared.placed, TierSlots::Placed::kHeld);
  t.Release(D(2));
  Admit(t, 3);
  EXPECT_EQ(t.used(), 3u);
}

TEST(TierSlots, AChunkBeingFilledIsNeitherReadNorPlacedTwice) {
  TierSlots t(2);
  ASSERT_EQ(t.Place(D(1)).placed, TierSlots::Placed::kFill);
  EXPECT_FALSE(t.Hold(D(1)).has_value());
  EXPECT_EQ(t.Place(D(1)).placed, TierSlots::Placed::kBusy);
  EXPECT_FALSE(t.Contains(D(1)));
  t.Filled(D(1));
  EXPECT_TRUE(t.Hold(D(1)).has_value());
}

TEST(TierSlots, AnAbandonedFillGivesItsSlotBack) {
  TierSlots t(1);
  TierSlots::Placement p = t.Place(D(1));
  ASSERT_EQ(p.placed, TierSlots::Placed::kFill);
  t.Abandon(D(1));
  EXPECT_EQ(t.used(), 0u);
  EXPECT_FALSE(t.Hold(D(1)).has_value());
  TierSlots::Placement again = t.Place(D(2));
  EXPECT_EQ(again.placed, TierSlots::Placed::kFill);
  EXPECT_EQ(again.slot, p.slot);
  EXPECT_EQ(t.evictions(), 0u);
}

TEST(TierSlots, ATierOfNoSlotsPlacesNothing) {
  TierSlots t(0);
  EXPECT_EQ(t.Place(D(1)).placed, TierSlots::Placed::kFull);
  EXPECT_FALSE(t.Hold(D(1)).has_value());
}

}  // namespace
}  // namespace gpusnap::gpushare::control
