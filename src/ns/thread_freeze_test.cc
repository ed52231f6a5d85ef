#include "ns/thread_freeze.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "proc/proc.h"

namespace gpusnap::ns {
namespace {

constexpr int kThreads = 4;

struct Shared {
  std::atomic<long> ticks[kThreads];
  std::atomic<pid_t> tids[kThreads];
};

// A child process with kThreads threads, each counting in shared memory.
class CountingChild : public ::testing::Test {
 protected:
  void SetUp() override {
    shared_ = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    new (shared_) Shared{};
    child_ = fork();
    if (child_ == 0) {
      std::thread ts[kThreads - 1];
      auto body = [this](int i) {
        shared_->tids[i] = static_cast<pid_t>(syscall(SYS_gettid));
        for (;;) {
          shared_->ticks[i]++;
          usleep(1000);
        }
      };
      for (int i = 1; i < kThreads; ++i) ts[i - 1] = std::thread(body, i);
      body(0);
    }
    for (int i = 0; i < kThreads; ++i)
      while (shared_->tids[i] == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  void TearDown() override {
    kill(child_, SIGKILL);
    waitpid(child_, nullptr, 0);
    munmap(shared_, sizeof(Shared));
  }
  // Which threads advanced over 100 ms.
  std::vector<bool> Advancing() {
    long before[kThreads];
    for (int i = 0; i < kThreads; ++i) before[i] = shared_->ticks[i];
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::vector<bool> out;
    for (int i = 0; i < kThreads; ++i) out.push_back(shared_->ticks[i] != before[i]);
    return out;
  }
  Shared* shared_ = nullptr;
  pid_t child_ = 0;
};

TEST_F(CountingChild, OnlyTheKeptThreadRuns) {
  pid_t keep = shared_->tids[2];
  auto freeze = ThreadFreeze::AllBut(child_, keep);
  ASSERT_TRUE(freeze.ok()) << freeze.status().ToString();
  EXPECT_EQ(freeze->frozen().size(), static_cast<size_t>(kThreads - 1));
  EXPECT_EQ(Advancing(), (std::vector<bool>{false, false, true, false}));
  ASSERT_TRUE(freeze->Release().ok());
  EXPECT_EQ(Advancing(), (std::vector<bool>{true, true, true, true}));
}

TEST_F(CountingChild, DetachIntoStopStopsEveryThreadUntilContinued) {
  auto freeze = ThreadFreeze::AllBut(child_, shared_->tids[1]);
  ASSERT_TRUE(freeze.ok());
  ASSERT_TRUE(freeze->DetachIntoStop().ok());
  EXPECT_EQ(Advancing(), (std::vector<bool>{false, false, false, false}));
  EXPECT_EQ(proc::ReadStat(child_)->state, 'T');
  ASSERT_TRUE(Continue(child_).ok());
  EXPECT_EQ(Advancing(), (std::vector<bool>{true, true, true, true}));
}

TEST_F(CountingChild, FreezingAStoppedProcessThenContinuingRunsOnlyTheKeptThread) {
  // The restore side: CRIU leaves the task in group-stop; we freeze all but
  // the restore thread, SIGCONT, and only that thread runs.
  kill(child_, SIGSTOP);
  while (proc::ReadStat(child_)->state != 'T') std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto freeze = ThreadFreeze::AllBut(child_, shared_->tids[3]);
  ASSERT_TRUE(freeze.ok()) << freeze.status().ToString();
  ASSERT_TRUE(Continue(child_).ok());
  EXPECT_EQ(Advancing(), (std::vector<bool>{false, false, false, true}));
  ASSERT_TRUE(freeze->Release().ok());
  EXPECT_EQ(Advancing(), (std::vector<bool>{true, true, true, true}));
}

TEST(ThreadFreeze, MissingProcessIsAnError) { EXPECT_FALSE(ThreadFreeze::AllBut(999999, 0).ok()); }

}  // namespace
}  // namespace gpusnap::ns

namespace gpusnap::proc {
namespace {
TEST(HostTid, HostTidIsItself) {
  pid_t self = ::getpid();
  EXPECT_EQ(*HostTid(self, static_cast<pid_t>(syscall(SYS_gettid))), static_cast<pid_t>(syscall(SYS_gettid)));
  EXPECT_FALSE(HostTid(self, 999999).ok());
}
}  // namespace
}  // namespace gpusnap::proc
