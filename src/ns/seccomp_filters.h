// The seccomp filters that bind a thread, as the kernel hands them to a
// tracer (PTRACE_SECCOMP_GET_FILTER): what a restore compares between a
// placeholder's init, a snapshot's threads and the threads it restored
// (snapshot/privilege.h). /proc shows only how many there are.
//
// The thread is seized, stopped for the reading, and let go as it was: a
// running thread runs on, one in group-stop (a restored task CRIU left
// stopped) stays stopped. The calling thread is the tracer for that time.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::ns {

// Each filter's BPF program (its struct sock_filter array), newest first;
// none for a thread without filters. Errors name the thread: kNotFound when
// it is gone; the ptrace errno otherwise (EPERM without CAP_SYS_ADMIN, or
// when gpusnap itself runs under seccomp).
Result<std::vector<std::string>> ReadSeccompFilters(pid_t tid);

}  // namespace gpusnap::ns
