#include "gpushare/shim/stored_chunks.h"

#include <gtest/gtest.h>

namespace gpusnap::gpushare::shim {
namespace {

constexpr uint64_t kChunk = chunks::kChunkBytes;

chunks::ChunkRef Stored(uint8_t tag, uint64_t length = kChunk) {
  chunks::ChunkRef r;
  r.digest[0] = tag;
  r.length = length;
  return r;
}

chunks::ChunkRef Zero(uint64_t length = kChunk) {
  chunks::ChunkRef r;
  r.zero = true;
  r.length = length;
  return r;
}

// Two ranges: 2 chunks and a short one, 1 chunk.
struct Release {
  std::vector<DeviceRange> ranges{{0x10000000, 2 * kChunk, 1}, {0x40000000, 6 << 20, 1}};
  std::vector<ChunkJob> jobs = ChunkJobs(ranges);
  RangeFingerprints now{std::vector<ChunkFingerprint>{{1, 2}, {3, 4}}, std::vector<ChunkFingerprint>{{5, 6}}};
  std::vector<chunks::ChunkRef> refs{Stored(1), Zero(), Stored(3, 6 << 20)};
};

auto HeldAll = [](const chunks::ChunkRef&) { return true; };

TEST(StoredChunks, NothingRecordedCopiesEverything) {
  Release r;
  auto plan = PlanUnchangedChunks(r.jobs, r.ranges, r.now, {}, HeldAll);
  ASSERT_EQ(plan.size(), 3u);
  for (const auto& p : plan) EXPECT_FALSE(p);
}

TEST(StoredChunks, ChunksWithTheRecordedFingerprintAreWrittenAsTheyWere) {
  Release r;
  StoredChunks stored = RecordStoredChunks(r.jobs, r.ranges, r.now, r.refs);
  EXPECT_EQ(stored.size(), 3u);
  auto plan = PlanUnchangedChunks(r.jobs, r.ranges, r.now, stored, HeldAll);
  ASSERT_EQ(plan.size(), 3u);
  for (size_t j = 0; j < 3; ++j) EXPECT_EQ(plan[j], r.refs[j]) << j;
}

TEST(StoredChunks, AChangedFingerprintACollectedChunkOrNoFingerprintIsCopied) {
  Release r;
  StoredChunks stored = RecordStoredChunks(r.jobs, r.ranges, r.now, r.refs);
  // The first chunk changed on the device (its fingerprint differs in one sum).
  RangeFingerprints changed = r.now;
  (*changed[0])[0].b ^= 1;
  auto plan = PlanUnchangedChunks(r.jobs, r.ranges, changed, stored, HeldAll);
  EXPECT_FALSE(plan[0]);
  EXPECT_EQ(plan[1], r.refs[1]);
  EXPECT_EQ(plan[2], r.refs[2]);
  // The third chunk's file was collected from the store since; the zero
  // chunk is no file and stays as it was whatever the store holds.
  plan = PlanUnchangedChunks(r.jobs, r.ranges, r.now, stored,
                             [](const chunks::ChunkRef& ref) { return ref.zero || ref.digest[0] != 3; });
  EXPECT_EQ(plan[0], r.refs[0]);
  EXPECT_EQ(plan[1], r.refs[1]);
  EXPECT_FALSE(plan[2]);
  // The kernel gave no fingerprints for the second range.
  RangeFingerprints partial = r.now;
  partial[1].reset();
  plan = PlanUnchangedChunks(r.jobs, r.ranges, partial, stored, HeldAll);
  EXPECT_TRUE(plan[0] && plan[1]);
  EXPECT_FALSE(plan[2]);
}

TEST(StoredChunks, ARangeOfAnotherSizeAtTheSameAddressIsAnotherRange) {
  Release r;
  StoredChunks stored = RecordStoredChunks(r.jobs, r.ranges, r.now, r.refs);
  // Freed and allocated again larger at the same address: same fingerprints,
  // but nothing recorded of this range.
  std::vector<DeviceRange> grown = r.ranges;
  grown[1].size = 8 << 20;
  std::vector<ChunkJob> jobs = ChunkJobs(grown);
  auto plan = PlanUnchangedChunks(jobs, grown, r.now, stored, HeldAll);
  EXPECT_TRUE(plan[0] && plan[1]);
  EXPECT_FALSE(plan[2]);
}

TEST(StoredChunks, ScratchAndUnfingerprintedChunksAreNotRecorded) {
  Release r;
  std::vector<chunks::ChunkRef> refs = r.refs;
  refs[1].scratch = true;
  RangeFingerprints now = r.now;
  now[1].reset();
  StoredChunks stored = RecordStoredChunks(r.jobs, r.ranges, now, refs);
  ASSERT_EQ(stored.size(), 1u);
  EXPECT_EQ(stored.begin()->first, (ChunkKey{0x10000000, 2 * kChunk, 0}));
  EXPECT_EQ(stored.begin()->second, (StoredChunk{{1, 2}, r.refs[0]}));
}

TEST(StoredChunks, ALoadOfOtherChunksForgetsThoseOnly) {
  Release r;
  StoredChunks stored = RecordStoredChunks(r.jobs, r.ranges, r.now, r.refs);
  chunks::ChunkManifest m;
  m.allocations.push_back({0x10000000, 2 * kChunk, 0, {Stored(1), Stored(9)}});
  StoredChunks kept = ForgetOthers(stored, m);
  EXPECT_EQ(kept.size(), 2u);
  EXPECT_TRUE(kept.contains({0x10000000, 2 * kChunk, 0}));
  EXPECT_FALSE(kept.contains({0x10000000, 2 * kChunk, 1}));
  EXPECT_TRUE(kept.contains({0x40000000, 6 << 20, 0}));
}

}  // namespace
}  // namespace gpusnap::gpushare::shim
