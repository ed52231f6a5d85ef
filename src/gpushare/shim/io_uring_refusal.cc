// io_uring is refused inside a process that loads the shim.
//
// CRIU cannot checkpoint an io_uring instance, and the processes of a
// PyTorch job create one without asking: libuv, which PyTorch's TCPStore
// runs on (torchrun's rendezvous store included), sets up rings for its event
// loop on kernels that have them. libuv reaches the kernel through libc's
// syscall(), and when io_uring_setup fails it runs on epoll alone, which CRIU
// takes. So the shim answers io_uring_setup with ENOSYS, as a kernel built
// without io_uring would, and passes every other call on unchanged. Callers
// that issue the system call themselves (liburing's own syscall stubs) are not
// seen here; gpusnap checkpoint names their rings (snapshot/checkpointable.h).
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

#include "gpushare/shim/real_driver.h"

namespace {

using SyscallFn = long (*)(long, long, long, long, long, long, long);

SyscallFn RealSyscall() {
  static SyscallFn real = reinterpret_cast<SyscallFn>(gpusnap::gpushare::shim::RealDlsym(RTLD_NEXT, "syscall"));
  return real;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) long syscall(long number, ...) {
  // syscall() takes up to six arguments after the number and cannot tell how
  // many it was given; like libc's own, this one reads six and the kernel
  // uses what the call needs.
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (long& arg : a) arg = va_arg(ap, long);
  va_end(ap);
  if (number == SYS_io_uring_setup) {
    errno = ENOSYS;
    return -1;
  }
  SyscallFn real = RealSyscall();
  if (real == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
