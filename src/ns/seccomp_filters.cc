#include "ns/seccomp_filters.h"

#include <linux/filter.h>
#include <sys/ptrace.h>

#include <vector>

#include "ns/thread_freeze.h"

namespace gpusnap::ns {

Result<std::vector<std::string>> ReadSeccompFilters(pid_t tid) {
  if (::ptrace(PTRACE_SEIZE, tid, nullptr, nullptr) != 0)
    return errno == ESRCH ? Status::Error(Code::kNotFound, "no thread {}", tid)
                          : Status::Errno(errno, "seizing thread {} to read its seccomp filters", tid);
  ::ptrace(PTRACE_INTERRUPT, tid, nullptr, nullptr);
  Result<std::vector<std::string>> out = std::vector<std::string>();
  if (Status stopped = WaitStopped(tid); !stopped.ok()) {
    out = stopped;
  } else {
    std::vector<sock_filter> program(BPF_MAXINSNS);
    for (unsigned long index = 0;; ++index) {
      long n = ::ptrace(PTRACE_SECCOMP_GET_FILTER, tid, index, program.data());
      if (n < 0 && errno == ENOENT) break;  // past the oldest, or no filter at all
      if (n < 0) {
        out = Status::Errno(errno, "reading seccomp filter {} of thread {}", index, tid);
        break;
      }
      out->emplace_back(reinterpret_cast<const char*>(program.data()), static_cast<size_t>(n) * sizeof(sock_filter));
    }
  }
  // Let go as it was: running, or back into its group-stop.
  ::ptrace(PTRACE_DETACH, tid, nullptr, nullptr);
  return out;
}

}  // namespace gpusnap::ns
