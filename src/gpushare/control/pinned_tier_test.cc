#include "gpushare/control/pinned_tier.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "cuda/fake_cuda_testing.h"
#include "cuda/gpu_session.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::gpushare::control {
namespace {

using cuda::fakes::FakeCuda;

// Polls the tier's whole chunks for up to 10 s until there are `want` or more.
uint64_t WaitForChunks(const PinnedTier& tier, uint64_t want) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (tier.gauges().chunks < want && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return tier.gauges().chunks;
}

TEST(PinnedTier, AdmissionsLaterWaitUntilEveryHoldIsGone) {
  FakeCuda fake;
  cuda::LoadOptions load;
  load.library = FakeCuda::Library();
  auto session = cuda::GpuSession::Open(load);
  ASSERT_TRUE(session.ok()) << session.status().message();
  auto tier = PinnedTier::Make(*session, 4 * chunks::kChunkBytes);
  ASSERT_TRUE(tier.ok()) << tier.status().message();
  TempDir dir("pinned-tier");
  auto store = chunks::ChunkStore::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().message();
  std::vector<char> a(1 << 20, 'a'), b(1 << 20, 'b');
  auto ref_a = store->SaveChunk(a.data(), a.size());
  auto ref_b = store->SaveChunk(b.data(), b.size());
  ASSERT_TRUE(ref_a.ok() && ref_b.ok());

  // Two holds (two fills at once): queued admissions wait for both.
  PinnedTier::AdmissionHold first = (*tier)->HoldAdmissions();
  PinnedTier::AdmissionHold second = (*tier)->HoldAdmissions();
  (*tier)->AdmitLater(dir.path(), {*ref_a, *ref_b});
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ((*tier)->gauges().chunks, 0u);
  first.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ((*tier)->gauges().chunks, 0u);
  second.reset();
  EXPECT_EQ(WaitForChunks(**tier, 2), 2u);

  // Admit (a warm, a standby) does not wait for holds.
  std::vector<char> c(1 << 20, 'c');
  auto ref_c = store->SaveChunk(c.data(), c.size());
  ASSERT_TRUE(ref_c.ok());
  PinnedTier::AdmissionHold held = (*tier)->HoldAdmissions();
  auto admitted = (*tier)->Admit(*store, {*ref_c});
  ASSERT_TRUE(admitted.ok()) << admitted.status().message();
  EXPECT_EQ(admitted->admitted, 1u);
  EXPECT_EQ((*tier)->gauges().chunks, 3u);
}

TEST(PinnedTier, AnAdmissionUnderWayStopsBetweenChunksForAHoldTakenMeanwhile) {
  FakeCuda fake;
  fake.Set("HANG_MS", "cuMemHostAlloc:100");  // each slot's pinning: 100 ms, as a real one is slow
  cuda::LoadOptions load;
  load.library = FakeCuda::Library();
  auto session = cuda::GpuSession::Open(load);
  ASSERT_TRUE(session.ok()) << session.status().message();
  constexpr uint64_t kChunks = 24;
  auto tier = PinnedTier::Make(*session, kChunks * chunks::kChunkBytes);
  ASSERT_TRUE(tier.ok()) << tier.status().message();
  TempDir dir("pinned-tier");
  auto store = chunks::ChunkStore::Open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().message();
  std::vector<chunks::ChunkRef> refs;
  for (uint64_t i = 0; i < kChunks; ++i) {
    std::vector<char> bytes(4096, static_cast<char>('A' + i));
    auto ref = store->SaveChunk(bytes.data(), bytes.size());
    ASSERT_TRUE(ref.ok());
    refs.push_back(*ref);
  }

  (*tier)->AdmitLater(dir.path(), refs);
  ASSERT_GE(WaitForChunks(**tier, 1), 1u);  // under way
  PinnedTier::AdmissionHold hold = (*tier)->HoldAdmissions();
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the chunks in flight finish
  uint64_t stopped_at = (*tier)->gauges().chunks;
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  EXPECT_EQ((*tier)->gauges().chunks, stopped_at);
  EXPECT_LT(stopped_at, kChunks);
  hold.reset();
  EXPECT_EQ(WaitForChunks(**tier, kChunks), kChunks);
}

}  // namespace
}  // namespace gpusnap::gpushare::control
