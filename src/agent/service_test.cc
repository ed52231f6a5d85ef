// The agent's recovery with real processes and a real state directory: what
// a restarted agent does with the journal a killed one left.
#include "agent/service.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "proc/proc.h"
#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::agent {
namespace {

class AgentServiceTest : public ::testing::Test {
 protected:
  TempDir tmp_{"agent-test"};
  void SetUp() override {
    root_ = tmp_.path();
    options_.store = root_ + "/store";
    options_.state_dir = root_ + "/state";
    options_.log = [this](const std::string& line) { log_ += line + "\n"; };
    ASSERT_TRUE(MakeDirs(options_.state_dir + "/jobs").ok());
  }
  void TearDown() override {
    for (pid_t p : children_) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
  }

  // A child that waits, stopped the way a dead agent's operation may leave it.
  pid_t StoppedChild() {
    pid_t p = ::fork();
    if (p == 0) {
      for (;;) ::pause();
    }
    children_.push_back(p);
    ::kill(p, SIGSTOP);
    for (int i = 0; i < 200 && State(p) != 'T'; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_EQ(State(p), 'T');
    return p;
  }
  static char State(pid_t p) {
    auto st = proc::ReadStat(p);
    return st.ok() ? st->state : '?';
  }

  Job Record(const std::string& id, JobState state, const std::string& created) {
    Job j;
    j.id = id;
    j.kind = "checkpoint";
    j.state = state;
    j.phase = "dump";
    j.target = "pid 1234";
    j.lock_key = "pid:1234";
    j.created = created;
    j.snapshot = "never-published";
    return j;
  }
  void Write(const Job& j) {
    ASSERT_TRUE(WriteFileAtomic(options_.state_dir + "/jobs/" + j.id + ".json", JobToJson(j)).ok());
  }

  std::string root_;
  std::string log_;
  ServiceOptions options_;
  std::vector<pid_t> children_;
};

TEST_F(AgentServiceTest, RunningJobBecomesFailedAndItsStoppedSourceResumes) {
  pid_t child = StoppedChild();
  Job j = Record("job-00000000000000a1", JobState::kRunning, "2026-11-30T00:00:00Z");
  j.source.push_back({child, proc::ReadStat(child)->start_time});
  Write(j);
  // A temporary of a journal write the dead agent did not finish.
  ASSERT_TRUE(WriteFileSynced(options_.state_dir + "/jobs/" + j.id + ".json.tmp.999", "{").ok());

  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  auto job = (*service)->GetJob(j.id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state, JobState::kFailed);
  EXPECT_NE(job->error.find("after phase `dump`"), std::string::npos) << job->error;
  EXPECT_NE(job->error.find("no snapshot was published"), std::string::npos) << job->error;
  for (int i = 0; i < 200 && State(child) == 'T'; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(State(child), 'T');
  // The journal says so too, and the stray temporary is gone.
  auto text = ReadFile(options_.state_dir + "/jobs/" + j.id + ".json");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(JobFromJson(*text)->state, JobState::kFailed);
  EXPECT_FALSE(std::filesystem::exists(options_.state_dir + "/jobs/" + j.id + ".json.tmp.999"));
  auto notes = (*service)->recovery_notes();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("resumed 1 stopped processes"), std::string::npos) << notes[0];
}

TEST_F(AgentServiceTest, AProcessThatReusedThePidIsLeftAlone) {
  pid_t child = StoppedChild();
  Job j = Record("job-00000000000000a2", JobState::kRunning, "2026-11-30T00:00:00Z");
  j.source.push_back({child, proc::ReadStat(child)->start_time + 1});
  Write(j);
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  EXPECT_EQ((*service)->GetJob(j.id)->state, JobState::kFailed);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(State(child), 'T');
}

TEST_F(AgentServiceTest, OneAgentPerStateDirectory) {
  auto first = Service::Open(options_);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = Service::Open(options_);
  EXPECT_EQ(second.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("another agent holds"), std::string::npos);
}

TEST_F(AgentServiceTest, OldestFinishedRecordsArePruned) {
  options_.max_job_records = 2;
  Write(Record("job-00000000000000b1", JobState::kSucceeded, "2026-11-30T00:00:01Z"));
  Write(Record("job-00000000000000b2", JobState::kFailed, "2026-11-30T00:00:02Z"));
  Write(Record("job-00000000000000b3", JobState::kSucceeded, "2026-11-30T00:00:03Z"));
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  auto jobs = (*service)->ListJobs();
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0].id, "job-00000000000000b3");
  EXPECT_EQ(jobs[1].id, "job-00000000000000b2");
  EXPECT_FALSE(std::filesystem::exists(options_.state_dir + "/jobs/job-00000000000000b1.json"));
}

TEST_F(AgentServiceTest, ForeignRecordsAreReportedAndIgnored) {
  ASSERT_TRUE(WriteFileSynced(options_.state_dir + "/jobs/job-00000000000000c1.json", "not json").ok());
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  EXPECT_TRUE((*service)->ListJobs().empty());
  auto notes = (*service)->recovery_notes();
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("ignoring job record"), std::string::npos);
}

TEST_F(AgentServiceTest, RefusalsChangeNothing) {
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  CheckpointRequest pid1;
  pid1.pid = 1;
  auto r = (*service)->StartCheckpoint(pid1);
  ASSERT_TRUE(std::holds_alternative<Refused>(r));
  EXPECT_EQ(std::get<Refused>(r).error.http_status, 403);
  RestoreRequest into_container;
  into_container.snapshot = "s";
  into_container.target_container = std::string(64, 'a');
  r = (*service)->StartRestore(into_container);
  ASSERT_TRUE(std::holds_alternative<Refused>(r));
  EXPECT_EQ(std::get<Refused>(r).error.http_status, 404);
  EXPECT_NE(std::get<Refused>(r).error.message.find("no running process is in container"), std::string::npos);
  RestoreRequest missing;
  missing.snapshot = "no-such-snapshot";
  r = (*service)->StartRestore(missing);
  ASSERT_TRUE(std::holds_alternative<Refused>(r));
  EXPECT_EQ(std::get<Refused>(r).error.http_status, 404);
  EXPECT_EQ((*service)->DeleteSnapshot("no-such-snapshot").code(), Code::kNotFound);
  EXPECT_TRUE((*service)->ListJobs().empty());
  EXPECT_EQ((*service)->RunningJobs(), 0u);
}

TEST_F(AgentServiceTest, ANewStateDirectoryAndItsJournalAreForRootOnly) {
  options_.state_dir = root_ + "/fresh-state";
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  for (const std::string& dir : {options_.state_dir, options_.state_dir + "/jobs"}) {
    struct stat st{};
    ASSERT_EQ(::stat(dir.c_str(), &st), 0) << dir;
    EXPECT_EQ(st.st_mode & 07777, 0700u) << dir;
  }
}

}  // namespace
}  // namespace gpusnap::agent
