#include "gpushare/tree.h"

#include <gtest/gtest.h>

namespace gpusnap::gpushare {
namespace {

TEST(GpushareTree, AllOrNoneOfTheGpuProcessesLoadTheShim) {
  EXPECT_TRUE(*DecideShimUse({10, 11}, {true, true}));
  EXPECT_FALSE(*DecideShimUse({10, 11}, {false, false}));
  EXPECT_FALSE(*DecideShimUse({}, {}));
  auto mixed = DecideShimUse({10, 11, 12}, {true, false, true});
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(mixed.status().message().find("GPU process 10 loads the gpushare shim but GPU process 11 does not"),
            std::string::npos);
}

TEST(GpushareTree, ManifestIsNamedByTheNamespacePid) {
  EXPECT_EQ(ManifestPath("/s/tmp/x/gpu", {4711, 2, "n"}), "/s/tmp/x/gpu/2.chunks");
}

TEST(GpushareTree, SendToANameNobodyListensOnSaysSo) {
  auto r = Send({4711, 2, "gpusnap-gpushare.test-nobody-listens"}, {}, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("gpushare `state` of pid 4711: cannot reach its control socket"),
            std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace gpusnap::gpushare
