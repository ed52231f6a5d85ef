// How a long operation reports its steps to whoever shows them (the CLI's
// progress bar, the agent's job record).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace gpusnap {

// A step of a long operation, reported as it finishes (or as it progresses,
// for steps that move bytes).
struct ProgressEvent {
  std::string phase;     // "resolve", "dump", "publish", "verify", "restore", ...
  double seconds = 0;    // time spent in the phase so far
  uint64_t bytes = 0;    // bytes handled by the phase, 0 when not meaningful
  bool done = false;
};
using ProgressFn = std::function<void(const ProgressEvent&)>;

}  // namespace gpusnap
