// The fingerprint kernel's launches, run on the fake driver: the fake's
// module computes the reference (chunk_fingerprint.h) for whatever the
// launches give it, so these tests hold the launcher's part (the ranges,
// their chunks, the grid, where each chunk's sums land) to the reference.
// That the PTX computes the reference too takes a GPU: tests/gpu
// (test_gpushare_unchanged_chunks, through gpusnap_fingerprint_check).
#include "gpushare/common/fingerprint_kernel.h"

#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "chunks/chunk_store.h"
#include "gpushare/common/fake_driver_testing.h"

namespace gpusnap::gpushare {
namespace {

class FingerprintKernelTest : public FakeDriverTest {
 protected:
  void TearDown() override {
    for (abi::CUdeviceptr p : allocated_) d_.mem_free(p);
    FakeDriverTest::TearDown();
  }
  // `bytes` of device memory holding `fill`'s pattern.
  abi::CUdeviceptr Filled(uint64_t bytes, unsigned char seed) {
    abi::CUdeviceptr p = 0;
    EXPECT_EQ(d_.mem_alloc(&p, bytes), abi::CUDA_SUCCESS);
    allocated_.push_back(p);
    std::vector<unsigned char> host(bytes);
    for (uint64_t i = 0; i < bytes; ++i) host[i] = static_cast<unsigned char>((i * 131 + seed) >> 3);
    EXPECT_EQ(d_.copy_htod_async(p, host.data(), bytes, nullptr), abi::CUDA_SUCCESS);
    return p;
  }
  std::vector<ChunkFingerprint> Reference(abi::CUdeviceptr p, uint64_t bytes) {
    std::vector<ChunkFingerprint> out;
    for (uint64_t off = 0; off < bytes; off += chunks::kChunkBytes)
      out.push_back(FingerprintBytes(reinterpret_cast<const void*>(p + off), std::min(chunks::kChunkBytes, bytes - off)));
    return out;
  }

  std::vector<abi::CUdeviceptr> allocated_;
};

TEST_F(FingerprintKernelTest, EachChunkOfEachRangeGetsItsOwnFingerprint) {
  const uint64_t big = 2 * chunks::kChunkBytes + (2 << 20), small = 6 << 20;
  abi::CUdeviceptr a = Filled(big, 1), b = Filled(small, 2);
  uint64_t ctx = context();
  FingerprintKernel kernel(d_);
  auto got = kernel.Ranges({{a, big, ctx}, {b, small, ctx}, {b, 12, ctx}});
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_EQ(got->size(), 3u);
  ASSERT_TRUE((*got)[0] && (*got)[1]);
  EXPECT_EQ(*(*got)[0], Reference(a, big));
  EXPECT_EQ(*(*got)[1], Reference(b, small));
  EXPECT_FALSE((*got)[2]) << "12 bytes are no whole number of words";
  // The module is loaded once per context, and a byte changed on the device
  // changes that chunk's fingerprint only.
  unsigned char one = 0x5a;
  ASSERT_EQ(d_.copy_htod_async(a + chunks::kChunkBytes + 4321, &one, 1, nullptr), abi::CUDA_SUCCESS);
  auto again = kernel.Ranges({{a, big, ctx}});
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ((*(*again)[0])[0], (*(*got)[0])[0]);
  EXPECT_NE((*(*again)[0])[1], (*(*got)[0])[1]);
  EXPECT_EQ((*(*again)[0])[2], (*(*got)[0])[2]);
  EXPECT_EQ(fake_.Calls("cuModuleLoadData").size(), 1u);
}

TEST_F(FingerprintKernelTest, ALaunchTheDriverRefusesIsAnErrorNamingIt) {
  abi::CUdeviceptr a = Filled(2 << 20, 3);
  fake_.Set("FAIL", "cuLaunchKernel:*:719");
  FingerprintKernel kernel(d_);
  auto got = kernel.Ranges({{a, 2 << 20, context()}});
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("cuLaunchKernel"), std::string::npos) << got.status().message();
}

}  // namespace
}  // namespace gpusnap::gpushare
