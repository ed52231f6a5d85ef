/* Two processes sharing one piece of device memory, the way tensor-parallel
 * ranks do: the parent (the exporter) allocates it, the child (the importer)
 * maps the same memory, and every step each writes a word the other checks.
 * It reaches the driver as cudart does (dlopen, cuGetProcAddress_v2), so it
 * runs on the fake libcuda in CI and on a real GPU alike; it launches no
 * kernels, only copies.
 *
 * --share ipc: cuMemAlloc_v2 + cuIpcGetMemHandle, the 64-byte handle sent to
 *   the child, which calls cuIpcOpenMemHandle (what cudaIpc* and NCCL's
 *   legacy path do).
 * --share fd: cuMemCreate with a POSIX-fd handle type, mapped by the parent;
 *   the fd from cuMemExportToShareableHandle passed to the child over a unix
 *   socket (SCM_RIGHTS); the child imports and maps it (NCCL's cuMem path).
 *
 * Each step: the parent writes the step number into word 0; the child reads
 * it, checks it, writes 3*step+1 into word 1, and checks the whole pattern
 * (every word from 2 on) at its first step and after any long pause (a
 * checkpoint); the parent checks word 1 and prints
 * "step N counter N sum S" (S: the child's sum of the pattern words it read).
 * A wrong word prints "MISMATCH ...", a driver error "CUDA error <fn> <code>";
 * either exits 1. SIGTERM ends both.
 *
 * usage: share_pair --share ipc|fd [--mib M] [--interval-ms I]
 *                   [--device D] [--importer-device D] [--device-file PATH]
 *                   [--importer-device-file PATH]
 * --device-file: a file each maps shared, as a CUDA process maps /dev/nvidia*
 * (the GPU-less tests give stand-ins, one per process: the fake driver keeps
 * each process's checkpoint state in the one it maps).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "driver_api.h"

typedef struct {
  char reserved[64];
} CUipcMemHandle;

#define MIB ((size_t)1 << 20)

static struct {
  GetProcAddressFn GetProcAddress_v2;
  CUresult (*Init)(unsigned);
  CUresult (*DevicePrimaryCtxRetain)(CUcontext *, CUdevice);
  CUresult (*CtxSetCurrent)(CUcontext);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemcpyHtoD)(CUdeviceptr, const void *, size_t);
  CUresult (*MemcpyDtoH)(void *, CUdeviceptr, size_t);
  CUresult (*CtxSynchronize)(void);
  CUresult (*IpcGetMemHandle)(CUipcMemHandle *, CUdeviceptr);
  CUresult (*IpcOpenMemHandle)(CUdeviceptr *, CUipcMemHandle, unsigned);
  CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, int);
  CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
  CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
  CUresult (*MemRelease)(CUmemGenericAllocationHandle);
  CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*MemExportToShareableHandle)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
  CUresult (*MemImportFromShareableHandle)(CUmemGenericAllocationHandle *, void *, int);
} cu;

#define FETCH(field) fetch_entry(cu.GetProcAddress_v2, "cu" #field, (void **)&cu.field)

static void load_driver(void) {
  cu.GetProcAddress_v2 = open_driver();
  FETCH(Init);
  FETCH(DevicePrimaryCtxRetain);
  FETCH(CtxSetCurrent);
  FETCH(MemAlloc);
  FETCH(MemcpyHtoD);
  FETCH(MemcpyDtoH);
  FETCH(CtxSynchronize);
  FETCH(IpcGetMemHandle);
  FETCH(IpcOpenMemHandle);
  FETCH(MemGetAllocationGranularity);
  FETCH(MemAddressReserve);
  FETCH(MemCreate);
  FETCH(MemRelease);
  FETCH(MemMap);
  FETCH(MemSetAccess);
  FETCH(MemExportToShareableHandle);
  FETCH(MemImportFromShareableHandle);
}

static uint32_t pattern(size_t word) {
  uint64_t x = (0x5eedull << 40) ^ (uint64_t)word;
  x *= 0x9e3779b97f4a7c15ull;
  return (uint32_t)(x >> 32);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void start_gpu(int device, const char *device_file) {
  if (device_file) {
    /* Map it as a CUDA process maps /dev/nvidia*: GPU-less tests pass a stand-in. */
    int fd = open(device_file, O_RDWR);
    if (fd < 0 || mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED) {
      printf("cannot map %s\n", device_file);
      exit(1);
    }
  }
  load_driver();
  CU(cu.Init(0), "cuInit");
  CUcontext ctx;
  CU(cu.DevicePrimaryCtxRetain(&ctx, device), "cuDevicePrimaryCtxRetain");
  CU(cu.CtxSetCurrent(ctx), "cuCtxSetCurrent");
}

static void send_all(int sock, const void *buf, size_t len, int fd) {
  struct iovec iov = {(void *)buf, len};
  char control[CMSG_SPACE(sizeof(int))];
  struct msghdr msg = {0};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    memset(control, 0, sizeof control);
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  if (sendmsg(sock, &msg, 0) != (ssize_t)len) exit(1);
}

/* A whole message (SOCK_SEQPACKET); the fd passed with it, or -1. 0 at the end. */
static ssize_t recv_msg(int sock, void *buf, size_t len, int *fd) {
  struct iovec iov = {buf, len};
  char control[CMSG_SPACE(sizeof(int))];
  struct msghdr msg = {0};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (fd) {
    *fd = -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (n > 0 && c && c->cmsg_type == SCM_RIGHTS) memcpy(fd, CMSG_DATA(c), sizeof *fd);
  }
  return n;
}

static volatile sig_atomic_t stop_requested;
static void on_sigterm(int sig) {
  (void)sig;
  stop_requested = 1;
}

/* The first message: the buffer's size and, for --share ipc, its handle
 * (for --share fd, its fd rides along). */
struct hello {
  uint64_t bytes;
  CUipcMemHandle handle;
};

struct step_msg {
  uint64_t step;
  uint64_t sum;
  uint32_t ok;
};

static size_t granularity(int device) {
  CUmemAllocationProp prop = {0};
  prop.type = 1;
  prop.requestedHandleTypes = 1;
  prop.location.type = 1;
  prop.location.id = device;
  size_t g = 0;
  CU(cu.MemGetAllocationGranularity(&g, &prop, 0), "cuMemGetAllocationGranularity");
  return g;
}

/* Reserves, maps and opens `handle` to `device`: where a VMM object lands. */
static CUdeviceptr map_object(CUmemGenericAllocationHandle handle, size_t bytes, int device) {
  CUdeviceptr va = 0;
  CU(cu.MemAddressReserve(&va, bytes, 0, 0, 0), "cuMemAddressReserve");
  CU(cu.MemMap(va, bytes, 0, handle, 0), "cuMemMap");
  CUmemAccessDesc access = {{1, device}, 3};
  CU(cu.MemSetAccess(va, bytes, &access, 1), "cuMemSetAccess");
  return va;
}

static int run_parent(int sock, int share_fd, size_t bytes, int device, int interval_ms) {
  CUdeviceptr buf = 0;
  if (!share_fd) {
    CU(cu.MemAlloc(&buf, bytes), "cuMemAlloc_v2");
    struct hello h = {bytes, {{0}}};
    CU(cu.IpcGetMemHandle(&h.handle, buf), "cuIpcGetMemHandle");
    send_all(sock, &h, sizeof h, -1);
  } else {
    CUmemAllocationProp prop = {0};
    prop.type = 1;
    prop.requestedHandleTypes = 1;
    prop.location.type = 1;
    prop.location.id = device;
    CUmemGenericAllocationHandle handle;
    CU(cu.MemCreate(&handle, bytes, &prop, 0), "cuMemCreate");
    buf = map_object(handle, bytes, device);
    int fd = -1;
    CU(cu.MemExportToShareableHandle(&fd, handle, 1, 0), "cuMemExportToShareableHandle");
    struct hello h = {bytes, {{0}}};
    send_all(sock, &h, sizeof h, fd);
    close(fd);
    /* Mapped, the memory lives on without the handle, as NCCL leaves it. */
    CU(cu.MemRelease(handle), "cuMemRelease");
  }
  uint32_t *host = malloc(bytes);
  for (size_t i = 0; i < bytes / 4; i++) host[i] = pattern(i);
  host[0] = host[1] = 0;
  CU(cu.MemcpyHtoD(buf, host, bytes), "cuMemcpyHtoD");
  CU(cu.CtxSynchronize(), "cuCtxSynchronize");
  for (uint64_t step = 1; !stop_requested; step++) {
    uint32_t word = (uint32_t)step;
    CU(cu.MemcpyHtoD(buf, &word, 4), "cuMemcpyHtoD");
    /* A copy from pageable memory may return before it reached the GPU. */
    CU(cu.CtxSynchronize(), "cuCtxSynchronize");
    struct step_msg m = {step, 0, 1};
    send_all(sock, &m, sizeof m, -1);
    struct step_msg reply;
    ssize_t n = recv_msg(sock, &reply, sizeof reply, NULL);
    if (n != sizeof reply) {
      if (stop_requested) break;
      printf("the child is gone (%zd)\n", n);
      return 1;
    }
    if (!reply.ok) return 1; /* the child said why */
    uint32_t back = 0;
    CU(cu.MemcpyDtoH(&back, buf + 4, 4), "cuMemcpyDtoH");
    if (back != (uint32_t)(3 * step + 1)) {
      printf("MISMATCH step %llu word 1: %u, expected %u\n", (unsigned long long)step, back,
             (uint32_t)(3 * step + 1));
      return 1;
    }
    printf("step %llu counter %llu sum %llu\n", (unsigned long long)step, (unsigned long long)step,
           (unsigned long long)reply.sum);
    fflush(stdout);
    usleep((useconds_t)interval_ms * 1000);
  }
  return 0;
}

static int run_child(int sock, int share_fd, int device) {
    CUdeviceptr buf = 0;
  struct hello h;
  int fd = -1;
  if (recv_msg(sock, &h, sizeof h, &fd) != sizeof h) return 1;
  size_t bytes = h.bytes;
  if (!share_fd) {
    CU(cu.IpcOpenMemHandle(&buf, h.handle, 1), "cuIpcOpenMemHandle");
  } else {
    if (fd < 0) return 1;
    CUmemGenericAllocationHandle handle;
    CU(cu.MemImportFromShareableHandle(&handle, (void *)(intptr_t)fd, 1), "cuMemImportFromShareableHandle");
    close(fd);
    buf = map_object(handle, bytes, device);
    CU(cu.MemRelease(handle), "cuMemRelease");
  }
  uint32_t *host = malloc(bytes);
  double last = 0;
  for (;;) {
    struct step_msg m;
    ssize_t n = recv_msg(sock, &m, sizeof m, NULL);
    if (n != sizeof m) return stop_requested || n == 0 ? 0 : 1;
    struct step_msg reply = {m.step, 0, 1};
    uint32_t word = 0;
    CU(cu.MemcpyDtoH(&word, buf, 4), "cuMemcpyDtoH");
    if (word != (uint32_t)m.step) {
      printf("MISMATCH step %llu word 0 as the child reads it: %u\n", (unsigned long long)m.step, word);
      reply.ok = 0;
    }
    double t = now_s();
    if (reply.ok && (last == 0 || t - last > 1.0)) {
      /* The first step, and after any pause: every word of the pattern. */
      CU(cu.MemcpyDtoH(host, buf, bytes), "cuMemcpyDtoH");
      for (size_t i = 2; i < bytes / 4; i++) {
        if (host[i] != pattern(i)) {
          printf("MISMATCH word %zu: %08x, expected %08x (child)\n", i, host[i], pattern(i));
          reply.ok = 0;
          break;
        }
        reply.sum += host[i];
      }
    }
    last = t;
    uint32_t answer = (uint32_t)(3 * m.step + 1);
    CU(cu.MemcpyHtoD(buf + 4, &answer, 4), "cuMemcpyHtoD");
    CU(cu.CtxSynchronize(), "cuCtxSynchronize");
    fflush(stdout);
    send_all(sock, &reply, sizeof reply, -1);
    if (!reply.ok) return 1;
  }
}

int main(int argc, char **argv) {
  int share_fd = -1, device = 0, importer_device = -1, interval_ms = 50;
  size_t mib = 8;
  const char *device_file = NULL, *importer_device_file = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--share") && i + 1 < argc) {
      i++;
      share_fd = !strcmp(argv[i], "fd") ? 1 : !strcmp(argv[i], "ipc") ? 0 : -1;
    } else if (!strcmp(argv[i], "--mib") && i + 1 < argc) {
      mib = (size_t)atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--interval-ms") && i + 1 < argc) {
      interval_ms = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--device") && i + 1 < argc) {
      device = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--importer-device") && i + 1 < argc) {
      importer_device = atoi(argv[++i]);
    } else if (!strcmp(argv[i], "--device-file") && i + 1 < argc) {
      device_file = argv[++i];
    } else if (!strcmp(argv[i], "--importer-device-file") && i + 1 < argc) {
      importer_device_file = argv[++i];
    } else {
      share_fd = -1;
      break;
    }
  }
  if (share_fd < 0 || mib < 2) {
    fprintf(stderr, "usage: share_pair --share ipc|fd [--mib M>=2] [--interval-ms I] [--device D] "
                    "[--importer-device D] [--device-file PATH] [--importer-device-file PATH]\n");
    return 2;
  }
  if (importer_device < 0) importer_device = device;
  if (importer_device_file == NULL) importer_device_file = device_file;
  setvbuf(stdout, NULL, _IOLBF, 0);
  struct sigaction sa = {0};
  sa.sa_handler = on_sigterm;
  sigaction(SIGTERM, &sa, NULL);
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return 1;
  pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    close(sv[0]);
    start_gpu(importer_device, importer_device_file);
    return run_child(sv[1], share_fd, importer_device) == 0 ? 0 : 1;
  }
  close(sv[1]);
  start_gpu(device, device_file);
  size_t g = granularity(device);
  size_t bytes = (mib * MIB + g - 1) / g * g;
  int rc = run_parent(sv[0], share_fd, bytes, device, interval_ms);
  kill(child, SIGTERM);
  int status = 0;
  waitpid(child, &status, 0);
  return rc;
}
