#include "gpu/wake_fit.h"

#include <gtest/gtest.h>

namespace gpusnap::gpu {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;

TEST(PlanWakeFit, FitsWhenEveryGpuHasRoom) {
  EXPECT_TRUE(PlanWakeFit({}, {}).ok());
  EXPECT_TRUE(PlanWakeFit({{0, 2 * kGiB}}, {{0, 2 * kGiB}}).ok());  // exactly what is free
  EXPECT_TRUE(PlanWakeFit({{0, kGiB}, {1, 3 * kGiB}}, {{0, 80 * kGiB}, {1, 3 * kGiB}, {2, 0}}).ok());
}

TEST(PlanWakeFit, NamesTheGpuItsNeedAndItsFreeMemory) {
  Status st = PlanWakeFit({{0, kGiB}, {1, 5 * kGiB}}, {{0, 80 * kGiB}, {1, 3 * kGiB}});
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_EQ(st.message(), fmt::format("GPU 1 has 3.0 GiB free; the wake needs 5.0 GiB of device memory on it ({} more "
                                      "bytes than free)",
                                      2 * kGiB));
}

TEST(PlanWakeFit, TheFirstGpuShortOfRoomIsNamed) {
  Status st = PlanWakeFit({{2, 10}, {1, 10}}, {{1, 9}, {2, 9}});
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_EQ(st.message().rfind("GPU 1 has 9 B free; the wake needs 10 B", 0), 0u) << st.message();
}

TEST(PlanWakeFit, AGpuNotMeasuredIsABug) {
  EXPECT_EQ(PlanWakeFit({{3, 1}}, {{0, kGiB}}).code(), Code::kInternal);
}

}  // namespace
}  // namespace gpusnap::gpu
