// The agent's recovery with real processes and a real state directory: what
// a restarted agent does with the journal a killed one left.
#include "agent/service/service.h"

#include <gtest/gtest.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <signal.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <future>
#include <filesystem>
#include <set>
#include <thread>
#include <variant>

#include "gpusnap/snapshot.h"
#include "proc/proc.h"
#include "store/meta_testing.h"
#include "util/files.h"
#include "tenancy/tenancy.h"
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

  // A child that waits, running.
  pid_t RunningChild() {
    pid_t p = ::fork();
    if (p == 0) {
      for (;;) ::pause();
    }
    children_.push_back(p);
    return p;
  }

  // The job once it has ended (or as it is after 10 s).
  static Job Finished(Service& service, const std::variant<Accepted, Refused>& started) {
    if (auto* refused = std::get_if<Refused>(&started)) {
      ADD_FAILURE() << "refused: " << refused->error.message;
      return Job{};
    }
    std::string id = std::get<Accepted>(started).job_id;
    for (int i = 0; i < 1000; ++i) {
      auto job = service.GetJob(id);
      if (job.ok() && job->state != JobState::kRunning) return *job;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "job " << id << " is still running";
    return *service.GetJob(id);
  }

  // Restores that succeed at once, each one's options kept in `seen` (under `mu`).
  void RecordRestores(std::vector<RestoreOptions>& seen, std::mutex& mu) {
    options_.restore = [&seen, &mu](const RestoreOptions& o) -> Result<RestoreResult> {
      std::lock_guard<std::mutex> lock(mu);
      seen.push_back(o);
      return RestoreResult{};
    };
  }

  Job Journaled(const std::string& id) {
    auto text = ReadFile(options_.state_dir + "/jobs/" + id + ".json");
    EXPECT_TRUE(text.ok()) << text.status().ToString();
    auto job = text.ok() ? JobFromJson(*text) : Result<Job>(text.status());
    EXPECT_TRUE(job.ok()) << job.status().ToString();
    return job.ok() ? *job : Job{};
  }

  void Publish(const std::string& id, std::optional<SnapshotOwner> owner = std::nullopt) {
    std::string dir = options_.store + "/snapshots/" + id;
    ASSERT_TRUE(MakeDirs(dir).ok());
    SnapshotMeta meta = BarePidMeta(id);
    meta.owner = std::move(owner);
    ASSERT_TRUE(WriteFileAtomic(dir + "/gpusnap.json", SnapshotMetaToJson(meta)).ok());
  }

  // Tenancy as --kube gives it: `config` the administrator's file, and the
  // namespaces that have opted in with their Secrets' docker configs.
  // `keys`: what their Secrets hold of keys.
  void Tenancy(const std::string& config, std::map<std::string, std::string> opted_in,
               std::map<std::string, KeyMaterial> keys = {}) {
    options_.tenancy = [config] { return tenancy::ParseTenancyConfig(config, "tenancy.json"); };
    options_.namespace_credentials = [this, opted_in, keys](const std::string& ns) -> Result<NamespaceCredentials> {
      auto it = opted_in.find(ns);
      if (it == opted_in.end())
        return Status::Error(Code::kPermissionDenied, "namespace `{}` has not opted in to gpusnap", ns);
      return NamespaceCredentials{it->second, root_ + "/ns-" + ns + ".json",
                                  keys.count(ns) ? keys.at(ns) : KeyMaterial{}};
    };
  }

  static const ApiError& RefusalOf(const std::variant<Accepted, Refused>& started) {
    static const ApiError kNone{0, "accepted"};
    auto* refused = std::get_if<Refused>(&started);
    return refused ? refused->error : kNone;
  }
  // `started` was refused by a rule (403), saying exactly `message`.
  static void ExpectForbidden(const std::variant<Accepted, Refused>& started, const std::string& message) {
    EXPECT_EQ(RefusalOf(started).http_status, 403) << RefusalOf(started).message;
    EXPECT_EQ(RefusalOf(started).message, message);
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
  into_container.source.id = "s";
  into_container.target_container = std::string(64, 'a');
  r = (*service)->StartRestore(into_container);
  ASSERT_TRUE(std::holds_alternative<Refused>(r));
  EXPECT_EQ(std::get<Refused>(r).error.http_status, 404);
  EXPECT_NE(std::get<Refused>(r).error.message.find("no running process is in container"), std::string::npos);
  RestoreRequest missing;
  missing.source.id = "no-such-snapshot";
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

TEST_F(AgentServiceTest, ACheckpointTakesItsSettingsAndRecordsTheChosenPath) {
  pid_t child = RunningChild();
  CheckpointOptions seen;
  options_.checkpoint = [&seen](const CheckpointOptions& o) -> Result<SnapshotMeta> {
    seen = o;
    SnapshotMeta meta = BarePidMeta(o.id);
    meta.capture_path = {CapturePath::kRootfs, o.capture_path.value_or(CapturePath::kProcess), "the tree holds an io_uring instance (pid 12, fd 5)"};
    meta.total_bytes = 4096;
    return meta;
  };
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  CheckpointRequest request;
  request.pid = child;
  request.leave_running = true;
  request.caches = std::vector<std::string>{"/root/.cache/huggingface"};
  request.exclude = std::vector<std::string>{"/tmp"};
  request.image = "vllm:0.6.3";
  Job job = Finished(**service, (*service)->StartCheckpoint(request));
  EXPECT_EQ(job.state, JobState::kSucceeded) << job.error;
  // Neither the request nor a pod names a path: the agent's default.
  EXPECT_EQ(seen.capture_path, CapturePath::kAuto);
  EXPECT_EQ(seen.caches, std::vector<std::string>{"/root/.cache/huggingface"});
  EXPECT_EQ(seen.exclude, std::vector<std::string>{"/tmp"});
  EXPECT_EQ(seen.image, "vllm:0.6.3");
  EXPECT_EQ(seen.target.kind, TargetSpec::Kind::kPid);
  EXPECT_EQ(seen.target.pid, child);
  ASSERT_TRUE(job.capture_path.has_value());
  EXPECT_EQ(job.capture_path->requested, "auto");
  EXPECT_EQ(job.capture_path->path, "rootfs");
  EXPECT_EQ(job.capture_path->reason, "the tree holds an io_uring instance (pid 12, fd 5)");
  EXPECT_EQ(job.bytes_total, 4096u);
  Job journaled = Journaled(job.id);
  ASSERT_TRUE(journaled.capture_path.has_value());
  EXPECT_EQ(journaled.capture_path->path, "rootfs");
  EXPECT_NE(log_.find(fmt::format("job {}: captured `{}` by the rootfs path (asked: auto, by the agent's default): the "
                                  "tree holds an io_uring instance (pid 12, fd 5)",
                                  job.id, job.snapshot)),
            std::string::npos)
      << log_;
}

TEST_F(AgentServiceTest, TheRequestsCapturePathIsTheOneAsked) {
  pid_t child = RunningChild();
  std::optional<CapturePath> asked;
  options_.checkpoint = [&asked](const CheckpointOptions& o) -> Result<SnapshotMeta> {
    asked = o.capture_path;
    return Status::Error(Code::kFailedPrecondition, "the tree holds an io_uring instance (pid 12, fd 5)");
  };
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  CheckpointRequest request;
  request.pid = child;
  request.leave_running = true;
  request.capture_path = CapturePath::kProcess;
  Job job = Finished(**service, (*service)->StartCheckpoint(request));
  EXPECT_EQ(asked, CapturePath::kProcess);
  // Refused by the checkpoint: the job says why, and names no path taken.
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_NE(job.error.find("io_uring"), std::string::npos) << job.error;
  ASSERT_TRUE(job.capture_path.has_value());
  EXPECT_EQ(job.capture_path->requested, "process");
  EXPECT_EQ(job.capture_path->path, "");
}

TEST_F(AgentServiceTest, ARestoreRecordsItsPathAndWhyItFellBack) {
  RestoreOptions seen;
  options_.restore = [&seen](const RestoreOptions& o) -> Result<RestoreResult> {
    seen = o;
    RestoreResult r;
    r.workload.name = o.name;
    r.workload.pid = 4242;
    r.restore_path = CapturePath::kRootfs;
    r.fallback_reason = "process restore refused: the snapshot needs driver 580, this node has 570";
    return r;
  };
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  Publish("snap-both");
  RestoreRequest request;
  request.source.id = "snap-both";
  request.name = "w";
  Job job = Finished(**service, (*service)->StartRestore(request));
  EXPECT_EQ(job.state, JobState::kSucceeded) << job.error;
  EXPECT_EQ(seen.source.id, "snap-both");
  EXPECT_EQ(job.restored_pid, 4242);
  EXPECT_EQ(job.restore_path, "rootfs");
  EXPECT_EQ(job.fallback_reason, "process restore refused: the snapshot needs driver 580, this node has 570");
  Job journaled = Journaled(job.id);
  EXPECT_EQ(journaled.restore_path, "rootfs");
  EXPECT_EQ(journaled.fallback_reason, job.fallback_reason);
  EXPECT_NE(log_.find(fmt::format("job {}: restored `snap-both` by the rootfs path, not as a process: process restore "
                                  "refused: the snapshot needs driver 580, this node has 570",
                                  job.id)),
            std::string::npos)
      << log_;
}

TEST_F(AgentServiceTest, EveryRestoreGetsTheAgentsHugePagesSetting) {
  std::vector<bool> seen;
  options_.restore = [&seen](const RestoreOptions& o) -> Result<RestoreResult> {
    seen.push_back(o.huge_pages);
    return RestoreResult{};
  };
  Publish("snap-hp");
  RestoreRequest request;
  request.source.id = "snap-hp";
  for (bool huge_pages : {true, false}) {
    options_.huge_pages = huge_pages;
    options_.state_dir = fmt::format("{}/agent-{}", options_.store, huge_pages);
    auto service = Service::Open(options_);
    ASSERT_TRUE(service.ok()) << service.status().ToString();
    for (bool standby : {false, true}) {
      request.standby = standby;
      request.name = fmt::format("w-{}-{}", huge_pages, standby);
      EXPECT_EQ(Finished(**service, (*service)->StartRestore(request)).state, JobState::kSucceeded);
    }
  }
  EXPECT_EQ(seen, (std::vector<bool>{true, true, false, false}));
}

TEST_F(AgentServiceTest, AProcessRestoreSaysSoQuietly) {
  options_.restore = [](const RestoreOptions&) -> Result<RestoreResult> {
    RestoreResult r;
    r.workload.pid = 4243;
    return r;
  };
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  Publish("snap-process");
  RestoreRequest request;
  request.source.id = "snap-process";
  Job job = Finished(**service, (*service)->StartRestore(request));
  EXPECT_EQ(job.state, JobState::kSucceeded) << job.error;
  EXPECT_EQ(job.restore_path, "process");
  EXPECT_EQ(job.fallback_reason, "");
  EXPECT_EQ(log_.find("by the process path"), std::string::npos) << log_;
}

// A restore that waits, as many at once as are started, until released.
struct HeldRestores {
  std::atomic<int> inside{0};
  std::atomic<bool> release{false};
  std::function<Result<RestoreResult>(const RestoreOptions&)> Fn() {
    return [this](const RestoreOptions& o) -> Result<RestoreResult> {
      ++inside;
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      RestoreResult r;
      r.workload.name = o.name;
      r.workload.pid = 5000 + static_cast<int>(o.name.back());
      return r;
    };
  }
  // Declared after the service: lets every restore go before the service waits for its jobs.
  struct ReleaseOnExit {
    HeldRestores& held;
    ~ReleaseOnExit() { held.release = true; }
  };
  bool WaitInside(int n) const {
    for (int i = 0; i < 1000 && inside < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return inside == n;
  }
};

TEST_F(AgentServiceTest, JobRecordsStayBoundedWhileTheAgentRunsAndARunningJobStays) {
  options_.max_job_records = 3;
  // The restore named "long" waits until let go; the others end at once.
  std::atomic<bool> long_inside{false}, long_may_end{false};
  options_.restore = [&](const RestoreOptions& o) -> Result<RestoreResult> {
    if (o.name == "long") {
      long_inside = true;
      while (!long_may_end) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    RestoreResult r;
    r.workload.name = o.name;
    r.workload.pid = 4244;
    return r;
  };
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  struct LetGoOnExit {  // after the service: its destructor waits for the long job
    std::atomic<bool>& flag;
    ~LetGoOnExit() { flag = true; }
  } let_go{long_may_end};
  Publish("snap");
  RestoreRequest request;
  request.source.id = "snap";
  request.name = "long";
  auto long_job = (*service)->StartRestore(request);
  ASSERT_TRUE(std::holds_alternative<Accepted>(long_job));
  for (int i = 0; i < 1000 && !long_inside; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::vector<std::string> finished;
  for (int i = 0; i < 8; ++i) {
    request.name = fmt::format("w{}", i);
    Job job = Finished(**service, (*service)->StartRestore(request));
    ASSERT_EQ(job.state, JobState::kSucceeded) << job.error;
    finished.push_back(job.id);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // each finishes in a millisecond of its own
  }
  // The three that finished last, and the running one, in memory and in the journal alike.
  std::set<std::string> expected(finished.end() - 3, finished.end());
  expected.insert(std::get<Accepted>(long_job).job_id);
  auto listed = [&] {
    std::set<std::string> ids;
    for (const Job& j : (*service)->ListJobs()) ids.insert(j.id);
    return ids;
  };
  auto journaled = [&] {
    std::set<std::string> ids;
    for (const auto& e : std::filesystem::directory_iterator(options_.state_dir + "/jobs"))
      ids.insert(e.path().stem().string());
    return ids;
  };
  EXPECT_EQ(listed(), expected);
  EXPECT_EQ(journaled(), expected);
  // The long job ends last: it is kept, and the first of the three goes.
  long_may_end = true;
  Job long_done = Finished(**service, long_job);
  EXPECT_EQ(long_done.state, JobState::kSucceeded) << long_done.error;
  expected.erase(finished[5]);
  EXPECT_EQ(listed(), expected);
  EXPECT_EQ(journaled(), expected);
}

TEST_F(AgentServiceTest, RestoresOfOneSnapshotRunAtOnceAndItIsNotDeletedUnderThem) {
  HeldRestores held;
  options_.restore = held.Fn();
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  HeldRestores::ReleaseOnExit release_on_exit{held};
  Publish("snap-shared");
  std::vector<std::string> ids;
  for (const char* name : {"w1", "w2", "w3"}) {
    RestoreRequest request;
    request.source.id = "snap-shared";
    request.name = name;
    auto started = (*service)->StartRestore(request);
    ASSERT_TRUE(std::holds_alternative<Accepted>(started)) << std::get<Refused>(started).error.message;
    ids.push_back(std::get<Accepted>(started).job_id);
  }
  ASSERT_TRUE(held.WaitInside(3)) << held.inside << " of 3 restores running at once";
  Status refused = (*service)->DeleteSnapshot("snap-shared");
  EXPECT_EQ(refused.code(), Code::kFailedPrecondition);
  for (const auto& id : ids) EXPECT_NE(refused.message().find(id), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("are using snapshot `snap-shared`"), std::string::npos) << refused.message();
  held.release = true;
  for (const auto& id : ids) {
    Job job = Finished(**service, Accepted{id});
    EXPECT_EQ(job.state, JobState::kSucceeded) << job.error;
    EXPECT_EQ(job.snapshot, "snap-shared");
  }
  EXPECT_TRUE((*service)->DeleteSnapshot("snap-shared").ok());
}

TEST_F(AgentServiceTest, ASnapshotIsRestoredOnlyOnceItsCheckpointIsDone) {
  std::atomic<bool> published{false}, release{false};
  options_.checkpoint = [&](const CheckpointOptions& o) -> Result<SnapshotMeta> {
    Publish(o.id);  // published, and then pushed, say
    published = true;
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return BarePidMeta(o.id);
  };
  options_.restore = [](const RestoreOptions&) -> Result<RestoreResult> { return RestoreResult{}; };
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  struct ReleaseOnExit {
    std::atomic<bool>& release;
    ~ReleaseOnExit() { release = true; }
  } release_on_exit{release};
  CheckpointRequest checkpoint;
  checkpoint.pid = RunningChild();
  checkpoint.leave_running = true;
  checkpoint.snapshot_id = "snap-written";
  auto writing = (*service)->StartCheckpoint(checkpoint);
  ASSERT_TRUE(std::holds_alternative<Accepted>(writing)) << std::get<Refused>(writing).error.message;
  for (int i = 0; i < 1000 && !published; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  RestoreRequest request;
  request.source.id = "snap-written";
  auto refused = (*service)->StartRestore(request);
  ASSERT_TRUE(std::holds_alternative<Refused>(refused));
  EXPECT_EQ(std::get<Refused>(refused).error.http_status, 409);
  EXPECT_EQ(std::get<Refused>(refused).job_id, std::get<Accepted>(writing).job_id);
  EXPECT_NE(std::get<Refused>(refused).error.message.find("is using snapshot `snap-written`"), std::string::npos);
  release = true;
  EXPECT_EQ(Finished(**service, writing).state, JobState::kSucceeded);
  EXPECT_EQ(Finished(**service, (*service)->StartRestore(request)).state, JobState::kSucceeded);
}

TEST_F(AgentServiceTest, NoJobStartsOnASnapshotBeingDeleted) {
  HeldRestores held;
  held.release = true;
  options_.restore = held.Fn();
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  Publish("snap-going");
  // Its directory locked as its writer locks it: a delete marks it, then waits for the lock.
  UniqueFd dir(::open((options_.store + "/snapshots/snap-going").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(dir.valid());
  ASSERT_EQ(::flock(dir.get(), LOCK_EX), 0);
  // Two deletes: one marks it and waits; the other is refused, and then the mark is known to be there.
  auto remove = [&] { return (*service)->DeleteSnapshot("snap-going"); };
  std::future<Status> deletes[] = {std::async(std::launch::async, remove), std::async(std::launch::async, remove)};
  int refused = -1;
  for (int i = 0; i < 1000 && refused < 0; ++i) {
    for (int d : {0, 1})
      if (deletes[d].wait_for(std::chrono::milliseconds(5)) == std::future_status::ready) refused = d;
  }
  ASSERT_GE(refused, 0) << "neither delete returned";
  Status second = deletes[refused].get();
  EXPECT_EQ(second.code(), Code::kFailedPrecondition);
  EXPECT_NE(second.message().find("another delete is using snapshot `snap-going`"), std::string::npos)
      << second.message();
  RestoreRequest request;
  request.source.id = "snap-going";
  auto started = (*service)->StartRestore(request);
  ASSERT_EQ(::flock(dir.get(), LOCK_UN), 0);
  Status deleted = deletes[1 - refused].get();
  ASSERT_TRUE(std::holds_alternative<Refused>(started));
  EXPECT_EQ(std::get<Refused>(started).error.http_status, 409);
  EXPECT_NE(std::get<Refused>(started).error.message.find("snapshot `snap-going` is being deleted"), std::string::npos)
      << std::get<Refused>(started).error.message;
  EXPECT_TRUE(deleted.ok()) << deleted.ToString();
  EXPECT_EQ(held.inside, 0);
}

// ------------------------------------------------------------------ tenancy

RestoreRequest RestoreOf(const std::string& snapshot) {
  RestoreRequest request;
  request.source = *ParseSnapshotRef(snapshot);
  request.name = "w";
  return request;
}

const container::PodRef kPodOfB{"team-b", "vllm-restored", "vllm"};

TEST_F(AgentServiceTest, APodRestoresItsOwnNamespacesSnapshotsAndOthersOnlyAsAllowed) {
  std::atomic<int> restores{0};
  options_.restore = [&restores](const RestoreOptions&) -> Result<RestoreResult> {
    ++restores;
    return RestoreResult{};
  };
  Tenancy(R"({"namespaces": {"team-b": {"restoreFrom": ["shared"]}}})", {{"team-b", "{}"}});
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  Publish("of-a", SnapshotOwner{"team-a", "vllm-0"});
  Publish("of-b", SnapshotOwner{"team-b", "vllm-0"});
  Publish("of-shared", SnapshotOwner{"shared", "llama-0"});
  Publish("of-nobody");

  ExpectForbidden((*service)->StartRestore(RestoreOf("of-a"), kPodOfB),
                  "pod team-b/vllm-restored may not restore snapshot `of-a`: the snapshot belongs to namespace "
                  "`team-a`, and the administrator's tenancy configuration does not let namespace `team-b` restore "
                  "its snapshots (restoreFrom)");
  auto unowned = (*service)->StartRestore(RestoreOf("of-nobody"), kPodOfB);
  EXPECT_EQ(RefusalOf(unowned).http_status, 403);
  EXPECT_NE(RefusalOf(unowned).message.find("belongs to no namespace"), std::string::npos) << RefusalOf(unowned).message;
  EXPECT_EQ(restores, 0);
  EXPECT_TRUE((*service)->ListJobs().empty());

  EXPECT_EQ(Finished(**service, (*service)->StartRestore(RestoreOf("of-b"), kPodOfB)).state, JobState::kSucceeded);
  EXPECT_EQ(Finished(**service, (*service)->StartRestore(RestoreOf("of-shared"), kPodOfB)).state,
            JobState::kSucceeded);
  // The API's callers are the administrators: no namespace's rules apply.
  EXPECT_EQ(Finished(**service, (*service)->StartRestore(RestoreOf("of-a"))).state, JobState::kSucceeded);
  EXPECT_EQ(restores, 3);
}

TEST_F(AgentServiceTest, TheOwnerIsCheckedAgainOnTheMetadataTheRestoreReads) {
  // The snapshot the job started with was team-b's; the one the restore
  // opens (a reference's, or one replaced meanwhile) is team-a's.
  options_.restore = [](const RestoreOptions& o) -> Result<RestoreResult> {
    SnapshotMeta opened = BarePidMeta("of-b");
    opened.owner = SnapshotOwner{"team-a", "vllm-0"};
    if (!o.on_source_opened) return Status::Error(Code::kInternal, "no check on the metadata opened");
    GPUSNAP_RETURN_IF_ERROR(o.on_source_opened(opened));
    return RestoreResult{};
  };
  Tenancy("{}", {{"team-b", "{}"}});
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  Publish("of-b", SnapshotOwner{"team-b", "vllm-0"});
  Job job = Finished(**service, (*service)->StartRestore(RestoreOf("of-b"), kPodOfB));
  EXPECT_EQ(job.state, JobState::kFailed);
  EXPECT_NE(job.error.find("pod team-b/vllm-restored may not restore snapshot `of-b`: the snapshot belongs to "
                           "namespace `team-a`"),
            std::string::npos)
      << job.error;
}

TEST_F(AgentServiceTest, ANamespaceThatHasNotOptedInIsRefusedBeforeAnything) {
  std::atomic<int> restores{0};
  options_.restore = [&restores](const RestoreOptions&) -> Result<RestoreResult> {
    ++restores;
    return RestoreResult{};
  };
  Tenancy(R"({"namespaces": {"team-b": {"repositories": ["127.0.0.1:5000/team-b"]}}})", {});
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();
  Publish("of-b", SnapshotOwner{"team-b", "vllm-0"});
  for (const char* from : {"of-b", "127.0.0.1:5000/team-b/vllm:warm"})
    ExpectForbidden((*service)->StartRestore(RestoreOf(from), kPodOfB),
                    "pod team-b/vllm-restored: namespace `team-b` has not opted in to gpusnap");
  EXPECT_EQ(restores, 0);
}

TEST_F(AgentServiceTest, APodPullsOnlyFromItsRepositoriesWithItsOwnCredentials) {
  std::vector<RestoreOptions> seen;
  std::mutex mu;
  RecordRestores(seen, mu);
  const std::string agents = root_ + "/agent-auth.json";
  options_.registry = [agents]() -> Result<RegistryAccess> {
    RegistryAccess a;
    a.credentials_file = agents;
    a.ca_file = "/etc/registry-ca.pem";
    return a;
  };
  Tenancy(R"({"namespaces": {"team-b": {"repositories": ["127.0.0.1:5000/team-b"]},
                             "team-c": {"repositories": ["127.0.0.1:5000/team-c"], "agentCredentials": true}}})",
          {{"team-b", R"({"auths": {"127.0.0.1:5000": {"auth": "Yjpw"}}})"}, {"team-c", R"({"auths": {}})"}});
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();

  ExpectForbidden((*service)->StartRestore(RestoreOf("127.0.0.1:5000/team-a/vllm:warm"), kPodOfB),
                  "pod team-b/vllm-restored: gpusnap.io/restore-from `127.0.0.1:5000/team-a/vllm:warm` refused: "
                  "namespace `team-b` may not use repository `127.0.0.1:5000/team-a/vllm`: the administrator's "
                  "tenancy configuration gives it 127.0.0.1:5000/team-b");
  EXPECT_TRUE(seen.empty());

  Job own = Finished(**service, (*service)->StartRestore(RestoreOf("127.0.0.1:5000/team-b/vllm:warm"), kPodOfB));
  EXPECT_EQ(own.state, JobState::kSucceeded) << own.error;
  // team-c's Secret has none for the registry: the agent's, as its configuration allows.
  container::PodRef of_c{"team-c", "p", "c"};
  Job lent = Finished(**service, (*service)->StartRestore(RestoreOf("127.0.0.1:5000/team-c/x:1"), of_c));
  EXPECT_EQ(lent.state, JobState::kSucceeded) << lent.error;
  // The administrator's own restore: the agent's credentials.
  Job admin = Finished(**service, (*service)->StartRestore(RestoreOf("127.0.0.1:5000/team-a/vllm:warm")));
  EXPECT_EQ(admin.state, JobState::kSucceeded) << admin.error;
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].registry.credentials_file, root_ + "/ns-team-b.json");
  EXPECT_EQ(seen[0].registry.ca_file, "/etc/registry-ca.pem");
  EXPECT_EQ(seen[1].registry.credentials_file, agents);
  EXPECT_EQ(seen[2].registry.credentials_file, agents);
}

TEST_F(AgentServiceTest, APodsPullOpensWithItsNamespacesKeysNeverTheAgents) {
  std::vector<RestoreOptions> seen;
  std::mutex mu;
  RecordRestores(seen, mu);
  // The agent's own key (`gpusnap agent --decryption-key`) and team-b's Secret's.
  registry::Pkey agents_key(EVP_EC_gen("P-256")), b_key(EVP_EC_gen("P-256"));
  auto agents = std::make_shared<DecryptionKeys>();
  agents->keys = {agents_key};
  options_.registry = [agents]() -> Result<RegistryAccess> {
    RegistryAccess a;
    a.decryption_keys = agents;
    return a;
  };
  Tenancy(R"({"namespaces": {"team-b": {"repositories": ["127.0.0.1:5000/shared"]},
                             "team-c": {"repositories": ["127.0.0.1:5000/shared"]}}})",
          {{"team-b", "{}"}, {"team-c", "{}"}}, {{"team-b", KeyMaterial{{b_key}, {}, std::nullopt}}});
  auto service = Service::Open(options_);
  ASSERT_TRUE(service.ok()) << service.status().ToString();

  const std::string ref = "127.0.0.1:5000/shared/vllm:warm";
  EXPECT_EQ(Finished(**service, (*service)->StartRestore(RestoreOf(ref), kPodOfB)).state, JobState::kSucceeded);
  container::PodRef of_c{"team-c", "p", "c"};
  EXPECT_EQ(Finished(**service, (*service)->StartRestore(RestoreOf(ref), of_c)).state, JobState::kSucceeded);
  EXPECT_EQ(Finished(**service, (*service)->StartRestore(RestoreOf(ref))).state, JobState::kSucceeded);
  ASSERT_EQ(seen.size(), 3u);
  // team-b: its own key alone.
  ASSERT_NE(seen[0].registry.decryption_keys, nullptr);
  ASSERT_EQ(seen[0].registry.decryption_keys->keys.size(), 1u);
  EXPECT_EQ(seen[0].registry.decryption_keys->keys[0].get(), b_key.get());
  // team-c has none: none, and its refusals say whose keys they were.
  ASSERT_NE(seen[1].registry.decryption_keys, nullptr);
  EXPECT_TRUE(seen[1].registry.decryption_keys->keys.empty());
  EXPECT_EQ(seen[1].registry.decryption_keys->given, "decryption keys of namespace `team-c`");
  // The API's caller, an administrator: the agent's.
  EXPECT_EQ(seen[2].registry.decryption_keys, agents);
}

}  // namespace
}  // namespace gpusnap::agent
