#include "ns/thread_freeze.h"

#include <signal.h>
#include <sys/ptrace.h>
#include <sys/wait.h>

#include <algorithm>

#include "proc/proc.h"

namespace gpusnap::ns {

Status WaitStopped(pid_t tid) {
  int status = 0;
  for (;;) {
    pid_t r = ::waitpid(tid, &status, __WALL);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::Errno(errno, "waiting for thread {} to stop", tid);
    if (WIFSTOPPED(status)) {
      int sig = WSTOPSIG(status);
      // A signal that arrived meanwhile: keep it pending for later, stay stopped.
      if (sig != SIGTRAP && sig != SIGSTOP && sig != SIGTSTP && sig != SIGTTIN && sig != SIGTTOU) {
        ::ptrace(PTRACE_CONT, tid, nullptr, reinterpret_cast<void*>(static_cast<long>(sig)));
        ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
        continue;
      }
      return Status::Ok();
    }
    return Status::Error(Code::kNotFound, "thread {} exited while being stopped", tid);
  }
}

Result<ThreadFreeze> ThreadFreeze::AllBut(pid_t pid, pid_t keep_tid) {
  ThreadFreeze f(pid);
  // Threads may be created while we seize; repeat until nothing new appears.
  for (bool grew = true; grew;) {
    grew = false;
    for (pid_t tid : proc::Threads(pid)) {
      if (tid == keep_tid || std::find(f.tids_.begin(), f.tids_.end(), tid) != f.tids_.end()) continue;
      if (::ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0) {
        if (errno == ESRCH) continue;  // exited meanwhile
        return Status::Errno(errno, "freezing thread {} of pid {}", tid, pid);
      }
      f.tids_.push_back(tid);
      grew = true;
      ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
      GPUSNAP_RETURN_IF_ERROR(WaitStopped(tid));
    }
  }
  if (f.tids_.empty() && keep_tid == 0) return Status::Error(Code::kNotFound, "pid {} has no threads", pid);
  return f;
}

ThreadFreeze::ThreadFreeze(ThreadFreeze&& o) noexcept : pid_(o.pid_), tids_(std::move(o.tids_)) { o.tids_.clear(); }

ThreadFreeze::~ThreadFreeze() { (void)Release(); }

Status ThreadFreeze::DetachIntoStop() {
  // SIGSTOP first: only a running (kept) thread can take it, and it starts
  // the group-stop; each frozen thread joins it as it is detached.
  Status st;
  if (::kill(pid_, SIGSTOP) != 0) st = Status::Errno(errno, "stopping pid {}", pid_);
  for (pid_t tid : tids_)
    if (::ptrace(PTRACE_DETACH, tid, nullptr, nullptr) != 0 && errno != ESRCH && st.ok())
      st = Status::Errno(errno, "detaching thread {} of pid {}", tid, pid_);
  tids_.clear();
  return st;
}

Status ThreadFreeze::Release() {
  if (tids_.empty()) return Status::Ok();
  Status st;
  for (pid_t tid : tids_)
    if (::ptrace(PTRACE_DETACH, tid, nullptr, nullptr) != 0 && errno != ESRCH && st.ok())
      st = Status::Errno(errno, "releasing thread {} of pid {}", tid, pid_);
  tids_.clear();
  if (::kill(pid_, SIGCONT) != 0 && errno != ESRCH && st.ok()) st = Status::Errno(errno, "continuing pid {}", pid_);
  return st;
}

Status Continue(pid_t pid) {
  if (::kill(pid, SIGCONT) != 0) return Status::Errno(errno, "continuing pid {}", pid);
  return Status::Ok();
}

}  // namespace gpusnap::ns
