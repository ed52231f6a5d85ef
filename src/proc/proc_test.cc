#include "proc/proc.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

namespace gpusnap::proc {
namespace {

TEST(ProcState, OnlyTheStoppedStatesAreStopped) {
  EXPECT_TRUE(IsStopped('T'));
  EXPECT_TRUE(IsStopped('t'));
  for (char running : {'R', 'S', 'D', 'Z', 'X', 'I', 'P', 'W', '?'}) EXPECT_FALSE(IsStopped(running)) << running;
}

// A thread's status as the kernel writes it, with the lines that matter here.
std::string Status(const char* state, const char* sig_pnd, const char* shd_pnd) {
  return fmt::format("Name:\tcnt:12\nUmask:\t0022\nState:\t{}\nTgid:\t4711\nPid:\t4712\nSigQ:\t0/63432\n"
                     "SigPnd:\t{}\nShdPnd:\t{}\nSigBlk:\t0000000000000000\nSigIgn:\t0000000000001000\n",
                     state, sig_pnd, shd_pnd);
}

TEST(ThreadStop, ARunningThreadWithNothingPendingIsNotHeld) {
  auto stop = ParseThreadStop(Status("S (sleeping)", "0000000000000000", "0000000000000000"));
  ASSERT_TRUE(stop.ok()) << stop.status().ToString();
  EXPECT_EQ(stop->state, 'S');
  EXPECT_FALSE(stop->stop_pending);
  EXPECT_FALSE(stop->held());
}

TEST(ThreadStop, StoppedAndTracedThreadsAreHeld) {
  EXPECT_TRUE(ParseThreadStop(Status("T (stopped)", "0000000000000000", "0000000000000000"))->held());
  EXPECT_TRUE(ParseThreadStop(Status("t (tracing stop)", "0000000000000000", "0000000000000000"))->held());
}

TEST(ThreadStop, APendingSigstopHoldsTheThreadItsProcessOrItsOwn) {
  // SIGSTOP is 19: bit 18.
  auto shared = ParseThreadStop(Status("R (running)", "0000000000000000", "0000000000040000"));
  EXPECT_TRUE(shared->stop_pending);
  EXPECT_TRUE(shared->held());
  EXPECT_TRUE(ParseThreadStop(Status("S (sleeping)", "0000000000040000", "0000000000000000"))->held());
  // Other signals pending (SIGCONT 18, SIGTERM 15, SIGUSR1 10) hold nothing.
  EXPECT_FALSE(ParseThreadStop(Status("S (sleeping)", "0000000000024200", "0000000000020000"))->held());
}

TEST(ThreadStop, AStatusWithoutAStateIsRefused) {
  EXPECT_EQ(ParseThreadStop("Name:\tx\nSigPnd:\t0000000000040000\n").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParseThreadStop("").status().code(), Code::kInvalidArgument);
}

// A child of two threads that sleep in a loop.
class TwoThreadChild : public ::testing::Test {
 protected:
  void SetUp() override {
    child_ = fork();
    if (child_ == 0) {
      std::thread other([] {
        for (;;) usleep(10000);
      });
      for (;;) usleep(10000);
    }
    ASSERT_GT(child_, 0);
    for (int i = 0; i < 500 && Threads() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_EQ(Threads(), 2u);
  }
  void TearDown() override {
    if (child_ <= 0) return;
    kill(child_, SIGKILL);
    waitpid(child_, nullptr, 0);
  }
  size_t Threads() const {
    size_t n = 0;
    std::error_code ec;
    for ([[maybe_unused]] const auto& e :
         std::filesystem::directory_iterator("/proc/" + std::to_string(child_) + "/task", ec))
      ++n;
    return n;
  }
  // HeldThreads once it names `n` threads in group-stop (a stop reaches
  // each thread on its own), or what it says after 2 s.
  std::vector<HeldThread> WaitForGroupStop(size_t n) const {
    std::vector<HeldThread> found;
    for (int i = 0; i < 1000; ++i) {
      found = HeldThreads({child_});
      if (found.size() == n && std::all_of(found.begin(), found.end(), [](auto& t) { return t.stop.state == 'T'; }))
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return found;
  }
  pid_t child_ = 0;
};

TEST_F(TwoThreadChild, EveryThreadOfAStoppedProcessIsNamedAndNoneOnceContinued) {
  EXPECT_TRUE(HeldThreads({child_}).empty());
  ASSERT_EQ(kill(child_, SIGSTOP), 0);
  auto stopped = WaitForGroupStop(2);
  ASSERT_EQ(stopped.size(), 2u);
  for (const auto& t : stopped) {
    EXPECT_EQ(t.pid, child_);
    EXPECT_EQ(t.stop.state, 'T');
  }
  EXPECT_NE(stopped[0].tid, stopped[1].tid);
  ASSERT_EQ(kill(child_, SIGCONT), 0);
  // SIGCONT wakes a stopped task within the kill() that sends it.
  EXPECT_TRUE(HeldThreads({child_}).empty());
}

TEST_F(TwoThreadChild, AProcessThatIsGoneHasNoHeldThreads) {
  ASSERT_EQ(kill(child_, SIGSTOP), 0);
  ASSERT_EQ(WaitForGroupStop(2).size(), 2u);
  ASSERT_EQ(kill(child_, SIGKILL), 0);
  ASSERT_EQ(waitpid(child_, nullptr, 0), child_);
  EXPECT_TRUE(HeldThreads({child_}).empty());
  child_ = 0;
}

}  // namespace
}  // namespace gpusnap::proc
