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

}  // namespace
}  // namespace gpusnap
