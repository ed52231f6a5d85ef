// Stopping all threads of a process but one.
//
// Why: after the CUDA driver checkpoints a process, its pinned host buffers
// are unmapped, and a CPU thread that touches one faults. So between the GPU
// checkpoint and CRIU's freeze (and between CRIU's restore and the GPU
// restore) no thread may run except the driver's restore thread, which does
// the work. ptrace gives per-thread stops that signals cannot.
//
// Lifetime: a ThreadFreeze is tied to the thread that created it (ptrace's
// tracer is a thread). Destroying it releases the threads (they run again).
// Not thread-safe.
#pragma once

#include <sys/types.h>

#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::ns {

class ThreadFreeze {
 public:
  // Seizes and stops every thread of `pid` except `keep_tid` (0: none),
  // including threads created while this runs. Works on a process that is
  // running or in group-stop (SIGSTOP).
  static Result<ThreadFreeze> AllBut(pid_t pid, pid_t keep_tid);

  ThreadFreeze(ThreadFreeze&& o) noexcept;
  ThreadFreeze& operator=(ThreadFreeze&&) = delete;
  ~ThreadFreeze();

  // Detaches into a group-stop: every thread, the kept one too, stays stopped
  // (SIGSTOP), ready for CRIU to seize. The process needs SIGCONT later.
  Status DetachIntoStop();
  // Detaches and lets every thread run; sends SIGCONT so that a process in
  // group-stop runs too.
  Status Release();

  pid_t pid() const { return pid_; }
  const std::vector<pid_t>& frozen() const { return tids_; }

 private:
  ThreadFreeze(pid_t pid) : pid_(pid) {}
  pid_t pid_ = 0;
  std::vector<pid_t> tids_;  // seized by us
};

// Waits for `tid`, which this thread has seized (PTRACE_SEIZE), to reach a
// ptrace-stop: a thread in group-stop reports at once, a running one after
// PTRACE_INTERRUPT. A signal that arrives meanwhile is kept pending for
// later. kNotFound when the thread exits instead.
Status WaitStopped(pid_t tid);

// Sends SIGCONT to the process, so that a kept thread left in group-stop
// (by CRIU's restore of a stopped task) runs while the frozen ones stay.
Status Continue(pid_t pid);

}  // namespace gpusnap::ns
