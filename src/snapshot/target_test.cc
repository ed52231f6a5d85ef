#include "snapshot/target.h"

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

Target InAContainer() {
  Target t;
  t.host_pid = 4711;
  t.ns_pid = 7;
  t.ns_holder = 4700;  // the container's init
  t.parent = 4700;
  return t;
}

TEST(InitToHoldDuringDump, AContainersInitAboveTheTreeIsHeld) {
  EXPECT_EQ(InitToHoldDuringDump(InAContainer(), false), 4700);
}

TEST(InitToHoldDuringDump, NothingIsHeldWithLeaveRunning) {
  EXPECT_EQ(InitToHoldDuringDump(InAContainer(), true), 0);
}

TEST(InitToHoldDuringDump, AGpusnapReaperOutlivesItsTreeAndIsNotHeld) {
  Target t = InAContainer();
  t.workload = true;
  EXPECT_EQ(InitToHoldDuringDump(t, false), 0);
}

TEST(InitToHoldDuringDump, AnInitThatIsNotTheRootsParentIsNotHeld) {
  Target t = InAContainer();
  t.parent = 4705;  // a shell between the init and the tree: it goes with the tree, the init stays
  EXPECT_EQ(InitToHoldDuringDump(t, false), 0);
}

TEST(InitToHoldDuringDump, ATreeInGpusnapsOwnNamespaceHoldsNothing) {
  Target t;
  t.host_pid = 4711;
  t.parent = 1;
  EXPECT_EQ(InitToHoldDuringDump(t, false), 0);
}

bool NoWorkload(std::string_view) { return false; }

TEST(ParseTargetArgument, DigitsAreAPid) {
  auto t = ParseTargetArgument("4711", NoWorkload);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->kind, TargetSpec::Kind::kPid);
  EXPECT_EQ(t->pid, 4711);
  EXPECT_EQ(t->ToString(), "4711");
  EXPECT_FALSE(ParseTargetArgument("0", NoWorkload).ok());
  EXPECT_FALSE(ParseTargetArgument("99999999999999", NoWorkload).ok());
}

TEST(ParseTargetArgument, HexOfAContainerIdsLengthIsAContainerUnlessAWorkloadHasTheName) {
  auto t = ParseTargetArgument("0123456789abcdef", NoWorkload);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->kind, TargetSpec::Kind::kContainer);
  EXPECT_EQ(t->container, "0123456789abcdef");
  auto named = ParseTargetArgument("0123456789abcdef", [](std::string_view n) { return n == "0123456789abcdef"; });
  ASSERT_TRUE(named.ok());
  EXPECT_EQ(named->kind, TargetSpec::Kind::kWorkload);
  // Too short for a container id: a workload name.
  EXPECT_EQ(ParseTargetArgument("abcdef", NoWorkload)->kind, TargetSpec::Kind::kWorkload);
}

TEST(ParseTargetArgument, AnythingElseIsAWorkloadNameByTheNameRule) {
  auto t = ParseTargetArgument("server", NoWorkload);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->kind, TargetSpec::Kind::kWorkload);
  EXPECT_EQ(t->workload, "server");
  auto bad = ParseTargetArgument("-x", NoWorkload);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("invalid workload name `-x`"), std::string::npos);
  EXPECT_FALSE(ParseTargetArgument("", NoWorkload).ok());
}

TEST(TargetSpec, APodIsWrittenNamespaceNameContainer) {
  EXPECT_EQ(TargetSpec::Pod({"team-a", "llm-0", "server"}).ToString(), "team-a/llm-0/server");
}

TEST(SnapshotIdPrefix, OneRuleForEveryDoor) {
  Target t;
  t.host_pid = 4711;
  EXPECT_EQ(SnapshotIdPrefix(t), "pid4711");
  t.container_id = std::string(64, 'a');
  EXPECT_EQ(SnapshotIdPrefix(t), "ctr-aaaaaaaaaaaa");
  t.name = "server";
  EXPECT_EQ(SnapshotIdPrefix(t), "server");
}

}  // namespace
}  // namespace gpusnap
