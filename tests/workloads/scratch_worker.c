/* A workload that marks part of its device memory scratch through the
 * gpushare shim (gpusnap/gpushare_scratch.h), as an inference server marks
 * its KV-cache pool. It reaches the driver as vmm_worker does (dlopen,
 * cuGetProcAddress_v2) and the shim's call through dlsym(RTLD_DEFAULT, ...),
 * as a program that does not link against the shim finds it.
 *
 * It allocates with cuMemAlloc_v2 a buffer to keep (--keep-mib), a scratch
 * buffer (--scratch-mib) and 1 MiB (below the shim's threshold: the driver's),
 * fills the first two with patterns and marks the scratch one. Before that it
 * tries the marks that must fail and prints
 *   "bad-mark small <rc> bogus <rc> empty <rc>"
 * (the 1 MiB allocation, an address that is no allocation, zero bytes), then
 *   "marked <rc> keep 0x<addr> scratch 0x<addr>".
 * Every step it reads both buffers back in full: the kept one must hold its
 * pattern; the scratch one its pattern of generation G, or zero (its memory
 * came back from a checkpoint; from some 4 MiB piece of the read on when the
 * checkpoint came during the read). Zero, it prints
 *   "scratch zeroed at step N 0x<addr> loads L"
 * (L: gpusnap_gpushare_loads()) and writes the pattern of the next
 * generation into it. Each step prints
 * "step N gen G"; a wrong byte prints "MISMATCH ..." and exits 1, a driver
 * error "CUDA error <fn> <code>". SIGTERM exits 0.
 *
 * usage: scratch_worker [--keep-mib K] [--scratch-mib S] [--interval-ms I] [--device-file PATH]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "driver_api.h"
#include "gpusnap/gpushare_scratch.h"

#define MIB ((size_t)1 << 20)
#define PIECE (4 * MIB)

static struct {
  CUresult (*Init)(unsigned);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
} cu;

static volatile sig_atomic_t stop_requested;
static uint32_t *host; /* PIECE bytes */

static void on_sigterm(int sig) {
  (void)sig;
  stop_requested = 1;
}

/* Word `word` of the pattern `seed`. */
static uint32_t pattern(unsigned seed, size_t word) {
  uint64_t x = ((uint64_t)(seed + 1) << 40) ^ (uint64_t)word;
  x *= 0x9e3779b97f4a7c15ull;
  return (uint32_t)(x >> 32);
}

static void fill(CUdeviceptr ptr, size_t bytes, unsigned seed) {
  for (size_t off = 0; off < bytes; off += PIECE) {
    size_t n = bytes - off < PIECE ? bytes - off : PIECE;
    for (size_t i = 0; i < n / 4; i++) host[i] = pattern(seed, off / 4 + i);
    CU(cu.MemcpyHtoD(ptr + off, host, n), "cuMemcpyHtoD_v2");
  }
}

/* 1: the buffer holds pattern `seed`; 0: it is zero from some piece on
 * (only if zero_ok). Else exits. A checkpoint may come between any two GPU
 * calls of the process, so between two pieces of one check: what reads
 * pattern up to a piece may read zero from it on. */
static int check(long step, const char *name, CUdeviceptr ptr, size_t bytes, unsigned seed, int zero_ok) {
  int zero = 0;
  for (size_t off = 0; off < bytes; off += PIECE) {
    size_t n = bytes - off < PIECE ? bytes - off : PIECE;
    CU(cu.MemcpyDtoH(host, ptr + off, n), "cuMemcpyDtoH_v2");
    if (zero_ok && !zero && host[0] == 0 && pattern(seed, off / 4) != 0) zero = 1;
    for (size_t i = 0; i < n / 4; i++) {
      uint32_t want = pattern(seed, off / 4 + i);
      if (zero ? host[i] == 0 : host[i] == want) continue;
      printf("MISMATCH step %ld %s offset %zu expected 0x%08x got 0x%08x\n", step, name, off + i * 4,
             zero ? 0 : want, host[i]);
      fflush(stdout);
      exit(1);
    }
  }
  return !zero;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (!stop_requested && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void usage(void) {
  fprintf(stderr, "usage: scratch_worker [--keep-mib K] [--scratch-mib S] [--interval-ms I] [--device-file PATH]\n");
  exit(2);
}

int main(int argc, char **argv) {
  long keep_mib = 70, scratch_mib = 130, interval_ms = 20;
  const char *device_file = NULL;
  for (int i = 1; i < argc; i += 2) {
    const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (val == NULL) usage();
    if (strcmp(arg, "--keep-mib") == 0) keep_mib = atol(val);
    else if (strcmp(arg, "--scratch-mib") == 0) scratch_mib = atol(val);
    else if (strcmp(arg, "--interval-ms") == 0) interval_ms = atol(val);
    else if (strcmp(arg, "--device-file") == 0) device_file = val;
    else usage();
  }
  if (keep_mib < 2 || scratch_mib < 2) usage();
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigterm;
  sigaction(SIGTERM, &sa, NULL);
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (device_file != NULL && map_device_file(device_file) != 0) return 1;
  pthread_t helper;
  if (pthread_create(&helper, NULL, driver_thread_stand_in, NULL) != 0) return 1;
  host = malloc(PIECE);
  if (host == NULL) return 1;

  GetProcAddressFn get = open_driver();
  fetch_entry(get, "cuInit", (void **)&cu.Init);
  fetch_entry(get, "cuDevicePrimaryCtxRetain", (void **)&cu.DevicePrimaryCtxRetain);
  fetch_entry(get, "cuCtxSetCurrent", (void **)&cu.CtxSetCurrent);
  fetch_entry(get, "cuMemAlloc", (void **)&cu.MemAlloc);
  fetch_entry(get, "cuMemFree", (void **)&cu.MemFree);
  fetch_entry(get, "cuMemcpyHtoD", (void **)&cu.MemcpyHtoD);
  fetch_entry(get, "cuMemcpyDtoH", (void **)&cu.MemcpyDtoH);
  CU(cu.Init(0), "cuInit");
  CUcontext ctx = NULL;
  CU(cu.DevicePrimaryCtxRetain(&ctx, 0), "cuDevicePrimaryCtxRetain");
  CU(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");

  size_t keep_bytes = (size_t)keep_mib * MIB, scratch_bytes = (size_t)scratch_mib * MIB;
  CUdeviceptr keep = 0, scratch = 0, small = 0;
  CU(cu.MemAlloc(&keep, keep_bytes), "cuMemAlloc_v2");
  CU(cu.MemAlloc(&scratch, scratch_bytes), "cuMemAlloc_v2");
  CU(cu.MemAlloc(&small, MIB), "cuMemAlloc_v2");
  unsigned gen = 0;
  fill(keep, keep_bytes, 1000);
  fill(scratch, scratch_bytes, gen);

  void *sym = dlsym(RTLD_DEFAULT, GPUSNAP_GPUSHARE_MARK_SCRATCH);
  if (sym == NULL) {
    printf("no %s: is the gpushare shim preloaded?\n", GPUSNAP_GPUSHARE_MARK_SCRATCH);
    return 1;
  }
  gpusnap_gpushare_mark_scratch_fn mark;
  memcpy(&mark, &sym, sizeof sym);
  gpusnap_gpushare_loads_fn loads = NULL;
  sym = dlsym(RTLD_DEFAULT, GPUSNAP_GPUSHARE_LOADS);
  if (sym == NULL) {
    printf("no %s\n", GPUSNAP_GPUSHARE_LOADS);
    return 1;
  }
  memcpy(&loads, &sym, sizeof sym);
  printf("bad-mark small %d bogus %d empty %d\n", mark(small, MIB), mark(0x10000, 4096), mark(scratch, 0));
  printf("marked %d keep 0x%llx scratch 0x%llx\n", mark(scratch, scratch_bytes), keep, scratch);

  for (long step = 1; !stop_requested; step++) {
    check(step, "keep", keep, keep_bytes, 1000, 0);
    if (!check(step, "scratch", scratch, scratch_bytes, gen, 1)) {
      printf("scratch zeroed at step %ld 0x%llx loads %llu\n", step, scratch, loads());
      fill(scratch, scratch_bytes, ++gen);
    }
    printf("step %ld gen %u\n", step, gen);
    sleep_ms(interval_ms);
  }
  CU(cu.MemFree(keep), "cuMemFree_v2");
  CU(cu.MemFree(scratch), "cuMemFree_v2");
  CU(cu.MemFree(small), "cuMemFree_v2");
  return 0;
}
