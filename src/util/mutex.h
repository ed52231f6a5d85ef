// Mutex and MutexLock: std::mutex and a scoped lock of it, annotated so that
// clang checks GUARDED_BY / REQUIRES / EXCLUDES (util/thread_annotations.h).
// Header-only: the gpushare shim, which links no gpusnap library, uses it too.
//
// A condition variable is waited on through the MutexLock that holds its
// mutex; wait in a loop on the condition, which the analysis then sees read
// with the mutex held:
//   MutexLock lock(mu_);
//   while (!ready_) lock.Wait(cv_);
//
// Thread-safety: Mutex is the synchronisation; a MutexLock belongs to the one
// thread that made it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "util/thread_annotations.h"

namespace gpusnap {

class CAPABILITY("mutex") Mutex {
 public:
  // constexpr: a global Mutex is ready before any constructor of its library runs.
  constexpr Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  bool TryLock() TRY_ACQUIRE(true) { return mu_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mu_;
};

class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mu) ACQUIRE(mu) : lock_(mu.mu_) {}
  ~MutexLock() RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Lets go of the mutex while waiting for a notification of `cv` (or a
  // spurious wakeup); holds it again on return.
  void Wait(std::condition_variable& cv) { cv.wait(lock_); }
  // Same, until `deadline` at the latest; false when it returned because the
  // deadline passed.
  template <typename Clock, typename Duration>
  bool WaitUntil(std::condition_variable& cv, std::chrono::time_point<Clock, Duration> deadline) {
    return cv.wait_until(lock_, deadline) == std::cv_status::no_timeout;
  }
  template <typename Rep, typename Period>
  bool WaitFor(std::condition_variable& cv, std::chrono::duration<Rep, Period> timeout) {
    return cv.wait_for(lock_, timeout) == std::cv_status::no_timeout;
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace gpusnap
