/* The CUDA driver API as the test workloads reach it: the types they pass
 * (no cuda.h needed, so they build where there is no toolkit), and the one
 * way they find entry points, the way cudart does: dlopen("libcuda.so.1"),
 * dlsym of cuGetProcAddress_v2 only, everything else fetched through it. */
#ifndef GPUSNAP_TESTS_WORKLOADS_DRIVER_API_H
#define GPUSNAP_TESTS_WORKLOADS_DRIVER_API_H

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUfunction;

typedef struct {
  int type; /* CU_MEM_ALLOCATION_TYPE_PINNED = 1 */
  int requestedHandleTypes; /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1 */
  struct {
    int type; /* CU_MEM_LOCATION_TYPE_DEVICE = 1 */
    int id;
  } location;
  void *win32HandleMetaData;
  unsigned char allocFlags[8];
} CUmemAllocationProp;

typedef struct {
  struct {
    int type;
    int id;
  } location;
  int flags; /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3 */
} CUmemAccessDesc;

#define CUDA_VERSION_ASKED 12080 /* what a CUDA 12.8 cudart passes */

typedef CUresult (*GetProcAddressFn)(const char *, void **, int, unsigned long long, int *);

/* Prints "CUDA error <fn> <code>" (what the tests look for) and exits 1. */
static void die_cuda(const char *fn, CUresult rc) {
  printf("CUDA error %s %d\n", fn, rc);
  fflush(stdout);
  exit(1);
}

#define CU(call, fn)                 \
  do {                               \
    CUresult rc_ = (call);           \
    if (rc_ != 0) die_cuda(fn, rc_); \
  } while (0)

/* cuGetProcAddress_v2 of libcuda.so.1; exits 1 when there is none. */
static GetProcAddressFn open_driver(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    printf("CUDA error dlopen %s\n", dlerror());
    exit(1);
  }
  void *entry = dlsym(lib, "cuGetProcAddress_v2");
  GetProcAddressFn fn;
  memcpy(&fn, &entry, sizeof entry);
  if (fn == NULL) {
    printf("CUDA error dlsym cuGetProcAddress_v2 %s\n", dlerror());
    exit(1);
  }
  return fn;
}

/* One entry point into *slot, through `get`; exits 1 when the driver has none. */
static void fetch_entry(GetProcAddressFn get, const char *name, void **slot) {
  int status = -1;
  CUresult rc = get(name, slot, CUDA_VERSION_ASKED, 0, &status);
  if (rc != 0 || *slot == NULL) {
    printf("CUDA error cuGetProcAddress_v2(%s) %d status %d\n", name, rc, status);
    fflush(stdout);
    exit(1);
  }
}

/* A CUDA process always has the driver's own threads, and gpusnap picks the
 * driver's restore thread among them; the fake driver starts none, so this
 * one stands in. It blocks every signal: SIGTERM goes to the main thread, to
 * end its sleep. */
static inline void *driver_thread_stand_in(void *arg) {
  (void)arg;
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  for (;;) pause();
  return NULL;
}

/* --device-file: a shared mapping of `path`, as a CUDA process maps the
 * driver's device files. 0, or 1 after saying why on stdout. */
static inline int map_device_file(const char *path) {
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0 || mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED) {
    printf("cannot map %s: %s\n", path, strerror(errno));
    return 1;
  }
  return 0;
}

#endif
