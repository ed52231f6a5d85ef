#include "util/undo.h"

#include <cstdio>
#include <utility>

namespace gpusnap {

void UndoStack::Push(std::string what, std::function<Status()> undo) {
  undos_.push_back({std::move(what), std::move(undo)});
}

Status UndoStack::Fail(Status cause) {
  // Taken out first: an undo that fails never runs twice, nor from the destructor.
  std::vector<Undo> undos = std::move(undos_);
  undos_.clear();
  for (auto it = undos.rbegin(); it != undos.rend(); ++it) {
    cause = cause.Then(it->what, it->fn());
  }
  return cause;
}

UndoStack::~UndoStack() {
  if (undos_.empty()) return;
  Status st = Fail(Status::Error(Code::kInternal, "a story ended without its result"));
  std::fprintf(stderr, "gpusnap: undone on exit: %s\n", st.message().c_str());
}

}  // namespace gpusnap
