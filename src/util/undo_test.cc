#include "util/undo.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace gpusnap {
namespace {

TEST(UndoStack, FailRunsTheUndosNewestFirstAndKeepsTheCause) {
  std::vector<std::string> ran;
  UndoStack undo;
  undo.Push("first", [&] { ran.push_back("first"); return Status::Ok(); });
  undo.Push("second", [&] { ran.push_back("second"); return Status::Ok(); });
  Status st = undo.Fail(Status::Error(Code::kExternal, "CRIU failed"));
  EXPECT_EQ(ran, (std::vector<std::string>{"second", "first"}));
  EXPECT_EQ(st.code(), Code::kExternal);
  EXPECT_EQ(st.message(), "CRIU failed");
  EXPECT_EQ(undo.size(), 0u);
}

TEST(UndoStack, AFailedUndoIsReportedAndTheOthersStillRun) {
  std::vector<std::string> ran;
  UndoStack undo;
  undo.Push("unlocking", [&] { ran.push_back("unlocking"); return Status::Ok(); });
  undo.Push("resuming the GPU processes", [&] {
    ran.push_back("resuming");
    return Status::Error(Code::kExternal, "cuCheckpointProcessRestore: error 999");
  });
  Status st = undo.Fail(Status::Error(Code::kTimeout, "the dump timed out"));
  EXPECT_EQ(ran, (std::vector<std::string>{"resuming", "unlocking"}));
  EXPECT_EQ(st.code(), Code::kTimeout);
  EXPECT_EQ(st.message(),
            "the dump timed out; then resuming the GPU processes failed: cuCheckpointProcessRestore: error 999");
}

TEST(UndoStack, DisarmKeepsWhatWasDone) {
  int ran = 0;
  {
    UndoStack undo;
    undo.Push("a", [&] { ++ran; return Status::Ok(); });
    undo.Disarm();
    undo.Push("after the point of no return", [&] { ran += 10; return Status::Ok(); });
    (void)undo.Fail(Status::Error(Code::kInternal, "late failure"));
  }
  EXPECT_EQ(ran, 10);
}

TEST(UndoStack, AnArmedStackUndoesOnDestructionOnce) {
  int ran = 0;
  {
    UndoStack undo;
    undo.Push("a", [&] { ++ran; return Status::Ok(); });
  }
  EXPECT_EQ(ran, 1);
  {
    UndoStack undo;
    undo.Push("a", [&] { ++ran; return Status::Ok(); });
    (void)undo.Fail(Status::Error(Code::kInternal, "x"));
  }
  EXPECT_EQ(ran, 2);
}

TEST(WithUndo, AFailedStoryReturnsThroughTheUndoAndASuccessKeepsItsSteps) {
  int undone = 0;
  Result<int> failed = WithUndo([&](UndoStack& undo) -> Result<int> {
    undo.Push("step", [&] { ++undone; return Status::Ok(); });
    return Status::Error(Code::kNotFound, "gone");
  });
  EXPECT_EQ(failed.status().message(), "gone");
  EXPECT_EQ(undone, 1);
  Result<int> done = WithUndo([&](UndoStack& undo) -> Result<int> {
    undo.Push("step", [&] { ++undone; return Status::Ok(); });
    undo.Disarm();
    return 7;
  });
  EXPECT_EQ(*done, 7);
  EXPECT_EQ(undone, 1);
}

}  // namespace
}  // namespace gpusnap
