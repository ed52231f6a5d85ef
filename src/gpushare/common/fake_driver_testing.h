// Test support: a GoogleTest fixture holding the fake libcuda
// (tests/fakes/libcuda) as the shim and gpusnap's control side hold the real
// one (a RealDriver), with GPU 0's primary context current. Its device
// memory is host memory the test can read. Header-only; unit tests only.
#pragma once

#include <dlfcn.h>

#include <gtest/gtest.h>

#include "cuda/fake_cuda_testing.h"
#include "gpushare/common/driver_table.h"

namespace gpusnap::gpushare {

class FakeDriverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    lib_ = ::dlopen(cuda::fakes::FakeCuda::Library().c_str(), RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(lib_, nullptr) << ::dlerror();
    d_ = ResolveRealDriver(lib_, &::dlsym);
    ASSERT_EQ(d_.missing, "");
    auto init = reinterpret_cast<abi::PFN_cuInit>(::dlsym(lib_, "cuInit"));
    ASSERT_EQ(init(0), abi::CUDA_SUCCESS);
    ASSERT_EQ(d_.primary_ctx_retain(&ctx_, 0), abi::CUDA_SUCCESS);
    ASSERT_EQ(d_.ctx_set_current(ctx_), abi::CUDA_SUCCESS);
  }
  void TearDown() override {
    if (ctx_) d_.primary_ctx_release(0);
  }
  uint64_t context() const { return reinterpret_cast<uint64_t>(ctx_); }

  cuda::fakes::FakeCuda fake_;  // first: its log and state are set before the library loads
  void* lib_ = nullptr;
  RealDriver d_;
  abi::CUcontext ctx_ = nullptr;
};

}  // namespace gpusnap::gpushare
