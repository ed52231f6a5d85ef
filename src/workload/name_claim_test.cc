#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "gpusnap/workload.h"
#include "proc/proc.h"
#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap {
namespace {

class NameClaimTest : public ::testing::Test {
 protected:
  TempDir tmp_{"claim-test"};
  void SetUp() override {
    root_ = tmp_.path();
    ::setenv("GPUSNAP_RUN_DIR", root_.c_str(), 1);
  }
  void TearDown() override {
    ::unsetenv("GPUSNAP_RUN_DIR");
  }
  std::string ClaimFile(const std::string& name) const { return root_ + "/workloads/" + name + ".claim"; }

  // This process as a running workload named `name`.
  Workload Self(const std::string& name) const {
    Workload w;
    w.name = name;
    w.pid = ::getpid();
    w.start_time = proc::ReadStat(w.pid)->start_time;
    return w;
  }

  std::string root_;
};

TEST_F(NameClaimTest, SecondClaimIsRefusedNamingTheHolder) {
  auto first = ClaimWorkloadName("web");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = ClaimWorkloadName("web");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kAlreadyExists);
  EXPECT_EQ(second.status().message(),
            fmt::format("a workload named `web` is already being started (by gpusnap pid {}); choose another --name",
                        ::getpid()));
  EXPECT_TRUE(ClaimWorkloadName("other").ok());  // one name's claim holds no other
}

TEST_F(NameClaimTest, ReleaseRemovesTheClaimAndFreesTheName) {
  {
    auto claim = ClaimWorkloadName("web");
    ASSERT_TRUE(claim.ok());
    EXPECT_TRUE(std::filesystem::exists(ClaimFile("web")));
    NameClaim moved = std::move(claim).value();  // the moved-from claim releases nothing
    EXPECT_TRUE(std::filesystem::exists(ClaimFile("web")));
  }
  EXPECT_FALSE(std::filesystem::exists(ClaimFile("web")));
  EXPECT_TRUE(ClaimWorkloadName("web").ok());
}

TEST_F(NameClaimTest, ClaimOfADeadClaimantDoesNotBlock) {
  // A child takes the claim and dies without releasing it: its file stays.
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto claim = ClaimWorkloadName("web");
    if (!claim.ok()) ::_exit(1);
    ::_exit(0);  // no destructor runs: the file stays, the lock goes with the process
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_TRUE(std::filesystem::exists(ClaimFile("web")));
  auto claim = ClaimWorkloadName("web");
  EXPECT_TRUE(claim.ok()) << claim.status().ToString();
}

TEST_F(NameClaimTest, RunningWorkloadHoldsItsName) {
  auto claim = ClaimWorkloadName("web");
  ASSERT_TRUE(claim.ok());
  ASSERT_TRUE(RecordWorkload(Self("web"), std::move(claim).value()).ok());
  EXPECT_FALSE(std::filesystem::exists(ClaimFile("web")));  // the record took its place
  auto again = ClaimWorkloadName("web");
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists);
  EXPECT_EQ(again.status().message(),
            fmt::format("a workload named `web` is already running (pid {}); choose another --name", ::getpid()));
  EXPECT_TRUE(ClaimWorkloadName("web").status().message().find("already running") != std::string::npos)
      << "the refused claim left the name held";
}

TEST_F(NameClaimTest, ExitedWorkloadsNameCanBeClaimed) {
  auto claim = ClaimWorkloadName("web");
  ASSERT_TRUE(claim.ok());
  Workload w = Self("web");
  w.start_time += 1;  // another process than this one: not running
  ASSERT_TRUE(RecordWorkload(w, std::move(claim).value()).ok());
  EXPECT_TRUE(ClaimWorkloadName("web").ok());
}

TEST_F(NameClaimTest, RecordNeedsTheClaimOfItsName) {
  auto claim = ClaimWorkloadName("web");
  ASSERT_TRUE(claim.ok());
  Status st = RecordWorkload(Self("api"), std::move(claim).value());
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_FALSE(FindWorkload("api").ok());
}

TEST_F(NameClaimTest, InvalidNameIsRefused) {
  auto claim = ClaimWorkloadName("../web");
  ASSERT_FALSE(claim.ok());
  EXPECT_EQ(claim.status().code(), Code::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/web.claim"));
}

}  // namespace
}  // namespace gpusnap
