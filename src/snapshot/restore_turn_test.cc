#include "snapshot/restore_turn.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <mutex>
#include <thread>

#include "criu/images_testing.h"
#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap {
namespace {

namespace img = criu::testing;

TEST(NeedsRestoreTurn, OnlyImagesThatHoldAGhostFile) {
  EXPECT_FALSE(NeedsRestoreTurn({}));
  EXPECT_FALSE(NeedsRestoreTurn({"inventory.img", "pstree.img", "files.img", "remap-fpath.img", "pages-1.img"}));
  EXPECT_TRUE(NeedsRestoreTurn({"inventory.img", "ghost-file-1.img", "files.img"}));
  EXPECT_TRUE(NeedsRestoreTurn({"ghost-file-1a.img"}));
  EXPECT_FALSE(NeedsRestoreTurn({"ghost-file-.img"}));
  EXPECT_FALSE(NeedsRestoreTurn({"ghost-file-1.img.partial"}));
  EXPECT_FALSE(NeedsRestoreTurn({"my-ghost-file-1.img"}));
}

class RestoreTurnTest : public ::testing::Test {
 protected:
  TempDir tmp_{"restore-turn"};
  std::string images_, root_;
  std::vector<std::string> told_;
  std::mutex told_mu_;

  void SetUp() override {
    images_ = tmp_.path() + "/images";
    root_ = tmp_.path() + "/root";
    ASSERT_TRUE(MakeDirs(images_).ok());
    ASSERT_TRUE(MakeDirs(root_ + "/data").ok());
    ASSERT_EQ(::setenv("GPUSNAP_RUN_DIR", (tmp_.path() + "/run").c_str(), 1), 0);
    Write("pstree.img", "");
  }
  void TearDown() override { ::unsetenv("GPUSNAP_RUN_DIR"); }

  void Write(const std::string& name, const std::string& bytes) {
    ASSERT_TRUE(WriteFileSynced(images_ + "/" + name, bytes).ok()) << name;
  }
  // The images of a tree that held /data/w.bin open after deleting it.
  void WithGhost() {
    Write("files.img", img::Image(img::kFilesMagic, {img::RegularFile(0x17, "/data/w.bin")}));
    Write("remap-fpath.img", img::Image(img::kRemapFpathMagic, {img::Remap(0x17, 1, 1)}));
    Write("ghost-file-1.img", img::Image(img::kGhostFileMagic, {img::Ghost(S_IFREG | 0644)}, "contents"));
  }
  RestoreTurnSpec Spec(std::chrono::seconds timeout = std::chrono::seconds(30)) {
    return {.images_dir = images_,
            .root = root_,
            .snapshot_id = "snap-1",
            .timeout = timeout,
            .progress = [this](const ProgressEvent& e) {
              std::lock_guard<std::mutex> lock(told_mu_);
              if (!e.done) told_.push_back(e.phase);
            }};
  }
  std::vector<std::string> Told() {
    std::lock_guard<std::mutex> lock(told_mu_);
    return told_;
  }
};

TEST_F(RestoreTurnTest, ImagesWithoutAGhostTakeNoTurn) {
  ProgressFn none;
  Phases phases(none);
  auto first = TakeRestoreTurn(Spec(), phases);
  auto second = TakeRestoreTurn(Spec(), phases);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_FALSE(first->held());
  EXPECT_FALSE(second->held());
  EXPECT_EQ(first->fd(), -1);
  EXPECT_EQ(phases.timings().count("wait-turn"), 0u);
  EXPECT_TRUE(Told().empty());
}

TEST_F(RestoreTurnTest, ASecondTurnWaitsForTheFirstAndSaysForWhom) {
  WithGhost();
  ProgressFn none;
  Phases first_phases(none);
  auto first = TakeRestoreTurn(Spec(), first_phases);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(first->held());
  EXPECT_GE(first->fd(), 0);
  EXPECT_EQ(first_phases.timings().count("wait-turn"), 1u);

  std::atomic<bool> second_held{false};
  auto second = std::async(std::launch::async, [&] {
    Phases phases(none);
    auto turn = TakeRestoreTurn(Spec(), phases);
    second_held = turn.ok() && turn->held();
    return phases.timings()["wait-turn"];
  });
  for (int i = 0; i < 500 && Told().empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(second_held);
  auto told = Told();
  ASSERT_EQ(told.size(), 1u);
  EXPECT_NE(told[0].find("wait-turn: waiting for the restore at CRIU (pid " + std::to_string(::getpid()) +
                         ", snapshot snap-1)"),
            std::string::npos)
      << told[0];
  first->Release();
  double waited = second.get();
  EXPECT_TRUE(second_held);
  EXPECT_GE(waited, 0.3);
}

TEST_F(RestoreTurnTest, ATurnNotFreedInTimeIsATimeoutNamingItsHolder) {
  WithGhost();
  ProgressFn none;
  Phases phases(none);
  auto first = TakeRestoreTurn(Spec(), phases);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = TakeRestoreTurn(Spec(std::chrono::seconds(1)), phases);
  EXPECT_EQ(second.status().code(), Code::kTimeout);
  EXPECT_NE(second.status().message().find("waited 1 s for the turn at CRIU, held by the restore (pid " +
                                           std::to_string(::getpid()) + ", snapshot snap-1)"),
            std::string::npos)
      << second.status().message();
}

TEST_F(RestoreTurnTest, AGhostAKilledRestoreLeftIsRemovedWithTheTurn) {
  WithGhost();
  std::string left = root_ + "/data/w.bin.cr.1.ghost";
  ASSERT_TRUE(WriteFileSynced(left, "stale").ok());
  ASSERT_TRUE(WriteFileSynced(root_ + "/data/w.bin.cr.2.ghost", "not this snapshot's").ok());
  ProgressFn none;
  Phases phases(none);
  auto turn = TakeRestoreTurn(Spec(), phases);
  ASSERT_TRUE(turn.ok()) << turn.status().ToString();
  EXPECT_NE(::access(left.c_str(), F_OK), 0);
  EXPECT_EQ(::access((root_ + "/data/w.bin.cr.2.ghost").c_str(), F_OK), 0);
  auto told = Told();
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0], "wait-turn: removed `/data/w.bin.cr.1.ghost`, left by a restore killed while CRIU ran");
}

TEST_F(RestoreTurnTest, ImagesItCannotReadStillTakeTheirTurnAndSaySo) {
  Write("ghost-file-1.img", "not an image");
  Write("remap-fpath.img", "neither");
  ProgressFn none;
  Phases phases(none);
  auto turn = TakeRestoreTurn(Spec(), phases);
  ASSERT_TRUE(turn.ok()) << turn.status().ToString();
  EXPECT_TRUE(turn->held());
  auto told = Told();
  ASSERT_EQ(told.size(), 1u);
  EXPECT_NE(told[0].find("not looking for ghost files a killed restore left: CRIU image"), std::string::npos)
      << told[0];
}

}  // namespace
}  // namespace gpusnap
