#include "cuda/driver.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "cuda/fake_cuda_testing.h"
#include "cuda/gpus.h"

namespace gpusnap::cuda {
namespace {

using fakes::FakeCuda;

TEST(CudaDriver, LoadsTheFakeAndCallsCuInitOnce) {
  FakeCuda fake;
  auto driver = FakeCuda::Load();
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  EXPECT_EQ(driver->version(), 13000);
  EXPECT_TRUE(driver->SupportsGpuRemap());
  EXPECT_EQ(driver->path(), FakeCuda::Library());
  auto inits = fake.Calls("cuInit");
  ASSERT_EQ(inits.size(), 1u);
  EXPECT_EQ(inits[0].rc, 0);
  // The version is checked before anything is initialised.
  auto calls = fake.Calls();
  ASSERT_GE(calls.size(), 2u);
  EXPECT_EQ(calls[0].fn, "cuDriverGetVersion");
}

TEST(CudaDriver, TooOldDriverIsRefusedNamingBothVersions) {
  FakeCuda fake;
  fake.Set("DRIVER_VERSION", "12040");
  auto driver = FakeCuda::Load();
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), Code::kNotSupported);
  EXPECT_NE(driver.status().message().find("12.4 (12040) is too old"), std::string::npos) << driver.status().message();
  EXPECT_NE(driver.status().message().find("12.8 (12080)"), std::string::npos) << driver.status().message();
  EXPECT_TRUE(fake.Calls("cuInit").empty());
}

TEST(CudaDriver, R570WithoutGpuRemapIsAccepted) {
  FakeCuda fake;
  fake.Set("DRIVER_VERSION", "12080");
  auto driver = FakeCuda::Load();
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  EXPECT_FALSE(driver->SupportsGpuRemap());
}

TEST(CudaDriver, MissingSymbolIsNamed) {
  FakeCuda fake;
  auto driver = FakeCuda::Load("no-lock");
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), Code::kNotSupported);
  EXPECT_NE(driver.status().message().find("lacks cuCheckpointProcessLock (required)"), std::string::npos)
      << driver.status().message();
  EXPECT_NE(driver.status().message().find("no-lock/libcuda.so.1"), std::string::npos) << driver.status().message();
}

TEST(CudaDriver, MissingLibraryIsNotFound) {
  LoadOptions options;
  options.library = "/nonexistent/libcuda.so.1";
  auto driver = Driver::Load(options);
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), Code::kNotFound);
  EXPECT_NE(driver.status().message().find("/nonexistent/libcuda.so.1"), std::string::npos);
}

TEST(CudaDriver, FailingCuInitIsNamed) {
  FakeCuda fake;
  fake.Set("FAIL", "cuInit:*:100");
  auto driver = FakeCuda::Load();
  ASSERT_FALSE(driver.ok());
  EXPECT_EQ(driver.status().code(), Code::kExternal);
  EXPECT_EQ(driver.status().message(), "cuInit: CUDA_ERROR_NO_DEVICE (100)");
}

TEST(CudaDriver, ErrorNamesComeFromTheDriverOrTheTable) {
  FakeCuda fake;
  auto driver = FakeCuda::Load();
  ASSERT_TRUE(driver.ok());
  EXPECT_EQ(driver->ErrorName(801), "CUDA_ERROR_NOT_SUPPORTED (801)");
  EXPECT_EQ(driver->ErrorName(909), "CUDA_ERROR_TIMEOUT (909)");  // the fake does not know it; the table does
  fake.Set("FAIL", "cuGetErrorName:*:1");
  EXPECT_EQ(driver->ErrorName(801), "CUDA_ERROR_NOT_SUPPORTED (801)");
  EXPECT_EQ(driver->ErrorName(4242), "unknown CUDA error (4242)");
}

TEST(CudaDriver, ListsGpus) {
  FakeCuda fake;
  fake.Set("GPUS", "2");
  auto driver = FakeCuda::Load();
  ASSERT_TRUE(driver.ok());
  auto gpus = ListGpus(*driver);
  ASSERT_TRUE(gpus.ok()) << gpus.status().ToString();
  ASSERT_EQ(gpus->size(), 2u);
  EXPECT_EQ((*gpus)[1].index, 1);
  EXPECT_EQ(FormatUuid((*gpus)[1].uuid), "GPU-5afec0da-0000-0000-0000-000000000001");
  EXPECT_EQ((*gpus)[1].name, "Fake NVIDIA H200 #1");
  EXPECT_EQ((*gpus)[1].total_bytes, std::uint64_t{143771} << 20);
  EXPECT_EQ((*gpus)[1].cc_major, 9);
  EXPECT_EQ((*gpus)[1].cc_minor, 0);
  EXPECT_EQ(fake.Calls("cuDeviceGetUuid_v2").size(), 2u);  // the _v2 entry point is preferred
}

TEST(CudaDriver, FailingDeviceQueryNamesCallAndGpu) {
  FakeCuda fake;
  fake.Set("GPUS", "2");
  auto driver = FakeCuda::Load();
  ASSERT_TRUE(driver.ok());
  fake.Set("FAIL", "cuDeviceTotalMem_v2:*:999");
  auto gpus = ListGpus(*driver);
  ASSERT_FALSE(gpus.ok());
  EXPECT_EQ(gpus.status().message(), "cuDeviceTotalMem (GPU 0): CUDA_ERROR_UNKNOWN (999)");
}

// Run by ctest as `unit.cuda_dlopen`, with the fake's directory in
// LD_LIBRARY_PATH: the plain dlopen("libcuda.so.1") gpusnap does in production.
TEST(CudaDlopen, DefaultSonameFindsTheFakeThroughLdLibraryPath) {
  const char* path = std::getenv("LD_LIBRARY_PATH");
  if (path == nullptr || std::string(path).find(GPUSNAP_FAKE_CUDA_DIR) == std::string::npos)
    GTEST_SKIP() << "needs LD_LIBRARY_PATH=" << GPUSNAP_FAKE_CUDA_DIR << " (ctest -R unit.cuda_dlopen)";
  FakeCuda fake;
  auto driver = Driver::Load();
  ASSERT_TRUE(driver.ok()) << driver.status().ToString();
  EXPECT_EQ(driver->path(), FakeCuda::Library());
  EXPECT_EQ(fake.Calls("cuInit").size(), 1u);
}

}  // namespace
}  // namespace gpusnap::cuda
