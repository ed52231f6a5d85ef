/* A CUDA driver-API workload that reaches the driver exactly as cudart does:
 * dlopen("libcuda.so.1"), dlsym of cuGetProcAddress_v2 only, and every other
 * entry point fetched through cuGetProcAddress_v2. That is the path the
 * gpushare shim has to intercept. It runs against tests/fakes/libcuda, where
 * "device memory" is host memory and a kernel is a host function (the kernel
 * here is one; a real driver would need a module).
 *
 * It allocates with cuMemAlloc_v2 buffers above and below 2 MiB plus one that
 * must stay all zero, fills them with a pattern seeded by buffer index, then
 * every interval launches a kernel adding 1 to the first word of each
 * patterned buffer and reads the buffers back to check pattern and counter.
 * Each step prints "step N counter C sum S"; any wrong byte prints
 * "MISMATCH ..." and any driver error "CUDA error <fn> <code>", then exit 1.
 * SIGTERM exits 0.
 *
 * The whole of every buffer is checked at the first step, every
 * --full-every steps, and after any pause much longer than the interval (a
 * checkpoint and restore); the other steps check the first and last 64 KiB
 * and a 1 MiB window that walks through each buffer.
 *
 * usage: vmm_worker [--device N] [--mib A,B,...] [--zero-mib Z] [--alloc plain|vmm]
 *                   [--interval-ms I] [--steps N] [--full-every K] [--device-file PATH]
 *                   [--step-on-signal] [--vmm-probe]
 * --step-on-signal: after the first step, take each next one only on a
 * SIGUSR1 (one step per signal): between two, its device memory stays as it
 * is, as an idle server's does, and a test changes it by asking for a step.
 * --device-file: a file it maps shared, as a CUDA process maps /dev/nvidia*;
 * the GPU-less tests give a stand-in so gpusnap takes it for a GPU process.
 * --alloc vmm: map every buffer of 2 MiB or more itself (cuMemAddressReserve,
 * cuMemCreate, cuMemMap, cuMemSetAccess), as the gpushare shim does in place
 * of cuMemAlloc_v2, so a checkpoint sees that kind of memory without the shim.
 * --vmm-probe: instead, drive the VMM calls (reserve, create, map, access,
 * export/import, unmap, re-reserve at the same address) and print "vmm-probe ok".
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

#define MIB ((size_t)1 << 20)
#define CHECK_EDGE (64 * 1024)
#define CHECK_WINDOW MIB
#define CHUNK (4 * MIB)
#define MAX_BUFFERS 64

/* The driver, as fetched through cuGetProcAddress_v2. */
static struct {
  GetProcAddressFn GetProcAddress_v2;
  CUresult (*Init)(unsigned);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*MemsetD8)(CUdeviceptr, unsigned char, size_t);
  CUresult (*StreamCreate)(CUstream *, unsigned);
  CUresult (*StreamSynchronize)(CUstream);
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                           CUstream, void **, void **);
  /* --vmm-probe only */
  CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
  CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*MemAddressFree)(CUdeviceptr, size_t);
  CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle);
  CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*MemUnmap)(CUdeviceptr, size_t);
  CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
  CUresult (*MemHostAlloc)(void **, size_t, unsigned);
  CUresult (*MemFreeHost)(void *);
  CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
  CUresult (*MemGetInfo)(size_t *, size_t *);
} cu;

static volatile sig_atomic_t stop_requested;

static volatile sig_atomic_t steps_asked; /* --step-on-signal: SIGUSR1s not yet answered by a step */

static void on_sigusr1(int sig) {
  (void)sig;
  steps_asked++;
}

/* Waits for a SIGUSR1 (or SIGTERM) with SIGUSR1 unblocked only here, so no
 * signal slips in between the check and the wait. */
static void wait_for_step_signal(const sigset_t *unblocked) {
  while (!stop_requested && steps_asked == 0) sigsuspend(unblocked);
  if (steps_asked > 0) steps_asked--;
}

static void on_sigterm(int sig) {
  (void)sig;
  stop_requested = 1;
}

#define FETCH(field) fetch_entry(cu.GetProcAddress_v2, "cu" #field, (void **)&cu.field)

static void load_driver(int vmm) {
  /* vmm: also the VMM calls, for --vmm-probe and --alloc vmm. */
  cu.GetProcAddress_v2 = open_driver();
  FETCH(Init);
  FETCH(DevicePrimaryCtxRetain);
  FETCH(CtxSetCurrent);
  FETCH(MemAlloc);
  FETCH(MemFree);
  FETCH(MemcpyHtoD);
  FETCH(MemcpyDtoH);
  FETCH(MemsetD8);
  FETCH(StreamCreate);
  FETCH(StreamSynchronize);
  FETCH(LaunchKernel);
  if (!vmm) return;
  FETCH(MemGetAllocationGranularity);
  FETCH(MemAddressReserve);
  FETCH(MemAddressFree);
  FETCH(MemCreate);
  FETCH(MemRelease);
  FETCH(MemMap);
  FETCH(MemUnmap);
  FETCH(MemSetAccess);
  FETCH(MemExportToShareableHandle);
  FETCH(MemImportFromShareableHandle);
  FETCH(MemHostAlloc);
  FETCH(MemFreeHost);
  FETCH(MemcpyDtoHAsync);
  FETCH(MemcpyHtoDAsync);
  FETCH(MemsetD8Async);
  FETCH(MemGetInfo);
}

/* Word `word` of patterned buffer `buffer`, before any kernel ran. */
static uint32_t pattern(unsigned buffer, size_t word) {
  uint64_t x = ((uint64_t)(buffer + 1) << 40) ^ (uint64_t)word;
  x *= 0x9e3779b97f4a7c15ull;
  return (uint32_t)(x >> 32);
}

static void fill_pattern(uint32_t *words, unsigned buffer, size_t first_word, size_t count) {
  for (size_t i = 0; i < count; i++) words[i] = pattern(buffer, first_word + i);
}

struct buffer {
  CUdeviceptr ptr;
  size_t bytes;
  int zero;      /* must stay all zero */
  size_t mapped; /* --alloc vmm: the length of its reservation and mapping; 0: cuMemAlloc_v2 */
  CUmemGenericAllocationHandle handle;
};

static struct buffer buffers[MAX_BUFFERS];
static unsigned buffer_count;
static uint32_t *scratch; /* CHUNK bytes of host memory */

/* The kernel, a host function under the fake driver: adds 1 to the first
 * word of each buffer in a table that lives in device memory. */
static void add_one_kernel(void **params) {
  const CUdeviceptr *table = (const CUdeviceptr *)(uintptr_t)(*(CUdeviceptr *)params[0]);
  unsigned count = *(unsigned *)params[1];
  for (unsigned i = 0; i < count; i++) ((uint32_t *)(uintptr_t)table[i])[0] += 1;
}

static void mismatch(long step, unsigned b, size_t offset, uint32_t expected, uint32_t got) {
  printf("MISMATCH step %ld buffer %u (%zu bytes%s) offset %zu expected 0x%08x got 0x%08x\n", step, b,
         buffers[b].bytes, buffers[b].zero ? ", zero" : "", offset, expected, got);
  fflush(stdout);
  exit(1);
}

/* Reads [offset, offset + len) of buffer b back and compares it word by word. */
static void check_range(long step, unsigned b, size_t offset, size_t len, uint32_t counter) {
  size_t end = offset + len;
  if (end > buffers[b].bytes) end = buffers[b].bytes;
  offset &= ~(size_t)3;
  while (offset < end) {
    size_t n = end - offset < CHUNK ? end - offset : CHUNK;
    CU(cu.MemcpyDtoH(scratch, buffers[b].ptr + offset, n), "cuMemcpyDtoH_v2");
    for (size_t i = 0; i < n / 4; i++) {
      size_t word = offset / 4 + i;
      uint32_t expected = buffers[b].zero ? 0 : pattern(b, word) + (word == 0 ? counter : 0);
      if (scratch[i] != expected) mismatch(step, b, offset + i * 4, expected, scratch[i]);
    }
    offset += n;
  }
}

static void check_buffers(long step, uint32_t counter, int full) {
  for (unsigned b = 0; b < buffer_count; b++) {
    size_t bytes = buffers[b].bytes;
    if (full || bytes <= 2 * CHECK_EDGE + CHECK_WINDOW) {
      check_range(step, b, 0, bytes, counter);
      continue;
    }
    check_range(step, b, 0, CHECK_EDGE, counter);
    check_range(step, b, bytes - CHECK_EDGE, CHECK_EDGE, counter);
    size_t windows = bytes / CHECK_WINDOW;
    check_range(step, b, ((size_t)step % windows) * CHECK_WINDOW, CHECK_WINDOW, counter);
  }
}

static long long now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (!stop_requested && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static CUmemAllocationProp device_prop(int device) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = 1;
  prop.requestedHandleTypes = 1;
  prop.location.type = 1;
  prop.location.id = device;
  return prop;
}

static void allocate(struct buffer *b, int vmm, int device) {
  if (!vmm || b->bytes < 2 * MIB) {
    CU(cu.MemAlloc(&b->ptr, b->bytes), "cuMemAlloc_v2");
    return;
  }
  CUmemAllocationProp prop = device_prop(device);
  CUmemAccessDesc access = {{1, device}, 3};
  size_t gran = 0;
  CU(cu.MemGetAllocationGranularity(&gran, &prop, 0), "cuMemGetAllocationGranularity");
  b->mapped = (b->bytes + gran - 1) / gran * gran;
  CU(cu.MemAddressReserve(&b->ptr, b->mapped, 0, 0, 0), "cuMemAddressReserve");
  CU(cu.MemCreate(&b->handle, b->mapped, &prop, 0), "cuMemCreate");
  CU(cu.MemMap(b->ptr, b->mapped, 0, b->handle, 0), "cuMemMap");
  CU(cu.MemSetAccess(b->ptr, b->mapped, &access, 1), "cuMemSetAccess");
}

static void release(struct buffer *b) {
  if (b->mapped == 0) {
    CU(cu.MemFree(b->ptr), "cuMemFree_v2");
    return;
  }
  CU(cu.MemUnmap(b->ptr, b->mapped), "cuMemUnmap");
  CU(cu.MemRelease(b->handle), "cuMemRelease");
  CU(cu.MemAddressFree(b->ptr, b->mapped), "cuMemAddressFree");
}

static void usage(void) {
  fprintf(stderr,
          "usage: vmm_worker [--device N] [--mib A,B,...] [--zero-mib Z] [--alloc plain|vmm] [--interval-ms I]\n"
          "                  [--steps N] [--full-every K] [--device-file PATH] [--step-on-signal] [--vmm-probe]\n");
  exit(2);
}

static void expect(int ok, const char *what) {
  if (ok) return;
  printf("vmm-probe FAILED: %s\n", what);
  fflush(stdout);
  exit(1);
}

/* The VMM life cycle the shim drives at checkpoint and restore, with the
 * driver's answers checked at each step. */
static int vmm_probe(int device) {
  const size_t gran_expected = 2 * MIB;
  CUmemAllocationProp prop = device_prop(device);
  CUmemAccessDesc access = {{1, device}, 3};
  size_t gran = 0;
  CU(cu.MemGetAllocationGranularity(&gran, &prop, 0), "cuMemGetAllocationGranularity");
  expect(gran == gran_expected, "granularity is 2 MiB");

  size_t half = 2 * gran, whole = 2 * half;
  CUdeviceptr base = 0;
  CU(cu.MemAddressReserve(&base, whole, 0, 0, 0), "cuMemAddressReserve");
  expect(base % gran == 0, "reservation aligned");
  CUmemGenericAllocationHandle h = 0, imported = 0;
  CU(cu.MemCreate(&h, half, &prop, 0), "cuMemCreate");
  CU(cu.MemMap(base, half, 0, h, 0), "cuMemMap");
  expect(cu.MemcpyDtoH(scratch, base, 4) != 0, "copy from a mapping without access fails");
  CU(cu.MemSetAccess(base, half, &access, 1), "cuMemSetAccess");
  fill_pattern(scratch, 0, 0, half / 4);
  CU(cu.MemcpyHtoD(base, scratch, half), "cuMemcpyHtoD_v2");

  /* The same memory through an exported and imported handle. */
  int fd = -1;
  CU(cu.MemExportToShareableHandle(&fd, h, 1, 0), "cuMemExportToShareableHandle");
  CU(cu.MemImportFromShareableHandle(&imported, (void *)(uintptr_t)fd, 1), "cuMemImportFromShareableHandle");
  CU(cu.MemMap(base + half, half, 0, imported, 0), "cuMemMap");
  CU(cu.MemSetAccess(base + half, half, &access, 1), "cuMemSetAccess");
  memset(scratch, 0, half);
  CU(cu.MemcpyDtoH(scratch, base + half, half), "cuMemcpyDtoH_v2");
  for (size_t i = 0; i < half / 4; i++) expect(scratch[i] == pattern(0, i), "imported handle shows the same memory");

  /* Checkpoint: out to pinned host memory, then the memory goes. */
  void *saved = NULL;
  CUstream stream = NULL;
  CU(cu.StreamCreate(&stream, 1), "cuStreamCreate");
  CU(cu.MemHostAlloc(&saved, half, 1), "cuMemHostAlloc");
  CU(cu.MemcpyDtoHAsync(saved, base, half, stream), "cuMemcpyDtoHAsync_v2");
  CU(cu.StreamSynchronize(stream), "cuStreamSynchronize");
  CU(cu.MemUnmap(base, whole), "cuMemUnmap");
  CU(cu.MemRelease(h), "cuMemRelease");
  CU(cu.MemRelease(imported), "cuMemRelease");
  expect(cu.MemcpyDtoH(scratch, base, 4) == 1, "copy from unmapped memory fails with CUDA_ERROR_INVALID_VALUE");
  size_t free_bytes = 0, total = 0;
  CU(cu.MemGetInfo(&free_bytes, &total), "cuMemGetInfo_v2");
  expect(free_bytes == total, "released memory is free again");

  /* Restore: a new reservation at the same address, refilled. */
  CU(cu.MemAddressFree(base, whole), "cuMemAddressFree");
  CUdeviceptr again = 0;
  CU(cu.MemAddressReserve(&again, whole, 0, base, 0), "cuMemAddressReserve");
  expect(again == base, "the address hint is honoured");
  CU(cu.MemCreate(&h, whole, &prop, 0), "cuMemCreate");
  CU(cu.MemMap(base, whole, 0, h, 0), "cuMemMap");
  CU(cu.MemSetAccess(base, whole, &access, 1), "cuMemSetAccess");
  CU(cu.MemsetD8Async(base + half, 0, half, stream), "cuMemsetD8Async");
  CU(cu.MemcpyHtoDAsync(base, saved, half, stream), "cuMemcpyHtoDAsync_v2");
  CU(cu.StreamSynchronize(stream), "cuStreamSynchronize");
  CU(cu.MemcpyDtoH(scratch, base, whole), "cuMemcpyDtoH_v2");
  for (size_t i = 0; i < half / 4; i++) expect(scratch[i] == pattern(0, i), "restored contents");
  for (size_t i = half / 4; i < whole / 4; i++) expect(scratch[i] == 0, "zeroed half");
  CU(cu.MemUnmap(base, whole), "cuMemUnmap");
  CU(cu.MemRelease(h), "cuMemRelease");
  CU(cu.MemAddressFree(base, whole), "cuMemAddressFree");
  CU(cu.MemFreeHost(saved), "cuMemFreeHost");
  printf("vmm-probe ok\n");
  fflush(stdout);
  return 0;
}

int main(int argc, char **argv) {
  int device = 0, probe = 0, vmm = 0, step_on_signal = 0;
  long interval_ms = 50, steps = -1, full_every = 100;
  const char *mib_list = "70,130,3,1", *device_file = NULL;
  long zero_mib = 64;
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
    if (strcmp(arg, "--vmm-probe") == 0) {
      probe = 1;
      continue;
    }
    if (strcmp(arg, "--step-on-signal") == 0) {
      step_on_signal = 1;
      continue;
    }
    if (val == NULL) usage();
    if (strcmp(arg, "--device") == 0) device = atoi(val);
    else if (strcmp(arg, "--mib") == 0) mib_list = val;
    else if (strcmp(arg, "--zero-mib") == 0) zero_mib = atol(val);
    else if (strcmp(arg, "--interval-ms") == 0) interval_ms = atol(val);
    else if (strcmp(arg, "--steps") == 0) steps = atol(val);
    else if (strcmp(arg, "--full-every") == 0) full_every = atol(val);
    else if (strcmp(arg, "--device-file") == 0) device_file = val;
    else if (strcmp(arg, "--alloc") == 0 && (strcmp(val, "vmm") == 0 || strcmp(val, "plain") == 0))
      vmm = strcmp(val, "vmm") == 0;
    else usage();
    i++;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigterm;
  sigaction(SIGTERM, &sa, NULL);
  sa.sa_handler = on_sigusr1;
  sigaction(SIGUSR1, &sa, NULL);
  /* SIGUSR1 stays blocked (in every thread, which inherit the mask) but while
   * the main thread waits for it. */
  sigset_t usr1, unblocked;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  sigprocmask(SIG_BLOCK, &usr1, &unblocked);
  sigdelset(&unblocked, SIGUSR1);
  setvbuf(stdout, NULL, _IOLBF, 0);

  if (device_file != NULL && map_device_file(device_file) != 0) return 1;
  pthread_t helper;
  if (pthread_create(&helper, NULL, driver_thread_stand_in, NULL) != 0) {
    printf("cannot start a thread\n");
    return 1;
  }
  scratch = malloc(CHUNK > 8 * MIB ? CHUNK : 8 * MIB);
  if (scratch == NULL) return 1;
  load_driver(probe || vmm);
  CU(cu.Init(0), "cuInit");
  CUcontext ctx = NULL;
  CU(cu.DevicePrimaryCtxRetain(&ctx, device), "cuDevicePrimaryCtxRetain");
  CU(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");
  if (probe) return vmm_probe(device);

  /* The buffers, each filled by cuMemcpyHtoD_v2 from host memory. */
  for (const char *p = mib_list; *p != 0 && buffer_count < MAX_BUFFERS - 1;) {
    char *end;
    long mib = strtol(p, &end, 10);
    if (end == p || mib <= 0) usage();
    buffers[buffer_count++].bytes = (size_t)mib * MIB;
    p = *end == ',' ? end + 1 : end;
  }
  if (zero_mib > 0) {
    buffers[buffer_count].bytes = (size_t)zero_mib * MIB;
    buffers[buffer_count++].zero = 1;
  }
  for (unsigned b = 0; b < buffer_count; b++) {
    allocate(&buffers[b], vmm, device);
    if (buffers[b].zero) {
      /* Neither cuMemAlloc nor cuMemCreate promises zeros. */
      CU(cu.MemsetD8(buffers[b].ptr, 0, buffers[b].bytes), "cuMemsetD8_v2");
      continue;
    }
    for (size_t off = 0; off < buffers[b].bytes; off += CHUNK) {
      size_t n = buffers[b].bytes - off < CHUNK ? buffers[b].bytes - off : CHUNK;
      fill_pattern(scratch, b, off / 4, n / 4);
      CU(cu.MemcpyHtoD(buffers[b].ptr + off, scratch, n), "cuMemcpyHtoD_v2");
    }
  }
  /* The kernel's argument: a table of the patterned buffers, in device memory. */
  CUdeviceptr host_table[MAX_BUFFERS];
  unsigned patterned = 0;
  for (unsigned b = 0; b < buffer_count; b++)
    if (!buffers[b].zero) host_table[patterned++] = buffers[b].ptr;
  CUdeviceptr table = 0;
  CU(cu.MemAlloc(&table, sizeof host_table), "cuMemAlloc_v2");
  CU(cu.MemcpyHtoD(table, host_table, sizeof host_table), "cuMemcpyHtoD_v2");
  CUstream stream = NULL;
  CU(cu.StreamCreate(&stream, 1), "cuStreamCreate");

  uint32_t counter = 0;
  long long last = now_ms();
  for (long step = 1; !stop_requested && (steps < 0 || step <= steps); step++) {
    void *params[] = {&table, &patterned};
    CU(cu.LaunchKernel((CUfunction)(uintptr_t)add_one_kernel, 1, 1, 1, 1, 1, 1, 0, stream, params, NULL),
       "cuLaunchKernel");
    CU(cu.StreamSynchronize(stream), "cuStreamSynchronize");
    counter++;
    long long now = now_ms();
    int after_pause = now - last > 20 * interval_ms + 1000;
    check_buffers(step, counter, step == 1 || after_pause || (full_every > 0 && step % full_every == 0));
    uint64_t sum = 0;
    for (unsigned b = 0; b < buffer_count; b++)
      if (!buffers[b].zero) sum += (uint64_t)(uint32_t)(pattern(b, 0) + counter);
    printf("step %ld counter %u sum %llu\n", step, counter, (unsigned long long)sum);
    fflush(stdout);
    last = now_ms();
    if (steps >= 0 && step >= steps) continue;
    if (step_on_signal) wait_for_step_signal(&unblocked);
    else sleep_ms(interval_ms);
  }
  for (unsigned b = 0; b < buffer_count; b++) release(&buffers[b]);
  CU(cu.MemFree(table), "cuMemFree_v2");
  return 0;
}
