/* The CUDA driver API as the test workloads reach it: the types they pass
 * (no cuda.h needed, so they build where there is no toolkit), and the one
 * way they find entry points, the way cudart does: dlopen("libcuda.so.1"),
 * dlsym of cuGetProcAddress_v2 only, everything else fetched through it. */
#ifndef GPUSNAP_TESTS_WORKLOADS_DRIVER_API_H
#define GPUSNAP_TESTS_WORKLOADS_DRIVER_API_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

#endif
