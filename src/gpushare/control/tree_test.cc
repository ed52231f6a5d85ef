#include "gpushare/control/tree.h"

#include <gtest/gtest.h>

namespace gpusnap::gpushare::control {
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

TEST(GpushareTree, AnInPlaceWorkloadIsWholeOnlyAllRunningOrAllReleasedWithAllItsMemory) {
  const InPlaceShimState running{"running", 100, 0}, released{"released", 100, 100}, quiesced{"quiesced", 100, 0};
  // Adopted memory (a resume stopped before its load) or a load half done: still released, not all of it.
  const InPlaceShimState adopted{"released", 100, 40};
  EXPECT_EQ(JudgeInPlace({running, running}), InPlaceWhole::kRunning);
  EXPECT_EQ(JudgeInPlace({released, released}), InPlaceWhole::kSuspended);
  EXPECT_EQ(JudgeInPlace({quiesced}), InPlaceWhole::kUnsettled);
  EXPECT_EQ(JudgeInPlace({adopted}), InPlaceWhole::kUnsettled);
  EXPECT_EQ(JudgeInPlace({released, adopted}), InPlaceWhole::kUnsettled);
  EXPECT_EQ(JudgeInPlace({running, released}), InPlaceWhole::kUnsettled);
  EXPECT_EQ(JudgeInPlace({running, quiesced}), InPlaceWhole::kUnsettled);
  EXPECT_STREQ(InPlaceWholeName(InPlaceWhole::kSuspended), "suspended");
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

TEST(GpushareTree, ImportsAreMatchedToTheirExportersByOpenFile) {
  std::vector<ShimProcess> procs{{100, 2, "a"}, {101, 3, "b"}, {102, 4, "c"}};
  // pid 100 exported objects 0x10 (fd 7) and 0x20 (fd 8); 101 imported 0x20
  // (its fd 5), 102 imported 0x10 (its fd 11).
  std::vector<ProcessSharing> sharing{{{{0x10, 7}, {0x20, 8}}, {}}, {{}, {{0xa1, 5}}}, {{}, {{0xa2, 11}}}};
  auto same = [](size_t ia, int a, size_t ib, int b) {
    return ib == 0 && ((ia == 1 && a == 5 && b == 8) || (ia == 2 && a == 11 && b == 7));
  };
  auto shares = MatchShares(procs, sharing, same);
  ASSERT_TRUE(shares.ok()) << shares.status().ToString();
  EXPECT_TRUE((*shares)[0].empty());
  EXPECT_EQ((*shares)[1], (std::vector<Share>{{0xa1, 2, 0x20}}));
  EXPECT_EQ((*shares)[2], (std::vector<Share>{{0xa2, 2, 0x10}}));
}

TEST(GpushareTree, AnImportFromOutsideTheProcessesIsRefused) {
  std::vector<ShimProcess> procs{{100, 2, "a"}, {101, 3, "b"}};
  std::vector<ProcessSharing> sharing{{{{0x10, 7}}, {}}, {{}, {{0xa1, 5}}}};
  auto shares = MatchShares(procs, sharing, [](size_t, int, size_t, int) { return false; });
  ASSERT_FALSE(shares.ok());
  EXPECT_NE(shares.status().message().find("pid 101 maps device memory (0xa1) that no other GPU process"),
            std::string::npos)
      << shares.status().message();
}

TEST(GpushareTree, QuiesceAttemptsStartShortAndGrow) {
  EXPECT_EQ(QuiesceAttemptMs(1, 10000), 200);
  EXPECT_EQ(QuiesceAttemptMs(16, 10000), 200);
  EXPECT_EQ(QuiesceAttemptMs(17, 10000), 400);
  EXPECT_EQ(QuiesceAttemptMs(24, 10000), 400);
  EXPECT_EQ(QuiesceAttemptMs(25, 10000), 800);
  EXPECT_EQ(QuiesceAttemptMs(41, 10000), 3200);
  EXPECT_EQ(QuiesceAttemptMs(90, 10000), 3200);
  EXPECT_EQ(QuiesceAttemptMs(1, 150), 150);
}

TEST(GpushareTree, SharesRoundTripAndStateIsRead) {
  std::vector<Share> shares{{0x6753000000000001, 2, 0x7f0000200000}};
  EXPECT_EQ(*DecodeShares(EncodeShares(shares), "x"), shares);
  EXPECT_FALSE(DecodeShares("{}", "/s/gpu/3.shares").ok());
  EXPECT_FALSE(DecodeShares("[{\"import\":1}]", "x").ok());
  EXPECT_EQ(SharesPath("/s/gpu/3.chunks"), "/s/gpu/3.shares");
  auto sharing = SharingFromState(nlohmann::json::parse(
      R"({"exports":[{"object":16,"fd":7}],"imports":[{"import":5,"fd":9},{"import":6,"fd":-1}]})"));
  ASSERT_EQ(sharing.exports.size(), 1u);
  EXPECT_EQ(sharing.exports[0].id, 16u);
  ASSERT_EQ(sharing.imports.size(), 1u);  // an fd of -1 is no fd
  EXPECT_EQ(sharing.imports[0].fd, 9);
}

}  // namespace
}  // namespace gpusnap::gpushare::control
