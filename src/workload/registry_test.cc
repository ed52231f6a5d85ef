#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "gpusnap/workload.h"
#include "proc/proc.h"
#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap {
namespace {

class WorkloadRecordTest : public ::testing::Test {
 protected:
  TempDir tmp_{"record-test"};
  void SetUp() override { ::setenv("GPUSNAP_RUN_DIR", tmp_.path().c_str(), 1); }
  void TearDown() override { ::unsetenv("GPUSNAP_RUN_DIR"); }

  // This process as a workload named `name`.
  static Workload Self(const std::string& name) {
    Workload w;
    w.name = name;
    w.pid = ::getpid();
    w.start_time = proc::ReadStat(w.pid)->start_time;
    w.restored_from = "snap-1";
    return w;
  }
  static void Record(const Workload& w) {
    auto claim = ClaimWorkloadName(w.name);
    ASSERT_TRUE(claim.ok()) << claim.status().ToString();
    ASSERT_TRUE(RecordWorkload(w, std::move(claim).value()).ok());
  }
};

TEST_F(WorkloadRecordTest, AStandbyIsRecordedWithItsStoreAndWokenByAnUpdate) {
  Workload w = Self("warm");
  w.standby = true;
  w.store = "/var/lib/gpusnap";
  Record(w);
  auto found = FindWorkload("warm");
  ASSERT_TRUE(found.ok());
  EXPECT_TRUE(found->standby);
  EXPECT_EQ(found->store, "/var/lib/gpusnap");
  EXPECT_STREQ(WorkloadState(*found), "standby");
  w.standby = false;
  w.store.clear();
  ASSERT_TRUE(UpdateWorkload(w).ok());
  found = FindWorkload("warm");
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->standby);
  EXPECT_STREQ(WorkloadState(*found), "running");
  // An update of another tree than the record's is refused.
  Workload other = w;
  other.start_time += 1;
  EXPECT_EQ(UpdateWorkload(other).code(), Code::kFailedPrecondition);
  other.name = "nobody";
  EXPECT_EQ(UpdateWorkload(other).code(), Code::kNotFound);
}

TEST_F(WorkloadRecordTest, ASuspendedWorkloadIsRecordedWithItsStoreAndResumedByAnUpdate) {
  Workload w = Self("llm");
  Record(w);
  w.suspended = true;
  w.store = "/var/lib/gpusnap";
  ASSERT_TRUE(UpdateWorkload(w).ok());
  auto found = FindWorkload("llm");
  ASSERT_TRUE(found.ok());
  EXPECT_TRUE(found->suspended);
  EXPECT_FALSE(found->standby);
  EXPECT_EQ(found->store, "/var/lib/gpusnap");
  EXPECT_STREQ(WorkloadState(*found), "suspended");
  w.suspended = false;
  w.store.clear();
  ASSERT_TRUE(UpdateWorkload(w).ok());
  EXPECT_STREQ(WorkloadState(*FindWorkload("llm")), "running");
  EXPECT_FALSE(FindWorkload("llm")->suspended);
}

TEST_F(WorkloadRecordTest, ARecordOlderThanStandbysReadsAsRunning) {
  ASSERT_TRUE(MakeDirs(tmp_.path() + "/workloads").ok());
  ASSERT_TRUE(WriteFileAtomic(tmp_.path() + "/workloads/old.json",
                              fmt::format(R"({{"name": "old", "pid": {}, "start_time": {}, "reaper_pid": 0,
                                              "cmdline": [], "log": "", "started": "", "restored_from": ""}})",
                                          ::getpid(), proc::ReadStat(::getpid())->start_time))
                  .ok());
  auto found = FindWorkload("old");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_FALSE(found->standby);
  EXPECT_FALSE(found->suspended);
  EXPECT_TRUE(found->store.empty());
  EXPECT_STREQ(WorkloadState(*found), "running");
}

TEST_F(WorkloadRecordTest, AnExitedStandbyIsExited) {
  Workload w = Self("gone");
  w.standby = true;
  w.start_time += 1;  // not this process: not running
  Record(w);
  EXPECT_STREQ(WorkloadState(*FindWorkload("gone")), "exited");
}

TEST_F(WorkloadRecordTest, RemovingARecord) {
  Record(Self("warm"));
  ASSERT_TRUE(RemoveWorkloadRecord("warm").ok());
  EXPECT_EQ(FindWorkload("warm").status().code(), Code::kNotFound);
  EXPECT_TRUE(RemoveWorkloadRecord("warm").ok());  // already gone
  EXPECT_EQ(RemoveWorkloadRecord("../x").code(), Code::kInvalidArgument);
}

TEST_F(WorkloadRecordTest, OneWakeAtATime) {
  {
    auto first = ClaimWake("warm");
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    auto second = ClaimWake("warm");
    ASSERT_FALSE(second.ok());
    EXPECT_EQ(second.status().code(), Code::kAlreadyExists);
    EXPECT_EQ(second.status().message(),
              fmt::format("standby `warm` is already being woken (by gpusnap pid {})", ::getpid()));
    EXPECT_TRUE(ClaimWake("other").ok());
  }
  EXPECT_TRUE(ClaimWake("warm").ok());  // the claim went with its holder
}

TEST_F(WorkloadRecordTest, EndingAWorkloadThatIsNotThere) {
  EXPECT_EQ(EndWorkload("nobody", std::chrono::milliseconds(10)).code(), Code::kNotFound);
  Workload w = Self("gone");
  w.start_time += 1;
  Record(w);
  EXPECT_EQ(EndWorkload("gone", std::chrono::milliseconds(10)).code(), Code::kFailedPrecondition);
  // A record whose reaper is not the root's parent: nothing is signalled.
  Record(Self("here"));
  Status st = EndWorkload("here", std::chrono::milliseconds(10));
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("is not under its recorded reaper"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace gpusnap
