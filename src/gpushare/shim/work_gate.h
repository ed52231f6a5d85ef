// The gate every hooked work-submitting call passes: kernel launches, copies,
// memsets, stream memory operations and allocations. `quiesce` closes it and
// waits until no thread is inside a hooked call; threads arriving after that
// wait at the gate, outside the driver and holding none of its locks, until
// `resume` opens it again.
//
// Thread-safety: all members are safe to call from any thread.
#pragma once

#include <chrono>
#include <condition_variable>

#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::gpushare::shim {

class WorkGate {
 public:
  class Scope {
   public:
    explicit Scope(WorkGate& gate) : gate_(gate) { gate_.Enter(); }
    ~Scope() { gate_.Exit(); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    WorkGate& gate_;
  };

  void Enter() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (closed_) ++held_;
    while (closed_) lock.Wait(cv_);
    ++inside_;
  }
  void Exit() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    if (--inside_ == 0) cv_.notify_all();
  }
  // Closes the gate and waits for the calls inside to leave. On timeout the
  // gate opens again and false is returned.
  bool Close(std::chrono::milliseconds timeout) EXCLUDES(mu_) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(mu_);
    closed_ = true;
    held_ = 0;
    while (inside_ != 0 && lock.WaitUntil(cv_, deadline)) {
    }
    if (inside_ == 0) return true;
    closed_ = false;
    cv_.notify_all();
    return false;
  }
  void Open() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    closed_ = false;
    cv_.notify_all();
  }
  int inside() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return inside_;
  }
  // Calls that arrived while closed (since the last Close).
  int held() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return held_;
  }

 private:
  Mutex mu_;
  std::condition_variable cv_;  // the gate opened, or the last call inside left
  bool closed_ GUARDED_BY(mu_) = false;
  int inside_ GUARDED_BY(mu_) = 0;
  int held_ GUARDED_BY(mu_) = 0;
};

}  // namespace gpusnap::gpushare::shim
