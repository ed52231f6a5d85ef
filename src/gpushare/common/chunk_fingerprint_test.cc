#include "gpushare/common/chunk_fingerprint.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

namespace gpusnap::gpushare {
namespace {

std::vector<unsigned char> Pattern(size_t bytes) {
  std::vector<unsigned char> b(bytes);
  uint64_t x = 0x243f6a8885a308d3ull;
  for (auto& c : b) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    c = static_cast<unsigned char>(x >> 56);
  }
  return b;
}

TEST(ChunkFingerprint, EveryFlippedBitChangesBothSums) {
  std::vector<unsigned char> buf = Pattern(4096);
  const ChunkFingerprint base = FingerprintBytes(buf.data(), buf.size());
  for (size_t bit = 0; bit < buf.size() * 8; ++bit) {
    buf[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    ChunkFingerprint f = FingerprintBytes(buf.data(), buf.size());
    buf[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    ASSERT_NE(f.a, base.a) << "bit " << bit;
    ASSERT_NE(f.b, base.b) << "bit " << bit;
  }
  EXPECT_EQ(FingerprintBytes(buf.data(), buf.size()), base);
}

TEST(ChunkFingerprint, AnyChangedByteOfAZeroChunkIsSeen) {
  // Zero memory (a fresh allocation) whose every byte, set once to each value
  // in turn at a few places, is found changed.
  std::vector<unsigned char> buf(1 << 16, 0);
  const ChunkFingerprint zero = FingerprintBytes(buf.data(), buf.size());
  EXPECT_NE(zero, ChunkFingerprint{});
  for (size_t at : {size_t{0}, size_t{7}, size_t{8}, size_t{12345}, buf.size() - 1}) {
    for (int v = 1; v < 256; ++v) {
      buf[at] = static_cast<unsigned char>(v);
      ASSERT_NE(FingerprintBytes(buf.data(), buf.size()), zero) << "byte " << at << " = " << v;
    }
    buf[at] = 0;
  }
}

TEST(ChunkFingerprint, DependsOnTheOrderOfWordsAndOnTheLength) {
  std::vector<unsigned char> buf = Pattern(1024);
  const ChunkFingerprint base = FingerprintBytes(buf.data(), buf.size());
  std::vector<unsigned char> swapped = buf;
  std::memcpy(swapped.data(), buf.data() + 512, 8);
  std::memcpy(swapped.data() + 512, buf.data(), 8);
  EXPECT_NE(FingerprintBytes(swapped.data(), swapped.size()), base);
  std::vector<unsigned char> longer = buf;
  longer.resize(buf.size() + 8, 0);  // a zero word more
  EXPECT_NE(FingerprintBytes(longer.data(), longer.size()), base);
}

TEST(ChunkFingerprint, IsTheSumOfItsWordsInAnyGrouping) {
  // What lets the GPU's threads each sum a share: the whole is the sum of the
  // words' terms however they are split.
  std::vector<unsigned char> buf = Pattern(8 * 1000);
  ChunkFingerprint whole = FingerprintBytes(buf.data(), buf.size()), strided;
  for (uint64_t start = 0; start < 7; ++start) {
    for (uint64_t i = start; i < 1000; i += 7) {
      uint64_t w = 0;
      std::memcpy(&w, buf.data() + i * 8, 8);
      strided.a += FingerprintMixA(w, i);
      strided.b += FingerprintMixB(w, i);
    }
  }
  EXPECT_EQ(strided, whole);
}

}  // namespace
}  // namespace gpusnap::gpushare
