#include "agent/server/connection_limits.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace gpusnap::agent {
namespace {

using Verdict = ConnectionLimits::PeerVerdict;

TEST(AgentConnectionLimits, TheListenerHoldsAtMostItsLimit) {
  ConnectionLimits limits(2, 0);
  EXPECT_TRUE(limits.EnterListener());
  EXPECT_TRUE(limits.EnterListener());
  EXPECT_FALSE(limits.EnterListener());
  limits.LeaveListener();
  EXPECT_TRUE(limits.EnterListener());
  EXPECT_FALSE(limits.EnterListener());
}

TEST(AgentConnectionLimits, OnePeerHoldsItsShareAndOthersStillGetIn) {
  ConnectionLimits limits(0, 2);
  EXPECT_EQ(limits.EnterPeer("10.0.0.1"), Verdict::kAdmitted);
  EXPECT_EQ(limits.EnterPeer("10.0.0.1"), Verdict::kAdmitted);
  EXPECT_EQ(limits.EnterPeer("10.0.0.1"), Verdict::kRefused);
  EXPECT_EQ(limits.EnterPeer("10.0.0.1"), Verdict::kRefusedAgain);
  EXPECT_EQ(limits.EnterPeer("10.0.0.2"), Verdict::kAdmitted);
  limits.LeavePeer("10.0.0.1");
  EXPECT_EQ(limits.EnterPeer("10.0.0.1"), Verdict::kAdmitted);
  // Back at its limit after it went under: a refusal worth reporting again.
  EXPECT_EQ(limits.EnterPeer("10.0.0.1"), Verdict::kRefused);
}

TEST(AgentConnectionLimits, ZeroIsNoLimit) {
  ConnectionLimits limits(0, 0);
  for (int i = 0; i < 1000; ++i) {
    EXPECT_TRUE(limits.EnterListener());
    EXPECT_EQ(limits.EnterPeer(""), Verdict::kAdmitted);
  }
}

TEST(AgentConnectionLimits, CountsStayRightFromManyThreads) {
  ConnectionLimits limits(0, 4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&limits] {
      for (int i = 0; i < 10000; ++i)
        if (limits.EnterPeer("p") == Verdict::kAdmitted) limits.LeavePeer("p");
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(limits.EnterPeer("p"), Verdict::kAdmitted);
  EXPECT_EQ(limits.EnterPeer("p"), Verdict::kRefused);
}

}  // namespace
}  // namespace gpusnap::agent
