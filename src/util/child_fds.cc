#include "util/child_fds.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace gpusnap {

void DetachStdio(int output, std::initializer_list<int> keep) {
  int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) ::dup2(null, 0);
  int out = output >= 0 ? output : null;
  if (out >= 0) {
    ::dup2(out, 1);
    ::dup2(out, 2);
  }
  ::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
  for (int fd : keep)
    if (fd >= 0) ::fcntl(fd, F_SETFD, 0);
}

}  // namespace gpusnap
