// The one exit of a story (checkpoint, restore), as CRIU's cr_dump_finish is
// its dump's: each step that must be undone pushes its undo as it is taken;
// on failure, Fail() runs the undos newest first and joins what they report
// to the cause; at the point of no return, Disarm() keeps what was done.
//
// Ownership: the undos capture the story's state by reference, so that state
// must outlive the UndoStack (declare it first). Not thread-safe: one story,
// one thread.
//
// A stack still armed when destroyed (a path that returned neither through
// Fail nor after Disarm: a bug, or an exception) runs its undos anyway and
// writes what failed to stderr, so nothing is left half-done.
#pragma once

#include <functional>
#include <utility>
#include <string>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap {

class UndoStack {
 public:
  UndoStack() = default;
  UndoStack(const UndoStack&) = delete;
  UndoStack& operator=(const UndoStack&) = delete;
  ~UndoStack();

  // `what` names the undo in an error ("resuming the GPU processes").
  void Push(std::string what, std::function<Status()> undo);

  // Keeps everything done so far: the undos pushed until now never run.
  void Disarm() { undos_.clear(); }

  // Runs the undos, newest first, each once, every one even when an earlier
  // one fails; returns `cause`, with each failed undo appended ("...; then
  // resuming the GPU processes failed: ..."). REQUIRES: !cause.ok().
  Status Fail(Status cause);

  size_t size() const { return undos_.size(); }

 private:
  struct Undo {
    std::string what;
    std::function<Status()> fn;
  };
  std::vector<Undo> undos_;
};

// A story's one exit: runs `story(undo)` with a fresh stack, and returns its
// result, or its failure through UndoStack::Fail. What the undos refer to
// must be declared before the call.
template <typename Story>
auto WithUndo(Story&& story) -> decltype(story(std::declval<UndoStack&>())) {
  UndoStack undo;
  auto result = story(undo);
  if (!result.ok()) return undo.Fail(result.status());
  return result;
}

}  // namespace gpusnap
