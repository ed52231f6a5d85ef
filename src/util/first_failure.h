// FirstFailure: the first error that any of a pool's worker threads reports,
// for the thread that joins them to return. Header-only (the gpushare shim
// uses it too).
//
// Thread-safety: Record and Get may be called from any thread.
#pragma once

#include "gpusnap/status.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap {

class FirstFailure {
 public:
  // Keeps `st` if it is the first failure; OK and later failures are dropped.
  void Record(const Status& st) EXCLUDES(mu_) {
    if (st.ok()) return;
    MutexLock lock(mu_);
    if (first_.ok()) first_ = st;
  }
  // The first failure recorded, OK when none was.
  Status Get() const EXCLUDES(mu_) {
    MutexLock lock(mu_);
    return first_;
  }

 private:
  mutable Mutex mu_;
  Status first_ GUARDED_BY(mu_);
};

}  // namespace gpusnap
