#include "registry/rate_floor.h"

#include <gtest/gtest.h>

namespace gpusnap::registry {
namespace {

TEST(RegistryRateFloor, ADripBelowTheFloorFailsOnceAWindowIsOver) {
  RateFloor floor(1000, 10);
  double t = 0;
  for (; t < 10; t += 2) EXPECT_TRUE(floor.Arrived(1, t)) << t;  // within the first window: not judged yet
  EXPECT_FALSE(floor.Arrived(1, t));
}

TEST(RegistryRateFloor, ASteadyTransferAboveTheFloorGoesOn) {
  RateFloor floor(1000, 10);
  for (double t = 0.5; t < 100; t += 0.5) ASSERT_TRUE(floor.Arrived(600, t)) << t;
}

TEST(RegistryRateFloor, EachWindowIsJudgedOnItsOwn) {
  RateFloor floor(1000, 10);
  EXPECT_TRUE(floor.Arrived(50000, 1));
  EXPECT_TRUE(floor.Arrived(1, 11));   // the first window carried it
  EXPECT_FALSE(floor.Arrived(1, 22));  // the second did not
}

TEST(RegistryRateFloor, ZeroIsNoFloor) {
  RateFloor floor(0, 1);
  EXPECT_TRUE(floor.Arrived(0, 1000));
}

}  // namespace
}  // namespace gpusnap::registry
