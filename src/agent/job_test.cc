#include "agent/job.h"

#include <gtest/gtest.h>

namespace gpusnap::agent {
namespace {

Job Running() {
  Job j;
  j.id = "job-0123456789abcdef";
  j.kind = "checkpoint";
  j.target = "pid 42";
  j.lock_key = "pid:42";
  j.created = "2026-11-30T00:00:00Z";
  j.snapshot = "s1";
  j.source = {{42, 1000}, {43, 1001}};
  return j;
}

TEST(AgentJob, ProgressRecordsPhasesAndBytes) {
  Job j = Running();
  ApplyProgress(j, "dump", 0, 0, false);
  EXPECT_EQ(j.phase, "dump");
  EXPECT_TRUE(j.timings_s.empty());
  ApplyProgress(j, "dump", 1.5, 0, true);
  ApplyProgress(j, "publish", 0.25, 4096, true);
  EXPECT_EQ(j.timings_s.at("dump"), 1.5);
  EXPECT_EQ(j.bytes_done, 4096u);
  Succeed(j, "later");
  EXPECT_EQ(j.state, JobState::kSucceeded);
  EXPECT_EQ(j.bytes_total, 4096u);
  EXPECT_EQ(j.finished, "later");
}

TEST(AgentJob, InterruptedNamesThePhaseAndTheOutcome) {
  Job j = Running();
  ApplyProgress(j, "dump", 0, 0, false);
  Job after = Interrupted(j, false, "now");
  EXPECT_EQ(after.state, JobState::kFailed);
  EXPECT_NE(after.error.find("after phase `dump`"), std::string::npos) << after.error;
  EXPECT_NE(after.error.find("no snapshot was published"), std::string::npos) << after.error;
  Job published = Interrupted(j, true, "now");
  EXPECT_NE(published.error.find("`s1` had been published"), std::string::npos) << published.error;
}

TEST(AgentJob, InterruptedLeavesFinishedJobsAlone) {
  Job j = Running();
  Fail(j, "CRIU said no", "t");
  EXPECT_EQ(Interrupted(j, false, "now").error, "CRIU said no");
}

TEST(AgentJob, RecordRoundTrips) {
  Job j = Running();
  ApplyProgress(j, "dump", 2.0, 100, true);
  j.restored_pid = 77;
  j.restored_name = "w";
  auto back = JobFromJson(JobToJson(j));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->id, j.id);
  EXPECT_EQ(back->state, JobState::kRunning);
  EXPECT_EQ(back->phase, "dump");
  EXPECT_EQ(back->timings_s, j.timings_s);
  EXPECT_EQ(back->bytes_done, 100u);
  EXPECT_EQ(back->source.size(), 2u);
  EXPECT_EQ(back->source[1].start_time, 1001u);
  EXPECT_EQ(back->restored_pid, 77);
  EXPECT_EQ(back->lock_key, "pid:42");
}

TEST(AgentJob, ForeignRecordsAreCorruption) {
  EXPECT_EQ(JobFromJson("{").status().code(), Code::kCorruption);
  EXPECT_EQ(JobFromJson("[]").status().code(), Code::kCorruption);
  EXPECT_EQ(JobFromJson(R"({"id": "job-0123456789abcdef", "kind": "checkpoint", "state": "paused"})").status().code(),
            Code::kCorruption);
  EXPECT_EQ(JobFromJson(R"({"id": "../x", "kind": "checkpoint", "state": "running"})").status().code(),
            Code::kCorruption);
  EXPECT_EQ(JobFromJson(R"({"id": "job-0123456789abcdef", "kind": "dance", "state": "running"})").status().code(),
            Code::kCorruption);
  EXPECT_EQ(JobFromJson(R"({"id": "job-0123456789abcdef", "kind": "restore", "state": 3})").status().code(),
            Code::kCorruption);
}

TEST(AgentJob, NumbersOutOfTheirRangeAreCorruptionNotConversions) {
  // Found by the fuzzer: a float far beyond uint64 converted to an integer.
  const std::string head = R"({"id": "job-0123456789abcdef", "kind": "checkpoint", "state": "running", )";
  for (const char* tail : {R"("source": [{"pid": 0, "startTime": 1111111111111111111111111111111119}]})",
                           R"("source": [{"pid": 4294967296, "startTime": 1}]})", R"("source": [{"pid": 1}]})",
                           R"("source": [7]})", R"("bytesDone": -1})", R"("bytesTotal": 1.5})",
                           R"("restoredPid": 99999999999})"}) {
    auto job = JobFromJson(head + tail);
    ASSERT_FALSE(job.ok()) << tail;
    EXPECT_EQ(job.status().code(), Code::kCorruption) << tail;
  }
  auto fine = JobFromJson(head + R"("source": [{"pid": 7, "startTime": 18446744073709551615}], "bytesDone": 3})");
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_EQ(fine->source.front().start_time, 18446744073709551615ull);
}

}  // namespace
}  // namespace gpusnap::agent
