#include "cuda/plan.h"

#include <gtest/gtest.h>

namespace gpusnap::cuda {
namespace {

TEST(CudaPlan, SuspendLocksEveryPidBeforeCheckpointingAny) {
  EXPECT_EQ(PhasesOf(Action::kSuspend), (std::vector<Op>{Op::kLock, Op::kCheckpoint}));
}

TEST(CudaPlan, ResumeRestoresEveryPidBeforeUnlockingAny) {
  EXPECT_EQ(PhasesOf(Action::kResume), (std::vector<Op>{Op::kRestore, Op::kUnlock}));
}

TEST(CudaPlan, SingleStepActions) {
  EXPECT_EQ(PhasesOf(Action::kLock), std::vector<Op>{Op::kLock});
  EXPECT_EQ(PhasesOf(Action::kCheckpoint), std::vector<Op>{Op::kCheckpoint});
  EXPECT_EQ(PhasesOf(Action::kRestore), std::vector<Op>{Op::kRestore});
  EXPECT_EQ(PhasesOf(Action::kUnlock), std::vector<Op>{Op::kUnlock});
  EXPECT_EQ(PhasesOf(Action::kState), std::vector<Op>{Op::kGetState});
  EXPECT_EQ(PhasesOf(Action::kRestoreTid), std::vector<Op>{Op::kGetRestoreTid});
}

TEST(CudaPlan, FailedLockUnlocksOnlyThoseItLocked) {
  std::vector<Op> phases = PhasesOf(Action::kLock);
  auto steps = RollbackPlan(phases, 0);
  ASSERT_EQ(steps.size(), 1u);
  EXPECT_EQ(steps[0].op, Op::kUnlock);
  EXPECT_TRUE(steps[0].only_succeeded);
}

TEST(CudaPlan, FailedCheckpointInSuspendRestoresThenUnlocksEveryone) {
  std::vector<Op> phases = PhasesOf(Action::kSuspend);
  auto steps = RollbackPlan(phases, 1);
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[0].op, Op::kRestore);
  EXPECT_TRUE(steps[0].only_succeeded);
  EXPECT_EQ(steps[1].op, Op::kUnlock);
  EXPECT_FALSE(steps[1].only_succeeded);
}

TEST(CudaPlan, FailedRestoreUndoesNothingAndUnlocksNothing) {
  EXPECT_TRUE(RollbackPlan(PhasesOf(Action::kResume), 0).empty());
  EXPECT_TRUE(RollbackPlan(PhasesOf(Action::kRestore), 0).empty());
}

TEST(CudaPlan, FailedUnlockIsNotUndone) {
  EXPECT_TRUE(RollbackPlan(PhasesOf(Action::kResume), 1).empty());
  EXPECT_TRUE(RollbackPlan(PhasesOf(Action::kUnlock), 0).empty());
}

TEST(CudaPlan, StateCheckSaysWhereThePidIsAndWhatToDo) {
  EXPECT_TRUE(CheckState(Op::kLock, ProcessState::kRunning).ok());
  EXPECT_TRUE(CheckState(Op::kCheckpoint, ProcessState::kLocked).ok());
  EXPECT_TRUE(CheckState(Op::kRestore, ProcessState::kCheckpointed).ok());
  EXPECT_TRUE(CheckState(Op::kUnlock, ProcessState::kLocked).ok());
  EXPECT_TRUE(CheckState(Op::kGetState, ProcessState::kFailed).ok());

  Status s = CheckState(Op::kCheckpoint, ProcessState::kRunning);
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "process is RUNNING; lock it first");
  EXPECT_EQ(CheckState(Op::kUnlock, ProcessState::kCheckpointed).message(), "process is CHECKPOINTED; restore it first");
  EXPECT_EQ(CheckState(Op::kLock, ProcessState::kLocked).message(), "process is LOCKED; it is already locked");
  EXPECT_NE(CheckState(Op::kRestore, ProcessState::kLocked).message().find("process is LOCKED"), std::string::npos);
  EXPECT_NE(CheckState(Op::kLock, ProcessState::kFailed).message().find("process is FAILED"), std::string::npos);
  EXPECT_NE(CheckState(Op::kLock, static_cast<ProcessState>(9)).message().find("UNKNOWN(9)"), std::string::npos);
}

TEST(CudaPlan, StatesAfterEachOp) {
  EXPECT_EQ(StateAfter(Op::kLock, ProcessState::kRunning), ProcessState::kLocked);
  EXPECT_EQ(StateAfter(Op::kCheckpoint, ProcessState::kLocked), ProcessState::kCheckpointed);
  EXPECT_EQ(StateAfter(Op::kRestore, ProcessState::kCheckpointed), ProcessState::kLocked);
  EXPECT_EQ(StateAfter(Op::kUnlock, ProcessState::kLocked), ProcessState::kRunning);
  EXPECT_EQ(StateAfter(Op::kGetRestoreTid, ProcessState::kLocked), ProcessState::kLocked);
}

TEST(CudaPlan, ActionNamesRoundTrip) {
  for (const ActionInfo& a : AllActions()) {
    auto parsed = ParseAction(a.name);
    ASSERT_TRUE(parsed.ok()) << a.name;
    EXPECT_EQ(*parsed, a.action);
    EXPECT_STREQ(ActionName(a.action), a.name);
  }
  auto bad = ParseAction("freeze");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("`freeze`"), std::string::npos);
  EXPECT_NE(bad.status().message().find("restore-tid"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap::cuda
