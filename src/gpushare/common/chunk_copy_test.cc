// FillFromChunks on the fake driver, whose device memory is host memory the
// test can read: what lands where, and which copies need a pinned staging
// buffer (the fake logs every cuMemHostAlloc).
#include "gpushare/common/chunk_copy.h"

#include <cstring>
#include <optional>
#include <vector>

#include <gtest/gtest.h>

#include "chunks/chunk_store.h"
#include "gpushare/common/fake_driver_testing.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::gpushare {
namespace {

class ChunkFillTest : public FakeDriverTest {
 protected:
  void SetUp() override {
    FakeDriverTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_EQ(d_.mem_alloc(&device_, kSize), abi::CUDA_SUCCESS);
    auto store = chunks::ChunkStore::Open(dir_.path());
    ASSERT_TRUE(store.ok()) << store.status().message();
    store_.emplace(std::move(*store));
    // Chunk 0 zero, chunk 1 (the short last one) a pattern in the store.
    pattern_.resize(kSize - chunks::kChunkBytes);
    for (size_t i = 0; i < pattern_.size(); ++i) pattern_[i] = static_cast<char>(i * 7 + 3);
    auto stored = store_->SaveChunk(pattern_.data(), pattern_.size());
    ASSERT_TRUE(stored.ok()) << stored.status().message();
    ASSERT_FALSE(stored->zero);
    chunks::ChunkRef zero;
    zero.zero = true;
    zero.length = chunks::kChunkBytes;
    allocation_.size = kSize;
    allocation_.chunks = {zero, *stored};
  }
  void TearDown() override {
    if (device_) d_.mem_free(device_);
    FakeDriverTest::TearDown();
  }
  // Fills the device memory (first spoilt with 0xff) and checks it holds the
  // zero chunk and the pattern.
  void FillAndCheck(const PinnedLookup& pinned) {
    std::memset(reinterpret_cast<void*>(device_), 0xff, kSize);
    Status st = FillFromChunks(d_, *store_, {{device_, kSize, context()}}, {&allocation_}, 4, pinned);
    ASSERT_TRUE(st.ok()) << st.message();
    const char* got = reinterpret_cast<const char*>(device_);
    std::vector<char> zeros(chunks::kChunkBytes, 0);
    EXPECT_EQ(std::memcmp(got, zeros.data(), zeros.size()), 0);
    EXPECT_EQ(std::memcmp(got + chunks::kChunkBytes, pattern_.data(), pattern_.size()), 0);
  }
  size_t Pinnings() const { return fake_.Calls("cuMemHostAlloc").size(); }

  static constexpr uint64_t kSize = chunks::kChunkBytes + (3 << 20);
  TempDir dir_{"chunk-fill"};
  std::optional<chunks::ChunkStore> store_;
  abi::CUdeviceptr device_ = 0;
  std::vector<char> pattern_;
  chunks::ChunkedAllocation allocation_;
};

TEST_F(ChunkFillTest, AFillOfZeroAndPinnedChunksPinsNoStagingBuffer) {
  std::vector<char> pinned_copy = pattern_;  // as the pinned tier would hold it
  size_t before = Pinnings();
  FillAndCheck([&](const chunks::ChunkRef& ref) -> const void* {
    return ref == allocation_.chunks[1] ? pinned_copy.data() : nullptr;
  });
  EXPECT_EQ(Pinnings(), before);
}

TEST_F(ChunkFillTest, AChunkReadFromTheStoreGoesThroughAPinnedStagingBuffer) {
  size_t before = Pinnings();
  FillAndCheck(nullptr);
  // One worker read the one stored chunk (3 MiB: one 16 MiB piece, one buffer).
  EXPECT_EQ(Pinnings(), before + 1);
}

}  // namespace
}  // namespace gpusnap::gpushare
