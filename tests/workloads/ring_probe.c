/* A process that, like libuv's event loop, asks the kernel for an io_uring
 * instance through libc's syscall() and keeps it (fd open, rings mapped) when
 * it gets one, else goes on without. Then it counts: "step N" every 20 ms.
 * Its first line says which: "io_uring: fd N" or "io_uring: refused (why)".
 *
 * usage: ring_probe
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/io_uring.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int main(void) {
  struct io_uring_params params;
  memset(&params, 0, sizeof params);
  long fd = syscall(SYS_io_uring_setup, 8, &params);
  if (fd >= 0) {
    size_t bytes = params.sq_off.array + params.sq_entries * sizeof(unsigned);
    void *ring = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, (int)fd, IORING_OFF_SQ_RING);
    if (ring == MAP_FAILED) {
      printf("FAIL: mapping the ring: %s\n", strerror(errno));
      return 1;
    }
    printf("io_uring: fd %ld\n", fd);
  } else {
    printf("io_uring: refused (%s)\n", strerror(errno));
  }
  fflush(stdout);
  for (long step = 0;; step++) {
    printf("step %ld\n", step);
    fflush(stdout);
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
  }
}
