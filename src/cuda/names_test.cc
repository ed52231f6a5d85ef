#include "cuda/names.h"

#include <gtest/gtest.h>

namespace gpusnap::cuda {
namespace {

TEST(CudaNames, BuiltinTableNamesTheCheckpointErrors) {
  EXPECT_EQ(FormatResult(801, nullptr), "CUDA_ERROR_NOT_SUPPORTED (801)");
  EXPECT_EQ(FormatResult(600, nullptr), "CUDA_ERROR_NOT_READY (600)");
  EXPECT_EQ(FormatResult(401, nullptr), "CUDA_ERROR_ILLEGAL_STATE (401)");
  EXPECT_EQ(FormatResult(304, nullptr), "CUDA_ERROR_OPERATING_SYSTEM (304)");
  EXPECT_EQ(FormatResult(100, nullptr), "CUDA_ERROR_NO_DEVICE (100)");
}

TEST(CudaNames, DriverNameWinsOverTheTable) {
  EXPECT_EQ(FormatResult(801, "CUDA_ERROR_FROM_DRIVER"), "CUDA_ERROR_FROM_DRIVER (801)");
  EXPECT_EQ(FormatResult(801, ""), "CUDA_ERROR_NOT_SUPPORTED (801)");
}

TEST(CudaNames, UnknownCodeKeepsItsNumber) {
  EXPECT_EQ(BuiltinErrorName(12345), nullptr);
  EXPECT_EQ(FormatResult(12345, nullptr), "unknown CUDA error (12345)");
}

TEST(CudaNames, ProcessStates) {
  EXPECT_EQ(StateName(ProcessState::kRunning), "RUNNING");
  EXPECT_EQ(StateName(ProcessState::kLocked), "LOCKED");
  EXPECT_EQ(StateName(ProcessState::kCheckpointed), "CHECKPOINTED");
  EXPECT_EQ(StateName(ProcessState::kFailed), "FAILED");
  EXPECT_EQ(StateName(static_cast<ProcessState>(7)), "UNKNOWN(7)");
}

}  // namespace
}  // namespace gpusnap::cuda
