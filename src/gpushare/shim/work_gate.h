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
#include <mutex>

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

  void Enter() {
    std::unique_lock lock(mu_);
    if (closed_) ++held_;
    cv_.wait(lock, [&] { return !closed_; });
    ++inside_;
  }
  void Exit() {
    std::lock_guard lock(mu_);
    if (--inside_ == 0) cv_.notify_all();
  }
  // Closes the gate and waits for the calls inside to leave. On timeout the
  // gate opens again and false is returned.
  bool Close(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    closed_ = true;
    held_ = 0;
    if (cv_.wait_for(lock, timeout, [&] { return inside_ == 0; })) return true;
    closed_ = false;
    cv_.notify_all();
    return false;
  }
  void Open() {
    std::lock_guard lock(mu_);
    closed_ = false;
    cv_.notify_all();
  }
  int inside() {
    std::lock_guard lock(mu_);
    return inside_;
  }
  // Calls that arrived while closed (since the last Close).
  int held() {
    std::lock_guard lock(mu_);
    return held_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;  // GUARDED_BY(mu_)
  int inside_ = 0;       // GUARDED_BY(mu_)
  int held_ = 0;         // GUARDED_BY(mu_)
};

}  // namespace gpusnap::gpushare::shim
