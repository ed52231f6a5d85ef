// The phase timer both stories use: each phase's seconds go into a map (the
// snapshot's timings_s, a restore's result) and, as it ends, to the
// caller's progress callback. Not thread-safe.
#pragma once

#include <chrono>
#include <map>
#include <string>

#include "gpusnap/operations.h"

namespace gpusnap {

class Phases {
 public:
  using Clock = std::chrono::steady_clock;

  // REQUIRES: `progress` outlives this object (it may be empty).
  explicit Phases(const ProgressFn& progress) : progress_(progress), created_(Clock::now()) {}

  void Start(const std::string& phase) {
    phase_ = phase;
    start_ = Clock::now();
  }
  // Ends the phase Start named, with the bytes it handled (0: not meaningful).
  void Done(uint64_t bytes = 0) {
    double s = Since(start_);
    timings_[phase_] = s;
    if (progress_) progress_({phase_, s, bytes, true});
  }
  // Records "total": the time since construction.
  void Total() { timings_["total"] = Since(created_); }

  std::map<std::string, double>& timings() { return timings_; }

 private:
  static double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

  const ProgressFn& progress_;
  Clock::time_point created_;
  std::string phase_;
  Clock::time_point start_;
  std::map<std::string, double> timings_;
};

}  // namespace gpusnap
