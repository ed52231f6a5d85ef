#include "agent/service/job.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

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

TEST(AgentJob, ATransferReportsItsProgressThenItsAccount) {
  Job j = Running();
  j.kind = "restore";
  j.snapshot = "";
  j.transfer.emplace();
  j.transfer->reference = "127.0.0.1:5000/a/b:v1";
  ApplyTransferProgress(j, "pull: 1 of 3 blobs moved", 1.0, 1000, false);
  ApplyTransferProgress(j, "pull: 2 of 3 blobs moved", 2.0, 500, false);
  EXPECT_EQ(j.transfer->bytes_moved, 1500u);
  EXPECT_EQ(j.transfer->progress, "pull: 2 of 3 blobs moved");
  EXPECT_EQ(j.phase, "");  // no phase of the job has ended yet
  Job cut = Interrupted(j, false, "now");
  EXPECT_NE(cut.error.find("its pull of `127.0.0.1:5000/a/b:v1` had not finished"), std::string::npos) << cut.error;
  TransferResult r;
  r.manifest_digest = "sha256:" + std::string(64, 'c');
  r.blobs = 3;
  r.blobs_moved = 2;
  r.blobs_skipped = 1;
  r.bytes_moved = 1600;
  r.bytes_total = 2000;
  r.seconds = 2.5;
  FinishTransfer(j, r);
  EXPECT_EQ(j.phase, "pull");
  EXPECT_EQ(j.timings_s.at("pull"), 2.5);
  EXPECT_TRUE(j.transfer->done);
  EXPECT_EQ(j.transfer->progress, "");
  auto back = JobFromJson(JobToJson(j));
  ASSERT_TRUE(back.ok()) << back.status().message();
  ASSERT_TRUE(back->transfer.has_value());
  EXPECT_EQ(back->transfer->digest, r.manifest_digest);
  EXPECT_EQ(back->transfer->blobs_moved, 2u);
  EXPECT_EQ(back->transfer->bytes_total, 2000u);
  EXPECT_TRUE(back->transfer->done);
  EXPECT_NE(JobToJson(j).find("\"pull\""), std::string::npos);
}

TEST(AgentJob, APushStepIsAPhaseOfTheCheckpoint) {
  Job j = Running();
  j.transfer.emplace();
  j.transfer->reference = "r.example/x:1";
  ApplyTransferProgress(j, "verify", 0.5, 4096, true);
  EXPECT_EQ(j.timings_s.at("push-verify"), 0.5);
  EXPECT_EQ(j.transfer->bytes_moved, 0u);  // verified, not moved
  Job cut = Interrupted(j, true, "now");
  EXPECT_NE(cut.error.find("but its push to `r.example/x:1` had not finished"), std::string::npos) << cut.error;
  EXPECT_NE(JobToJson(j).find("\"push\""), std::string::npos);
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
  EXPECT_TRUE(back->workloads.empty());
}

TEST(AgentJob, ASwapNamesItsWorkloadsInOrderAndRoundTrips) {
  Job j = Running();
  j.kind = "swap";
  j.workloads = {"llm-a", "llm-b"};
  std::string text = JobToJson(j);
  EXPECT_NE(text.find(R"("workloads": [)"), std::string::npos) << text;
  auto back = JobFromJson(text);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->kind, "swap");
  EXPECT_EQ(back->workloads, (std::vector<std::string>{"llm-a", "llm-b"}));
  EXPECT_EQ(JobFromJson(R"({"id": "job-0123456789abcdef", "kind": "swap", "state": "running", "workloads": [1]})")
                .status()
                .code(),
            Code::kCorruption);
}

TEST(AgentJob, TheCapturePathIsShownAndRoundTrips) {
  Job j = Running();
  j.capture_path = JobCapturePath{"auto", "", ""};
  // While the checkpoint runs: what was asked only.
  auto shown = nlohmann::json::parse(JobToJson(j));
  EXPECT_EQ(shown["capturePath"], nlohmann::json({{"requested", "auto"}}));
  j.capture_path->path = "rootfs";
  j.capture_path->reason = "the tree holds an io_uring instance (pid 12, fd 5)";
  shown = nlohmann::json::parse(JobToJson(j));
  EXPECT_EQ(shown["capturePath"], nlohmann::json({{"path", "rootfs"},
                                                  {"requested", "auto"},
                                                  {"reason", "the tree holds an io_uring instance (pid 12, fd 5)"}}));
  auto back = JobFromJson(JobToJson(j));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_TRUE(back->capture_path.has_value());
  EXPECT_EQ(back->capture_path->requested, "auto");
  EXPECT_EQ(back->capture_path->path, "rootfs");
  EXPECT_EQ(back->capture_path->reason, j.capture_path->reason);
  // Records of agents before it have none.
  EXPECT_FALSE(JobFromJson(R"({"id": "job-0123456789abcdef", "kind": "checkpoint", "state": "running"})")
                   ->capture_path.has_value());
  EXPECT_EQ(JobFromJson(R"({"id": "job-0123456789abcdef", "kind": "checkpoint", "state": "running",
                            "capturePath": "rootfs"})")
                .status()
                .code(),
            Code::kCorruption);
}

TEST(AgentJob, ARestoresPathAndFallbackAreShownAndRoundTrip) {
  Job j = Running();
  j.kind = "restore";
  EXPECT_FALSE(nlohmann::json::parse(JobToJson(j)).contains("restorePath"));
  j.restore_path = "rootfs";
  j.fallback_reason = "process restore refused: the snapshot needs driver 580, this node has 570";
  auto shown = nlohmann::json::parse(JobToJson(j));
  EXPECT_EQ(shown["restorePath"], "rootfs");
  EXPECT_EQ(shown["fallbackReason"], j.fallback_reason);
  EXPECT_FALSE(shown.contains("capturePath"));
  auto back = JobFromJson(JobToJson(j));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->restore_path, "rootfs");
  EXPECT_EQ(back->fallback_reason, j.fallback_reason);
}

TEST(AgentJob, ForeignRecordsAreCorruption) {
  EXPECT_EQ(JobFromJson("{").status().code(), Code::kCorruption);
  EXPECT_EQ(JobFromJson("[]").status().code(), Code::kCorruption);
  EXPECT_EQ(JobFromJson(R"({"id": "job-0123456789abcdef", "kind": "checkpoint", "state": "paused"})").status().code(),
            Code::kCorruption);
  EXPECT_EQ(JobFromJson(R"({"id": "../x", "kind": "checkpoint", "state": "running"})").status().code(),
            Code::kCorruption);
  EXPECT_TRUE(JobFromJson(R"({"id": "job-0123456789abcdef", "kind": "wake", "state": "running"})").ok());
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

Job Finished(const std::string& id, const std::string& created, const std::string& finished) {
  Job j = Running();
  j.id = id;
  j.created = created;
  Succeed(j, finished);
  return j;
}

TEST(AgentJob, TheRecordsBeyondTheNewestFinishedOnesGoOldestFirstRunningOnesStay) {
  std::map<std::string, Job> jobs;
  // Started first, finished last: a long job that ended after shorter ones.
  jobs["job-a"] = Finished("job-a", "2026-12-01T00:00:00.000Z", "2026-12-01T00:00:09.000Z");
  jobs["job-b"] = Finished("job-b", "2026-12-01T00:00:01.000Z", "2026-12-01T00:00:02.000Z");
  jobs["job-c"] = Finished("job-c", "2026-12-01T00:00:02.000Z", "2026-12-01T00:00:03.000Z");
  jobs["job-d"] = Running();
  jobs["job-d"].id = "job-d";
  jobs["job-d"].created = "2026-11-01T00:00:00.000Z";  // the oldest of all, and running
  EXPECT_EQ(FinishedJobsBeyond(jobs, 3), std::vector<std::string>{});
  EXPECT_EQ(FinishedJobsBeyond(jobs, 2), std::vector<std::string>{"job-b"});
  EXPECT_EQ(FinishedJobsBeyond(jobs, 1), (std::vector<std::string>{"job-c", "job-b"}));
  EXPECT_EQ(FinishedJobsBeyond(jobs, 0), (std::vector<std::string>{"job-a", "job-c", "job-b"}));
  // Finished in the same millisecond: the one created later is the newer.
  jobs["job-e"] = Finished("job-e", "2026-12-01T00:00:05.000Z", "2026-12-01T00:00:09.000Z");
  EXPECT_EQ(FinishedJobsBeyond(jobs, 1).front(), "job-a");
}

}  // namespace
}  // namespace gpusnap::agent
