#include "cuda/checkpoint_api.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "cuda/fake_cuda_testing.h"

namespace gpusnap::cuda {
namespace {

using fakes::FakeCall;
using fakes::FakeCuda;

constexpr const char* kLock = "cuCheckpointProcessLock";
constexpr const char* kCheckpoint = "cuCheckpointProcessCheckpoint";
constexpr const char* kRestore = "cuCheckpointProcessRestore";
constexpr const char* kUnlock = "cuCheckpointProcessUnlock";

class CudaCheckpointApi : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = FakeCuda::Load();
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    driver_.emplace(std::move(d).value());
  }
  const Driver& driver() { return *driver_; }
  // Suspends `pids` and clears the log, as the starting point of a resume test.
  void Suspended(const std::vector<pid_t>& pids) {
    Report r = SuspendAll(driver(), pids, 1000);
    ASSERT_TRUE(r.ok()) << r.status.ToString();
    fake_.ClearLog();
  }
  std::vector<int> Pids(const std::string& fn) {
    std::vector<int> out;
    for (const FakeCall& c : fake_.Calls(fn)) out.push_back(c.pid);
    std::sort(out.begin(), out.end());
    return out;
  }
  static long long LastEnd(const std::vector<FakeCall>& calls) {
    long long t = 0;
    for (const auto& c : calls) t = std::max(t, c.t);
    return t;
  }
  static long long FirstStart(const std::vector<FakeCall>& calls) {
    long long t = LLONG_MAX;
    for (const auto& c : calls) t = std::min(t, c.start);
    return t;
  }

  FakeCuda fake_;
  std::optional<Driver> driver_;
};

TEST_F(CudaCheckpointApi, LockAllLocksEveryPidWithTheTimeout) {
  std::vector<pid_t> pids{111, 222};
  Report r = LockAll(driver(), pids, 5000);
  ASSERT_TRUE(r.ok()) << r.status.ToString();
  ASSERT_EQ(r.pids.size(), 2u);
  for (const PidReport& p : r.pids) {
    EXPECT_TRUE(p.status.ok());
    EXPECT_EQ(p.state, ProcessState::kLocked);
  }
  auto locks = fake_.Calls(kLock);
  ASSERT_EQ(locks.size(), 2u);
  for (const auto& c : locks) {
    EXPECT_EQ(c.rc, 0);
    EXPECT_EQ(c.extra.at("timeout_ms"), "5000");
  }
  EXPECT_EQ(Pids(kLock), (std::vector<int>{111, 222}));
  EXPECT_EQ(StateAll(driver(), pids).pids[1].state, ProcessState::kLocked);
}

TEST_F(CudaCheckpointApi, SuspendLocksEveryPidBeforeCheckpointingAny) {
  fake_.Set("DELAY_MS", "20");
  Report r = SuspendAll(driver(), std::vector<pid_t>{11, 12, 13}, 1000);
  ASSERT_TRUE(r.ok()) << r.status.ToString();
  auto locks = fake_.Calls(kLock), checkpoints = fake_.Calls(kCheckpoint);
  ASSERT_EQ(locks.size(), 3u);
  ASSERT_EQ(checkpoints.size(), 3u);
  EXPECT_LT(LastEnd(locks), FirstStart(checkpoints));
  for (const PidReport& p : r.pids) EXPECT_EQ(p.state, ProcessState::kCheckpointed);
  for (const char* phase : {"state", "lock", "checkpoint", "total"}) EXPECT_EQ(r.timings_s.count(phase), 1u) << phase;
}

TEST_F(CudaCheckpointApi, ResumeRestoresEveryPidBeforeUnlockingAny) {
  std::vector<pid_t> pids{21, 22, 23};
  Suspended(pids);
  fake_.Set("DELAY_MS", "20");
  Report r = ResumeAll(driver(), pids, {});
  ASSERT_TRUE(r.ok()) << r.status.ToString();
  auto restores = fake_.Calls(kRestore), unlocks = fake_.Calls(kUnlock);
  ASSERT_EQ(restores.size(), 3u);
  ASSERT_EQ(unlocks.size(), 3u);
  EXPECT_LT(LastEnd(restores), FirstStart(unlocks));
  for (const auto& c : restores) EXPECT_EQ(c.extra.at("pairs"), "none");
  for (const PidReport& p : r.pids) EXPECT_EQ(p.state, ProcessState::kRunning);
}

TEST_F(CudaCheckpointApi, PidsAreHandledConcurrently) {
  fake_.Set("DELAY_MS", "300");
  Report r = LockAll(driver(), std::vector<pid_t>{31, 32, 33}, 1000);
  ASSERT_TRUE(r.ok()) << r.status.ToString();
  auto locks = fake_.Calls(kLock);
  ASSERT_EQ(locks.size(), 3u);
  // Every lock started before any finished, each on its own thread.
  long long last_start = 0;
  for (const auto& c : locks) last_start = std::max(last_start, c.start);
  long long first_end = LLONG_MAX;
  for (const auto& c : locks) first_end = std::min(first_end, c.t);
  EXPECT_LT(last_start, first_end);
  std::set<long> tids;
  for (const auto& c : locks) tids.insert(c.tid);
  EXPECT_EQ(tids.size(), 3u);
  EXPECT_LT(r.timings_s["lock"], 0.9);  // not 3 x 300 ms
}

TEST_F(CudaCheckpointApi, FailedLockUnlocksThePidsAlreadyLocked) {
  fake_.Set("FAIL", "cuCheckpointProcessLock:222:600");
  Report r = LockAll(driver(), std::vector<pid_t>{111, 222}, 5000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status.code(), Code::kTimeout);
  const std::string& m = r.status.message();
  EXPECT_EQ(m.rfind("lock pid 222: CUDA_ERROR_NOT_READY (600): not locked within 5000 ms", 0), 0u) << m;
  EXPECT_NE(m.find("rolled back: unlocked pid 111"), std::string::npos) << m;
  EXPECT_NE(m.find("states now: 111 RUNNING, 222 RUNNING"), std::string::npos) << m;
  EXPECT_EQ(Pids(kUnlock), std::vector<int>{111});
  EXPECT_TRUE(r.pids[0].rolled_back);
  EXPECT_TRUE(r.pids[0].status.ok());
  EXPECT_FALSE(r.pids[1].status.ok());
  EXPECT_EQ(r.pids[0].state, ProcessState::kRunning);
  EXPECT_EQ(r.pids[1].state, ProcessState::kRunning);
}

TEST_F(CudaCheckpointApi, FailedRollbackIsReported) {
  fake_.Set("FAIL", "cuCheckpointProcessLock:222:600,cuCheckpointProcessUnlock:111:999");
  Report r = LockAll(driver(), std::vector<pid_t>{111, 222}, 5000);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status.message().find("rollback failed: unlock pid 111: CUDA_ERROR_UNKNOWN (999)"), std::string::npos)
      << r.status.message();
  EXPECT_NE(r.status.message().find("111 LOCKED"), std::string::npos) << r.status.message();
  EXPECT_FALSE(r.pids[0].rolled_back);
}

TEST_F(CudaCheckpointApi, DriverErrorNamesActionPidAndCuresult) {
  std::vector<pid_t> pid{4711};
  ASSERT_TRUE(LockAll(driver(), pid, 1000).ok());
  fake_.Set("FAIL", "cuCheckpointProcessCheckpoint:4711:801");
  Report r = CheckpointAll(driver(), pid);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status.code(), Code::kNotSupported);
  EXPECT_EQ(r.status.message(), "checkpoint pid 4711: CUDA_ERROR_NOT_SUPPORTED (801); states now: 4711 LOCKED");
}

TEST_F(CudaCheckpointApi, NonCudaAndMissingProcessesAreExplained) {
  fake_.Set("FAIL", "cuCheckpointProcessGetState:1:3,cuCheckpointProcessGetState:999999999:304");
  Report r = StateAll(driver(), std::vector<pid_t>{1});
  EXPECT_EQ(r.status.message(),
            "state pid 1: CUDA_ERROR_NOT_INITIALIZED (3): the process has not initialised CUDA (not a CUDA process?)");
  r = LockAll(driver(), std::vector<pid_t>{999999999}, 1000);
  EXPECT_EQ(r.status.code(), Code::kNotFound);
  EXPECT_EQ(r.status.message(), "lock pid 999999999: CUDA_ERROR_OPERATING_SYSTEM (304): no such process");
}

TEST_F(CudaCheckpointApi, ActionThatDoesNotFitTheStateSaysWhichStateItIs) {
  Report r = CheckpointAll(driver(), std::vector<pid_t>{4711});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status.code(), Code::kFailedPrecondition);
  EXPECT_EQ(r.status.message(), "checkpoint pid 4711: process is RUNNING; lock it first");
  EXPECT_TRUE(fake_.Calls(kCheckpoint).empty());
  EXPECT_EQ(r.pids[0].state, ProcessState::kRunning);
}

TEST_F(CudaCheckpointApi, OneMisfitPidMeansNothingIsDoneToAny) {
  ASSERT_TRUE(LockAll(driver(), std::vector<pid_t>{111}, 1000).ok());
  fake_.ClearLog();
  Report r = LockAll(driver(), std::vector<pid_t>{222, 111}, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status.message(), "lock pid 111: process is LOCKED; it is already locked; nothing was done to any pid");
  EXPECT_TRUE(fake_.Calls(kLock).empty());
  EXPECT_TRUE(r.pids[0].status.ok());
  EXPECT_FALSE(r.pids[1].status.ok());
}

TEST_F(CudaCheckpointApi, FailedCheckpointInSuspendRestoresThenUnlocksEveryPid) {
  fake_.Set("FAIL", "cuCheckpointProcessCheckpoint:222:999");
  Report r = SuspendAll(driver(), std::vector<pid_t>{111, 222}, 1000);
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status.message();
  EXPECT_NE(m.find("checkpoint pid 222: CUDA_ERROR_UNKNOWN (999)"), std::string::npos) << m;
  EXPECT_NE(m.find("rolled back: restored pid 111, then unlocked pids 111, 222"), std::string::npos) << m;
  EXPECT_EQ(Pids(kRestore), std::vector<int>{111});
  EXPECT_EQ(Pids(kUnlock), (std::vector<int>{111, 222}));
  EXPECT_LT(LastEnd(fake_.Calls(kRestore)), FirstStart(fake_.Calls(kUnlock)));
  for (const PidReport& p : r.pids) EXPECT_EQ(p.state, ProcessState::kRunning);
  EXPECT_EQ(r.timings_s.count("rollback"), 1u);
}

TEST_F(CudaCheckpointApi, FailedRestoreUnlocksNothing) {
  std::vector<pid_t> pids{111, 222};
  Suspended(pids);
  fake_.Set("FAIL", "cuCheckpointProcessRestore:222:801");
  Report r = ResumeAll(driver(), pids, {});
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status.message();
  EXPECT_NE(m.find("restore pid 222: CUDA_ERROR_NOT_SUPPORTED (801)"), std::string::npos) << m;
  EXPECT_NE(m.find("did not unlock any pid (every restore must succeed first)"), std::string::npos) << m;
  EXPECT_NE(m.find("states now: 111 LOCKED, 222 CHECKPOINTED"), std::string::npos) << m;
  EXPECT_TRUE(fake_.Calls(kUnlock).empty());
  EXPECT_EQ(r.pids[0].state, ProcessState::kLocked);
  EXPECT_EQ(r.pids[1].state, ProcessState::kCheckpointed);
}

TEST_F(CudaCheckpointApi, GpuMapReachesTheDriverAsUuidPairs) {
  fake_.Set("GPUS", "2");
  std::vector<pid_t> pids{51, 52};
  Suspended(pids);
  auto gpus = ListGpus(driver());
  ASSERT_TRUE(gpus.ok());
  auto entries = ParseGpuMap("0=1,1=0");
  ASSERT_TRUE(entries.ok());
  auto map = TranslateGpuMap(*entries, *gpus, *gpus);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  Report r = ResumeAll(driver(), pids, *map);
  ASSERT_TRUE(r.ok()) << r.status.ToString();
  auto restores = fake_.Calls(kRestore);
  ASSERT_EQ(restores.size(), 2u);
  for (const auto& c : restores)
    EXPECT_EQ(c.extra.at("pairs"), "GPU-5afec0da-0000-0000-0000-000000000000>GPU-5afec0da-0000-0000-0000-000000000001,"
                                "GPU-5afec0da-0000-0000-0000-000000000001>GPU-5afec0da-0000-0000-0000-000000000000");
}

TEST_F(CudaCheckpointApi, GpuMapOnAnR570DriverIsRefusedBeforeAnyCall) {
  fake_.Set("DRIVER_VERSION", "12080");
  auto old = FakeCuda::Load();
  ASSERT_TRUE(old.ok());
  fake_.ClearLog();
  GpuMap map{{Uuid{}, Uuid{}}};
  Report r = ResumeAll(*old, std::vector<pid_t>{61}, map);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status.code(), Code::kNotSupported);
  EXPECT_NE(r.status.message().find("needs CUDA driver 13.0 (13000) (r580); this one is 12.8 (12080)"),
            std::string::npos)
      << r.status.message();
  EXPECT_TRUE(fake_.Calls().empty());
}

TEST_F(CudaCheckpointApi, OneCuInitForAWholeSuspendAndResume) {
  FakeCuda fresh;  // a fresh log: the Driver below is the only one
  auto d = FakeCuda::Load();
  ASSERT_TRUE(d.ok());
  std::vector<pid_t> pids{71, 72, 73};
  ASSERT_TRUE(SuspendAll(*d, pids, 1000).ok());
  ASSERT_TRUE(ResumeAll(*d, pids, {}).ok());
  EXPECT_EQ(fresh.Calls("cuInit").size(), 1u);
  EXPECT_EQ(fresh.Calls(kLock).size(), 3u);
  EXPECT_EQ(fresh.Calls(kUnlock).size(), 3u);
  for (const FakeCall& c : fresh.Calls()) EXPECT_NE(c.rc, 3) << c.fn << " ran before cuInit";
}

TEST_F(CudaCheckpointApi, BadPidListsAreRefusedBeforeAnyCall) {
  fake_.ClearLog();
  EXPECT_EQ(LockAll(driver(), std::vector<pid_t>{}, 1000).status.message(), "no pid given");
  EXPECT_EQ(LockAll(driver(), std::vector<pid_t>{0}, 1000).status.message(), "`0` is not a pid");
  Report dup = LockAll(driver(), std::vector<pid_t>{5, 6, 5}, 1000);
  EXPECT_EQ(dup.status.code(), Code::kInvalidArgument);
  EXPECT_EQ(dup.status.message(), "pid 5 is given twice");
  EXPECT_EQ(LockAll(driver(), std::vector<pid_t>{5}, -1).status.code(), Code::kInvalidArgument);
  EXPECT_TRUE(fake_.Calls().empty());
}

TEST_F(CudaCheckpointApi, RestoreThreadIdsAndStates) {
  // The fake names the newest thread of a real pid, else pid + 1: these pids
  // are above the kernel's limit (PID_MAX_LIMIT, 4194304), so no process of
  // the machine running the test has them.
  constexpr pid_t kA = 4194400, kB = 4194401, kC = 4194410;
  Report r = RestoreThreadIds(driver(), std::vector<pid_t>{kA, kB});
  ASSERT_TRUE(r.ok()) << r.status.ToString();
  EXPECT_EQ(r.pids[0].restore_tid, kA + 1);
  EXPECT_EQ(r.pids[1].restore_tid, kB + 1);
  auto tid = RestoreThreadId(driver(), kC);
  ASSERT_TRUE(tid.ok());
  EXPECT_EQ(*tid, kC + 1);
  auto state = GetState(driver(), kC);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, ProcessState::kRunning);
  fake_.Set("FAIL", fmt::format("cuCheckpointProcessGetState:{}:801", kC));
  EXPECT_EQ(GetState(driver(), kC).status().message(),
            fmt::format("state pid {}: CUDA_ERROR_NOT_SUPPORTED (801)", kC));
}

}  // namespace
}  // namespace gpusnap::cuda
