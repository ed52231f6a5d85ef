// A fake libcuda.so.1 for machines without a GPU: the same entry points as the
// driver (those gpusnap resolves), with the checkpoint API's per-pid state
// machine RUNNING -> LOCKED -> CHECKPOINTED -> LOCKED -> RUNNING, so a wrong
// order fails as on the real driver (CUDA_ERROR_ILLEGAL_STATE).
//
// It also serves CUDA programs and the gpushare shim: contexts, device memory
// (plain and VMM), copies, sets, streams, events, pinned host memory,
// cuGetProcAddress, and launches. "Device memory" is host memory of the
// calling process (a CUdeviceptr is a host address, VMM memory a memfd mapped
// shared), and a CUfunction is a host function void(void** kernel_params)
// that cuLaunchKernel calls at once. One module is known: the gpushare shim's
// fingerprint kernel (PTX naming gpusnap_chunk_fingerprint), whose function
// computes the fingerprint's reference (src/gpushare/common/chunk_fingerprint.h)
// over the fake's device memory. Copies check their ranges against the
// fake's tables and answer CUDA_ERROR_INVALID_VALUE instead of faulting.
//
// Loaded by gpusnap through its ordinary dlopen("libcuda.so.1"): put this
// library's directory first in LD_LIBRARY_PATH. Controlled by environment
// variables, read at every call (see docs/CUDA.md):
//   FAKE_CUDA_LOG=path           append one line per call:
//                                "t=<end ns> start=<start ns> tid=<tid> fn=<name> pid=<pid> rc=<CUresult> [k=v...]"
//                                (CLOCK_MONOTONIC; checkpoint API: the target pid; memory, context,
//                                stream and launch calls: the caller's pid; others 0)
//   FAKE_CUDA_GPUS=n             number of GPUs (default 1); UUIDs GPU-5afec0da-0000-0000-0000-0000000000<nn>
//   FAKE_CUDA_FAIL=fn:pid:code[,...]  make `fn` return `code` for `pid` ('*': any pid) without changing state
//   FAKE_CUDA_FAIL_FILE=path     more such entries, read from this file at every call (arm a failure later)
//   FAKE_CUDA_DELAY_MS=n         sleep n ms in lock, checkpoint, restore and unlock (before the state changes)
//   FAKE_CUDA_DRIVER_VERSION=n   what cuDriverGetVersion says (default 13000)
//   FAKE_CUDA_HANG_MS=fn:ms      make one function take ms milliseconds (a checkpoint-API
//                                transition, or cuCtxSynchronize: GPU work slow to drain)
//   FAKE_CUDA_STATE_FILE=path    keep the per-pid states in this file, so they outlive the process
//   FAKE_CUDA_MEM_BYTES=n        device memory per process for cuMemGetInfo_v2 and out-of-memory (default 16 GiB)
//   (a process mapping /dev/nvidia-gpusnap-test-* keeps its state in that file instead)
// A pid never seen is RUNNING. Built with -DFAKE_CUDA_OMIT_LOCK it lacks
// cuCheckpointProcessLock (for the missing-symbol test).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/driver_abi.h"
#include "gpushare/common/chunk_fingerprint.h"

using namespace gpusnap::cuda::abi;

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

std::mutex g_mu;
std::map<int, int> g_states;  // GUARDED_BY(g_mu), when FAKE_CUDA_STATE_FILE is unset
int g_init_count = 0;         // GUARDED_BY(g_mu)

long long NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != 0 ? std::atoi(v) : fallback;
}

bool Initialized() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_init_count > 0;
}

// The code FAKE_CUDA_FAIL sets for (fn, pid), or CUDA_SUCCESS.
// FAKE_CUDA_FAIL_FILE holds more entries, read at every call: a test can arm
// a failure in a process that is already running (its environment is fixed).
std::string FailSpec() {
  std::string s;
  if (const char* spec = std::getenv("FAKE_CUDA_FAIL")) s = spec;
  const char* path = std::getenv("FAKE_CUDA_FAIL_FILE");
  if (path == nullptr || *path == 0) return s;
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return s;
  char buf[1024];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  if (n <= 0) return s;
  std::string text(buf, static_cast<size_t>(n));
  return s + "," + text.substr(0, text.find_first_of("\r\n"));
}

CUresult InjectedFailure(const char* fn, int pid) {
  std::string s = FailSpec();
  if (s.empty()) return CUDA_SUCCESS;
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t end = s.find(',', pos);
    std::string entry = s.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    size_t c1 = entry.find(':'), c2 = entry.rfind(':');
    if (c1 != std::string::npos && c2 != c1) {
      std::string name = entry.substr(0, c1), who = entry.substr(c1 + 1, c2 - c1 - 1);
      if (name == fn && (who == "*" || std::atoi(who.c_str()) == pid)) return std::atoi(entry.c_str() + c2 + 1);
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return CUDA_SUCCESS;
}

void Log(long long start, const char* fn, int pid, CUresult rc, const std::string& extra = "") {
  const char* path = std::getenv("FAKE_CUDA_LOG");
  if (path == nullptr || *path == 0) return;
  char line[2048];
  int n = std::snprintf(line, sizeof line, "t=%lld start=%lld tid=%ld fn=%s pid=%d rc=%d%s%s\n", NowNs(), start,
                        static_cast<long>(::syscall(SYS_gettid)), fn, pid, rc, extra.empty() ? "" : " ",
                        extra.c_str());
  int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t ignored = ::write(fd, line, static_cast<size_t>(n < static_cast<int>(sizeof line) ? n : sizeof line - 1));
  (void)ignored;
  ::close(fd);
}

// FAKE_CUDA_DELAY_MS for every transition; FAKE_CUDA_HANG_MS="fn:ms" for one
// function only (a driver call that takes far too long).
int HangMs(const char* fn) {
  const char* hang = std::getenv("FAKE_CUDA_HANG_MS");
  const char* colon = hang ? std::strchr(hang, ':') : nullptr;
  if (colon && std::strncmp(hang, fn, static_cast<size_t>(colon - hang)) == 0 &&
      std::strlen(fn) == static_cast<size_t>(colon - hang))
    return std::atoi(colon + 1);
  return -1;
}
void Delay(const char* fn) {
  int ms = HangMs(fn);
  if (ms < 0) ms = EnvInt("FAKE_CUDA_DELAY_MS", 0);
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// Reads, updates and writes the state of `pid` atomically (under g_mu, and
// under flock when the states live in FAKE_CUDA_STATE_FILE). `fn` gets the
// current state and returns the CUresult; it may change the state.
// A process that maps a stand-in device file (/dev/nvidia-gpusnap-test-*)
// keeps its state in that file, as a real process keeps its CUDA state in
// itself: it survives a CRIU dump and restore under a new pid.
std::string StandInDevice(int pid) {
  std::FILE* maps = std::fopen(("/proc/" + std::to_string(pid) + "/maps").c_str(), "r");
  if (maps == nullptr) return "";
  char line[4096];
  std::string found;
  while (found.empty() && std::fgets(line, sizeof line, maps)) {
    const char* at = std::strstr(line, "/dev/nvidia-gpusnap-test");
    if (at) found.assign(at, std::strcspn(at, "\n"));
  }
  std::fclose(maps);
  return found;
}

template <typename Fn>
CUresult WithState(int pid, Fn fn) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (std::string dev = StandInDevice(pid); !dev.empty()) {
    // The first bytes of the file: "state <n>\n" (zeros: RUNNING).
    int fd = ::open(dev.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_UNKNOWN;
    ::flock(fd, LOCK_EX);
    char buf[32] = {};
    int state = 0;
    if (::pread(fd, buf, sizeof buf - 1, 0) > 0) std::sscanf(buf, "state %d", &state);
    CUresult rc = fn(state);
    std::snprintf(buf, sizeof buf, "state %d\n", state);
    if (::pwrite(fd, buf, std::strlen(buf), 0) < 0) rc = CUDA_ERROR_UNKNOWN;
    ::close(fd);
    return rc;
  }
  const char* path = std::getenv("FAKE_CUDA_STATE_FILE");
  if (path == nullptr || *path == 0) return fn(g_states[pid]);
  int fd = ::open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return CUDA_ERROR_UNKNOWN;
  ::flock(fd, LOCK_EX);
  std::map<int, int> states;
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  int p = 0, st = 0, used = 0;
  for (const char* c = text.c_str(); std::sscanf(c, "%d %d\n%n", &p, &st, &used) == 2; c += used) states[p] = st;
  CUresult rc = fn(states[pid]);
  std::string out;
  for (const auto& [k, v] : states) out += std::to_string(k) + " " + std::to_string(v) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, out.data(), out.size(), 0) != static_cast<ssize_t>(out.size()))
    rc = CUDA_ERROR_UNKNOWN;
  ::close(fd);  // drops the flock
  return rc;
}

// A checkpoint-API transition: `from` -> `to`, else CUDA_ERROR_ILLEGAL_STATE.
// `invalid`: what checking the arguments found (CUDA_SUCCESS: nothing).
CUresult Transition(const char* fn, int pid, int from, int to, const std::string& extra, CUresult invalid) {
  long long start = NowNs();
  CUresult rc = !Initialized() ? CUDA_ERROR_NOT_INITIALIZED : invalid;
  if (rc == CUDA_SUCCESS) {
    Delay(fn);
    rc = InjectedFailure(fn, pid);
  }
  if (rc == CUDA_SUCCESS) rc = WithState(pid, [&](int& state) {
    if (state != from) return CUDA_ERROR_ILLEGAL_STATE;
    state = to;
    return CUDA_SUCCESS;
  });
  Log(start, fn, pid, rc, extra);
  return rc;
}

bool AllZero(const void* p, size_t n) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i)
    if (b[i] != 0) return false;
  return true;
}

int GpuCount() { return EnvInt("FAKE_CUDA_GPUS", 1); }

CUuuid GpuUuid(int index) {
  CUuuid u{};
  const unsigned char prefix[4] = {0x5a, 0xfe, 0xc0, 0xda};
  std::memcpy(u.bytes, prefix, sizeof prefix);
  u.bytes[15] = static_cast<char>(index);
  return u;
}

// The index of the fake GPU with this UUID, or -1.
int GpuIndex(const CUuuid& u) {
  for (int i = 0; i < GpuCount(); ++i)
    if (std::memcmp(GpuUuid(i).bytes, u.bytes, sizeof u.bytes) == 0) return i;
  return -1;
}

std::string UuidText(const CUuuid& u) {
  std::string out = "GPU-";
  char hex[3];
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(u.bytes[i]));
    out += hex;
  }
  return out;
}

// A simple query: not initialised, injected failure, or `body`.
template <typename Body>
CUresult Query(const char* fn, int pid, Body body, bool needs_init = true) {
  long long start = NowNs();
  CUresult rc = needs_init && !Initialized() ? CUDA_ERROR_NOT_INITIALIZED : InjectedFailure(fn, pid);
  std::string extra;
  if (rc == CUDA_SUCCESS) rc = body(extra);
  Log(start, fn, pid, rc, extra);
  return rc;
}

// A query about one device: CUDA_ERROR_INVALID_DEVICE for an ordinal out of range.
template <typename Body>
CUresult DeviceQuery(const char* fn, int device, Body body) {
  return Query(fn, 0, [&](std::string&) { return device < 0 || device >= GpuCount() ? CUDA_ERROR_INVALID_DEVICE : body(); });
}

}  // namespace

FAKE_EXPORT CUresult cuInit(unsigned int flags) {
  long long start = NowNs();
  CUresult rc = flags != 0 ? CUDA_ERROR_INVALID_VALUE : InjectedFailure("cuInit", 0);
  int count = 0;
  if (rc == CUDA_SUCCESS) {
    std::lock_guard<std::mutex> lock(g_mu);
    count = ++g_init_count;
  }
  // `count`: this process's cuInit calls so far; `self`: the process.
  Log(start, "cuInit", 0, rc, "count=" + std::to_string(count) + " self=" + std::to_string(::getpid()));
  return rc;
}

FAKE_EXPORT CUresult cuDriverGetVersion(int* version) {
  return Query("cuDriverGetVersion", 0, [&](std::string&) {
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *version = EnvInt("FAKE_CUDA_DRIVER_VERSION", 13000);
    return CUDA_SUCCESS;
  }, false);
}

FAKE_EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
  // No log line: gpusnap calls this while wording messages.
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = nullptr;
  if (InjectedFailure("cuGetErrorName", 0) != CUDA_SUCCESS) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case 0: *name = "CUDA_SUCCESS"; break;
    case 1: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case 3: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case 401: *name = "CUDA_ERROR_ILLEGAL_STATE"; break;
    case 600: *name = "CUDA_ERROR_NOT_READY"; break;
    case 801: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
    default: return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
  if (text == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *text = error == 0 ? "no error" : "fake CUDA error";
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int* count) {
  return Query("cuDeviceGetCount", 0, [&](std::string&) {
    *count = GpuCount();
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  return DeviceQuery("cuDeviceGet", ordinal, [&] {
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
  return DeviceQuery("cuDeviceGetName", device, [&] {
    std::snprintf(name, static_cast<size_t>(len), "Fake NVIDIA H200 #%d", device);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice device) {
  return DeviceQuery("cuDeviceGetUuid_v2", device, [&] {
    *uuid = GpuUuid(device);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice device) { return cuDeviceGetUuid_v2(uuid, device); }

FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
  return DeviceQuery("cuDeviceTotalMem_v2", device, [&] {
    *bytes = size_t{143771} << 20;  // an H200's 140.4 GiB
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
  return DeviceQuery("cuDeviceGetAttribute", device, [&] {
    if (attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) *value = 9;
    else if (attribute == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) *value = 0;
    else return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuCheckpointProcessGetState(int pid, CUprocessState* state) {
  return Query("cuCheckpointProcessGetState", pid, [&](std::string& extra) {
    if (state == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return WithState(pid, [&](int& s) {
      *state = static_cast<CUprocessState>(s);
      extra = "state=" + std::to_string(s);
      return CUDA_SUCCESS;
    });
  });
}

// Like the driver's own helper thread: a real thread of a live process (its
// newest, other than the main thread), pid + 1 for the made-up pids of unit tests.
int RestoreThreadOf(int pid) {
  int newest = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec)) {
    int tid = std::atoi(e.path().filename().c_str());
    if (tid != pid && tid > newest) newest = tid;
  }
  return newest ? newest : pid + 1;
}

FAKE_EXPORT CUresult cuCheckpointProcessGetRestoreThreadId(int pid, int* tid) {
  return Query("cuCheckpointProcessGetRestoreThreadId", pid, [&](std::string& extra) {
    if (tid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *tid = RestoreThreadOf(pid);
    extra = "tid=" + std::to_string(*tid);
    return CUDA_SUCCESS;
  });
}

#ifndef FAKE_CUDA_OMIT_LOCK
FAKE_EXPORT CUresult cuCheckpointProcessLock(int pid, CUcheckpointLockArgs* args) {
  bool bad = args != nullptr && (args->reserved0 != 0 || !AllZero(args->reserved1, sizeof args->reserved1));
  std::string extra = "timeout_ms=" + std::to_string(args != nullptr ? args->timeoutMs : 0);
  return Transition("cuCheckpointProcessLock", pid, CU_PROCESS_STATE_RUNNING, CU_PROCESS_STATE_LOCKED, extra,
                    bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
}
#endif

FAKE_EXPORT CUresult cuCheckpointProcessCheckpoint(int pid, CUcheckpointCheckpointArgs* args) {
  bool bad = args != nullptr && !AllZero(args, sizeof *args);
  return Transition("cuCheckpointProcessCheckpoint", pid, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_CHECKPOINTED, "",
                    bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
}

FAKE_EXPORT CUresult cuCheckpointProcessRestore(int pid, CUcheckpointRestoreArgs* args) {
  std::string pairs;
  CUresult invalid = CUDA_SUCCESS;
  if (args != nullptr) {
    if (!AllZero(args->reserved, sizeof args->reserved) || args->reserved1 != 0) invalid = CUDA_ERROR_INVALID_VALUE;
    // Like the driver: the pairs must name every GPU the process used (here:
    // all of them), each old and each new GPU once.
    unsigned n = args->gpuPairsCount;
    if (n > 0 && (args->gpuPairs == nullptr || n != static_cast<unsigned>(GpuCount()))) {
      invalid = CUDA_ERROR_INVALID_VALUE;
      n = 0;
    }
    unsigned long long seen_old = 0, seen_new = 0;
    for (unsigned i = 0; i < n; ++i) {
      const CUcheckpointGpuPair& p = args->gpuPairs[i];
      int o = GpuIndex(p.oldUuid), w = GpuIndex(p.newUuid);
      if (o < 0 || w < 0 || (seen_old >> o & 1u) || (seen_new >> w & 1u)) invalid = CUDA_ERROR_INVALID_VALUE;
      if (o >= 0) seen_old |= 1ull << o;
      if (w >= 0) seen_new |= 1ull << w;
      pairs += (i ? "," : "") + UuidText(p.oldUuid) + ">" + UuidText(p.newUuid);
    }
  }
  return Transition("cuCheckpointProcessRestore", pid, CU_PROCESS_STATE_CHECKPOINTED, CU_PROCESS_STATE_LOCKED,
                    "pairs=" + (pairs.empty() ? std::string("none") : pairs), invalid);
}

FAKE_EXPORT CUresult cuCheckpointProcessUnlock(int pid, CUcheckpointUnlockArgs* args) {
  bool bad = args != nullptr && !AllZero(args, sizeof *args);
  return Transition("cuCheckpointProcessUnlock", pid, CU_PROCESS_STATE_LOCKED, CU_PROCESS_STATE_RUNNING, "",
                    bad ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS);
}

// --- Device memory, contexts, streams and launches ----------------------------
//
// "Device memory" is host memory of the calling process, so a CUdeviceptr is a
// host address and a copy is a memcpy. Every range a copy touches is checked
// against the fake's own tables first, so a copy into memory that is not
// mapped read-write returns CUDA_ERROR_INVALID_VALUE instead of crashing the
// caller: tests can then tell "not mapped" from a wrong value.

namespace {

constexpr size_t kGranularity = size_t{2} << 20;  // what cuMemGetAllocationGranularity says
constexpr CUresult kInvalidContext = 201;         // CUDA_ERROR_INVALID_CONTEXT
constexpr CUresult kInvalidHandle = 400;          // CUDA_ERROR_INVALID_HANDLE
constexpr CUresult kAlreadyRegistered = 712;      // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
constexpr CUresult kNotRegistered = 713;          // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
constexpr CUresult kInvalidImage = 200;           // CUDA_ERROR_INVALID_IMAGE
constexpr int kMaxDevices = 64;

// Memory the fake hands out or knows about, by base address; never overlapping.
enum class RegionKind { kPlain, kHostAlloc, kHostRegistered, kReservation };
struct Region {
  size_t size;       // what the caller asked for (a reservation: its whole length)
  size_t mapped;     // what was mmap'd (plain and host allocations)
  RegionKind kind;
};

// Physical memory from cuMemCreate or cuMemImportFromShareableHandle.
struct Handle {
  int fd;
  size_t size;
  int device;
  int requested_types;
  int refs;      // cuMemCreate/Import/Retain minus cuMemRelease
  int mappings;  // live cuMemMap's of it; the memory lives while either is > 0
  bool counted;  // in g_device_bytes_used (not an import of memory this process already counts)
};

// One cuMemMap, inside a reservation.
struct Mapping {
  size_t size;
  CUmemGenericAllocationHandle handle;
  int prot;  // PROT_NONE, PROT_READ or PROT_READ|PROT_WRITE, as cuMemSetAccess set it
};

// Copies take it shared and keep it for the memcpy: an unmap or free racing a
// copy then waits for it, as the real driver orders them on the stream,
// instead of pulling the pages out from under it.
std::shared_mutex g_mem_mu;
std::map<uintptr_t, Region> g_regions;                    // GUARDED_BY(g_mem_mu)
std::map<uintptr_t, Mapping> g_mappings;                  // GUARDED_BY(g_mem_mu)
std::map<CUmemGenericAllocationHandle, Handle> g_handles;  // GUARDED_BY(g_mem_mu)
CUmemGenericAllocationHandle g_next_handle = 0x1000;      // GUARDED_BY(g_mem_mu)
size_t g_device_bytes_used = 0;                           // GUARDED_BY(g_mem_mu)
int g_primary_refs[kMaxDevices] = {};                     // GUARDED_BY(g_mem_mu)

// Stream and event handles: addresses of tokens the fake owns.
std::mutex g_obj_mu;
std::map<void*, long long> g_streams;  // GUARDED_BY(g_obj_mu); value unused
std::map<void*, long long> g_events;   // GUARDED_BY(g_obj_mu); last record time (ns), 0: never

// A CUcontext is the address of its device's byte here: non-null, stable, and
// the same in every thread.
char g_context_tokens[kMaxDevices];
thread_local std::vector<CUcontext> t_context_stack;

std::string Hex(uintptr_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

size_t DeviceMemoryBytes() {
  const char* v = std::getenv("FAKE_CUDA_MEM_BYTES");
  return v != nullptr && *v != 0 ? static_cast<size_t>(std::strtoull(v, nullptr, 0)) : size_t{16} << 30;
}

// FAKE_CUDA_HANG_MS only: FAKE_CUDA_DELAY_MS is for the checkpoint API, and
// slowing every copy with it would slow every workload.
void Hang(const char* fn) {
  const char* hang = std::getenv("FAKE_CUDA_HANG_MS");
  if (hang == nullptr) return;
  const char* colon = std::strchr(hang, ':');
  if (colon == nullptr || std::strlen(fn) != static_cast<size_t>(colon - hang) ||
      std::strncmp(hang, fn, static_cast<size_t>(colon - hang)) != 0)
    return;
  std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(colon + 1)));
}

// One call of the memory, context, stream or launch API: cuInit first,
// FAKE_CUDA_FAIL (matched against the caller's pid), then `body`, then a log
// line with `args` and whatever `body` added.
template <typename Body>
CUresult Call(const char* fn, const std::string& args, Body body, bool needs_init = true) {
  long long start = NowNs();
  int pid = static_cast<int>(::getpid());
  CUresult rc = needs_init && !Initialized() ? CUDA_ERROR_NOT_INITIALIZED : InjectedFailure(fn, pid);
  std::string extra = args;
  if (rc == CUDA_SUCCESS) {
    Hang(fn);
    rc = body(extra);
  }
  Log(start, fn, pid, rc, extra);
  return rc;
}

bool ValidDevice(int device) { return device >= 0 && device < GpuCount() && device < kMaxDevices; }

bool ValidProp(const CUmemAllocationProp* prop) {
  return prop != nullptr && prop->type == CU_MEM_ALLOCATION_TYPE_PINNED &&
         prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE && ValidDevice(prop->location.id);
}

// The region that contains `p`, or g_regions.end(). Caller holds g_mem_mu.
std::map<uintptr_t, Region>::iterator RegionAt(uintptr_t p) {
  auto it = g_regions.upper_bound(p);
  if (it == g_regions.begin()) return g_regions.end();
  --it;
  return p < it->first + it->second.size ? it : g_regions.end();
}

// Whether [p, p + n) touches any region. Caller holds g_mem_mu.
bool OverlapsRegion(uintptr_t p, size_t n) {
  auto it = g_regions.lower_bound(p);
  if (it != g_regions.end() && it->first < p + n) return true;
  return RegionAt(p) != g_regions.end();
}

// Whether [p, p + n) of a reservation is covered, without a gap, by mappings
// that allow `prot`. Caller holds g_mem_mu.
bool MappedWith(uintptr_t p, size_t n, int prot) {
  auto it = g_mappings.upper_bound(p);
  if (it == g_mappings.begin()) return false;
  --it;
  for (uintptr_t at = p; at < p + n; ++it) {
    if (it == g_mappings.end() || it->first > at || at >= it->first + it->second.size) return false;
    if ((it->second.prot & prot) != prot) return false;
    at = it->first + it->second.size;
  }
  return true;
}

enum class Access { kValid, kInvalid, kForeign };

// What [p, p + n) is: memory of the fake that allows `prot` (kValid), memory
// of the fake that does not, or straddles its edge (kInvalid), or memory the
// fake knows nothing of (kForeign: ordinary host memory, the caller's word).
// Caller holds g_mem_mu.
Access Classify(uintptr_t p, size_t n, int prot) {
  if (n == 0) return Access::kValid;
  if (p == 0 || p + n < p) return Access::kInvalid;
  auto it = RegionAt(p);
  if (it == g_regions.end()) return OverlapsRegion(p, n) ? Access::kInvalid : Access::kForeign;
  if (p + n > it->first + it->second.size) return Access::kInvalid;
  if (it->second.kind != RegionKind::kReservation) return Access::kValid;
  return MappedWith(p, n, prot) ? Access::kValid : Access::kInvalid;
}

// A device pointer must be the fake's; a host pointer may be anyone's but must
// not reach into an unmapped part of the fake's.
bool DeviceOk(CUdeviceptr p, size_t n, int prot) { return Classify(p, n, prot) == Access::kValid; }
bool HostOk(const void* p, size_t n, int prot) {
  return Classify(reinterpret_cast<uintptr_t>(p), n, prot) != Access::kInvalid;
}

bool ValidStream(CUstream s) {
  // 0: the legacy default stream; 1 and 2: CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
  if (reinterpret_cast<uintptr_t>(s) <= 2) return true;
  std::lock_guard<std::mutex> lock(g_obj_mu);
  return g_streams.count(s) > 0;
}

// Anonymous read-write memory, aligned to `align` (a power of two).
void* MapAligned(size_t bytes, size_t align, int prot, int extra_flags) {
  size_t length = bytes + (align > static_cast<size_t>(::getpagesize()) ? align : 0);
  void* raw = ::mmap(nullptr, length, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | extra_flags, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uintptr_t base = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (base + align - 1) & ~(uintptr_t{align} - 1);
  if (aligned > base) ::munmap(raw, aligned - base);
  if (base + length > aligned + bytes) ::munmap(reinterpret_cast<void*>(aligned + bytes), base + length - aligned - bytes);
  return reinterpret_cast<void*>(aligned);
}

size_t PageRound(size_t n) {
  size_t page = static_cast<size_t>(::getpagesize());
  return (n + page - 1) / page * page;
}

// Drops a reference or a mapping of `h`; frees the memory when neither is left.
// Caller holds g_mem_mu exclusively.
void MaybeFreeHandle(std::map<CUmemGenericAllocationHandle, Handle>::iterator it) {
  if (it->second.refs > 0 || it->second.mappings > 0) return;
  ::close(it->second.fd);
  if (it->second.counted) g_device_bytes_used -= it->second.size;
  g_handles.erase(it);
}

// The mappings that exactly tile [p, p + n), or an empty list. Caller holds g_mem_mu.
std::vector<std::map<uintptr_t, Mapping>::iterator> WholeMappings(uintptr_t p, size_t n) {
  std::vector<std::map<uintptr_t, Mapping>::iterator> out;
  auto it = g_mappings.find(p);
  for (uintptr_t at = p; at < p + n; ++it) {
    if (it == g_mappings.end() || it->first != at || at + it->second.size > p + n) return {};
    out.push_back(it);
    at += it->second.size;
  }
  return out;
}

CUresult HostAllocate(const char* fn, void** out, size_t bytes, unsigned int flags) {
  return Call(fn, "size=" + std::to_string(bytes) + " flags=" + std::to_string(flags), [&](std::string& extra) {
    if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    void* p = MapAligned(PageRound(bytes), static_cast<size_t>(::getpagesize()), PROT_READ | PROT_WRITE, 0);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    std::unique_lock lock(g_mem_mu);
    g_regions[reinterpret_cast<uintptr_t>(p)] = {bytes, PageRound(bytes), RegionKind::kHostAlloc};
    *out = p;
    extra += " ptr=" + Hex(reinterpret_cast<uintptr_t>(p));
    return CUDA_SUCCESS;
  });
}

// A copy of n bytes; `dst_ok` and `src_ok` check each side under the lock.
template <typename Check>
CUresult Copy(const char* fn, void* dst, const void* src, size_t n, CUstream stream, Check ranges_ok) {
  std::string args = "dst=" + Hex(reinterpret_cast<uintptr_t>(dst)) + " src=" + Hex(reinterpret_cast<uintptr_t>(src)) +
                     " size=" + std::to_string(n);
  if (stream != nullptr) args += " stream=" + Hex(reinterpret_cast<uintptr_t>(stream));
  return Call(fn, args, [&](std::string&) {
    if (!ValidStream(stream)) return kInvalidHandle;
    std::shared_lock lock(g_mem_mu);
    if (!ranges_ok()) return CUDA_ERROR_INVALID_VALUE;
    if (n > 0) std::memmove(dst, src, n);
    return CUDA_SUCCESS;
  });
}

void* Ptr(CUdeviceptr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

// `count` elements of `element` bytes each, all set to `value`.
CUresult Set(const char* fn, CUdeviceptr dst, unsigned int value, size_t element, size_t count, CUstream stream) {
  std::string args = "dst=" + Hex(dst) + " value=" + std::to_string(value) + " count=" + std::to_string(count);
  if (stream != nullptr) args += " stream=" + Hex(reinterpret_cast<uintptr_t>(stream));
  return Call(fn, args, [&](std::string&) {
    if (!ValidStream(stream)) return kInvalidHandle;
    if (count > SIZE_MAX / element || (element == 4 && dst % 4 != 0)) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_mem_mu);
    if (!DeviceOk(dst, count * element, PROT_READ | PROT_WRITE)) return CUDA_ERROR_INVALID_VALUE;
    if (element == 1) {
      std::memset(Ptr(dst), static_cast<int>(value & 0xff), count);
    } else {
      auto* words = static_cast<unsigned int*>(Ptr(dst));
      for (size_t i = 0; i < count; ++i) words[i] = value;
    }
    return CUDA_SUCCESS;
  });
}

// A "kernel" of the fake: a host function given the kernel parameters.
using HostKernel = void (*)(void** kernel_params);

// The fingerprint kernel's function: its parameters (data, words,
// chunk_words, out) as the PTX takes them; each chunk's pair added to `out`,
// as the kernel's threads add theirs. A range outside the fake's device
// memory fails as a kernel's wild read does on a GPU.
constexpr CUresult kIllegalAddress = 700;  // CUDA_ERROR_ILLEGAL_ADDRESS
void FingerprintKernelStandIn(void**) {}    // its address names it; Launch runs FingerprintChunks
CUfunction FingerprintFunction() { return reinterpret_cast<CUfunction>(reinterpret_cast<void*>(&FingerprintKernelStandIn)); }

CUresult FingerprintChunks(void** params) {
  uint64_t data = *static_cast<uint64_t*>(params[0]), words = *static_cast<uint64_t*>(params[1]);
  uint64_t chunk_words = *static_cast<uint64_t*>(params[2]), out = *static_cast<uint64_t*>(params[3]);
  if (chunk_words == 0 || words > SIZE_MAX / 8) return CUDA_ERROR_INVALID_VALUE;
  uint64_t chunks = (words + chunk_words - 1) / chunk_words;
  std::shared_lock lock(g_mem_mu);
  if (!DeviceOk(data, words * 8, PROT_READ) || !DeviceOk(out, chunks * 16, PROT_READ | PROT_WRITE))
    return kIllegalAddress;
  auto* sums = reinterpret_cast<gpusnap::gpushare::ChunkFingerprint*>(Ptr(out));
  for (uint64_t c = 0; c < chunks; ++c) {
    uint64_t first = c * chunk_words, n = words - first < chunk_words ? words - first : chunk_words;
    gpusnap::gpushare::ChunkFingerprint f = gpusnap::gpushare::FingerprintBytes(Ptr(data + first * 8), n * 8);
    sums[c].a += f.a;
    sums[c].b += f.b;
  }
  return CUDA_SUCCESS;
}

CUresult Launch(const char* fn, CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, CUstream stream, void** params) {
  std::string args = "f=" + Hex(reinterpret_cast<uintptr_t>(f)) + " grid=" + std::to_string(gx) + "x" +
                     std::to_string(gy) + "x" + std::to_string(gz) + " block=" + std::to_string(bx) + "x" +
                     std::to_string(by) + "x" + std::to_string(bz);
  return Call(fn, args, [&](std::string&) {
    if (f == nullptr) return kInvalidHandle;
    if (!ValidStream(stream)) return kInvalidHandle;
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0) return CUDA_ERROR_INVALID_VALUE;
    if (f == FingerprintFunction()) return FingerprintChunks(params);
    // No lock held: a kernel may call the driver itself.
    reinterpret_cast<HostKernel>(reinterpret_cast<void*>(f))(params);
    return CUDA_SUCCESS;
  });
}

}  // namespace

// cuLaunchKernelEx's configuration, as cuda.h lays it out.
struct FakeLaunchAttribute;
struct FakeLaunchConfig {
  unsigned int gridDimX, gridDimY, gridDimZ;
  unsigned int blockDimX, blockDimY, blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  FakeLaunchAttribute* attrs;
  unsigned int numAttrs;
};

// --- contexts

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  return Call("cuDevicePrimaryCtxRetain", "device=" + std::to_string(device), [&](std::string&) {
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
    std::unique_lock lock(g_mem_mu);
    ++g_primary_refs[device];
    *ctx = reinterpret_cast<CUcontext>(&g_context_tokens[device]);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  return Call("cuDevicePrimaryCtxRelease_v2", "device=" + std::to_string(device), [&](std::string&) {
    if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
    std::unique_lock lock(g_mem_mu);
    if (g_primary_refs[device] == 0) return kInvalidContext;
    --g_primary_refs[device];
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice device, unsigned int* flags, int* active) {
  return Call("cuDevicePrimaryCtxGetState", "device=" + std::to_string(device), [&](std::string& extra) {
    if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!ValidDevice(device)) return CUDA_ERROR_INVALID_DEVICE;
    std::shared_lock lock(g_mem_mu);
    *flags = 0;
    *active = g_primary_refs[device] > 0;
    extra += " active=" + std::to_string(*active);
    return CUDA_SUCCESS;
  });
}

namespace {
int ContextDevice(CUcontext ctx) {
  auto* token = reinterpret_cast<char*>(ctx);
  if (token < g_context_tokens || token >= g_context_tokens + kMaxDevices) return -1;
  int device = static_cast<int>(token - g_context_tokens);
  return ValidDevice(device) ? device : -1;
}
}  // namespace

FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  return Call("cuCtxSetCurrent", "ctx=" + Hex(reinterpret_cast<uintptr_t>(ctx)), [&](std::string&) {
    if (ctx != nullptr && ContextDevice(ctx) < 0) return kInvalidContext;
    // Like the driver: replaces the top of this thread's stack; null pops it.
    if (!t_context_stack.empty()) t_context_stack.pop_back();
    if (ctx != nullptr) t_context_stack.push_back(ctx);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  return Call("cuCtxGetCurrent", "", [&](std::string& extra) {
    if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *ctx = t_context_stack.empty() ? nullptr : t_context_stack.back();
    extra += "ctx=" + Hex(reinterpret_cast<uintptr_t>(*ctx));
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  return Call("cuCtxPushCurrent_v2", "ctx=" + Hex(reinterpret_cast<uintptr_t>(ctx)), [&](std::string&) {
    if (ContextDevice(ctx) < 0) return kInvalidContext;
    t_context_stack.push_back(ctx);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  return Call("cuCtxPopCurrent_v2", "", [&](std::string&) {
    if (t_context_stack.empty()) return kInvalidContext;
    if (ctx != nullptr) *ctx = t_context_stack.back();
    t_context_stack.pop_back();
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
  return Call("cuCtxGetDevice", "", [&](std::string& extra) {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (t_context_stack.empty()) return kInvalidContext;
    *device = ContextDevice(t_context_stack.back());
    extra += "device=" + std::to_string(*device);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuCtxSynchronize() {
  return Call("cuCtxSynchronize", "", [&](std::string&) {
    // FAKE_CUDA_HANG_MS=cuCtxSynchronize:N: work on the GPU that takes N ms to drain.
    if (int ms = HangMs("cuCtxSynchronize"); ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return CUDA_SUCCESS;
  });
}

// --- plain device memory

FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  return Call("cuMemAlloc_v2", "size=" + std::to_string(bytes), [&](std::string& extra) {
    if (dptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    size_t mapped = PageRound(bytes);
    {
      std::unique_lock lock(g_mem_mu);
      if (g_device_bytes_used + mapped > DeviceMemoryBytes()) return CUDA_ERROR_OUT_OF_MEMORY;
      g_device_bytes_used += mapped;  // claimed now, so two threads cannot both take the last bytes
    }
    // Large buffers 2 MiB aligned, as the driver places them.
    size_t align = bytes >= kGranularity ? kGranularity : static_cast<size_t>(::getpagesize());
    void* p = MapAligned(mapped, align, PROT_READ | PROT_WRITE, 0);
    std::unique_lock lock(g_mem_mu);
    if (p == nullptr) {
      g_device_bytes_used -= mapped;
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    g_regions[reinterpret_cast<uintptr_t>(p)] = {bytes, mapped, RegionKind::kPlain};
    *dptr = reinterpret_cast<uintptr_t>(p);
    extra += " ptr=" + Hex(*dptr);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  return Call("cuMemFree_v2", "ptr=" + Hex(dptr), [&](std::string&) {
    if (dptr == 0) return CUDA_SUCCESS;
    std::unique_lock lock(g_mem_mu);
    auto it = g_regions.find(dptr);
    if (it == g_regions.end() || it->second.kind != RegionKind::kPlain) return CUDA_ERROR_INVALID_VALUE;
    ::munmap(Ptr(dptr), it->second.mapped);
    g_device_bytes_used -= it->second.mapped;
    g_regions.erase(it);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
  return Call("cuMemGetInfo_v2", "", [&](std::string& extra) {
    if (free_bytes == nullptr || total_bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_mem_mu);
    *total_bytes = DeviceMemoryBytes();
    *free_bytes = *total_bytes > g_device_bytes_used ? *total_bytes - g_device_bytes_used : 0;
    extra += "free=" + std::to_string(*free_bytes) + " total=" + std::to_string(*total_bytes);
    return CUDA_SUCCESS;
  });
}

// Legacy CUDA IPC: the fake's memory cannot be shared this way (a process's
// "device memory" is its own heap), so every handle is refused. The gpushare
// shim answers these itself for memory it manages.
struct FakeIpcMemHandle {
  char reserved[64];
};
FAKE_EXPORT CUresult cuIpcGetMemHandle(FakeIpcMemHandle* handle, CUdeviceptr ptr) {
  return Call("cuIpcGetMemHandle", "ptr=" + Hex(ptr), [&](std::string&) {
    return handle == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
  });
}
FAKE_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr* ptr, FakeIpcMemHandle, unsigned flags) {
  return Call("cuIpcOpenMemHandle_v2", "flags=" + std::to_string(flags), [&](std::string&) {
    return ptr == nullptr ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NOT_SUPPORTED;
  });
}
FAKE_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr ptr) {
  return Call("cuIpcCloseMemHandle", "ptr=" + Hex(ptr), [&](std::string&) { return CUDA_ERROR_INVALID_VALUE; });
}

FAKE_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr* base, size_t* size, CUdeviceptr dptr) {
  return Call("cuMemGetAddressRange_v2", "ptr=" + Hex(dptr), [&](std::string& extra) {
    std::shared_lock lock(g_mem_mu);
    auto it = RegionAt(dptr);
    if (it == g_regions.end()) return CUDA_ERROR_NOT_FOUND;
    uintptr_t b = it->first;
    size_t n = it->second.size;
    if (it->second.kind == RegionKind::kReservation) {
      // The allocation is the mapping that holds dptr, not the reservation.
      auto m = g_mappings.upper_bound(dptr);
      if (m == g_mappings.begin() || dptr >= std::prev(m)->first + std::prev(m)->second.size) return CUDA_ERROR_NOT_FOUND;
      b = std::prev(m)->first;
      n = std::prev(m)->second.size;
    }
    if (base != nullptr) *base = b;
    if (size != nullptr) *size = n;
    extra += " base=" + Hex(b) + " size=" + std::to_string(n);
    return CUDA_SUCCESS;
  });
}

// --- virtual memory management

FAKE_EXPORT CUresult cuMemGetAllocationGranularity(size_t* granularity, const CUmemAllocationProp* prop,
                                                   CUmemAllocationGranularity_flags option) {
  return Call("cuMemGetAllocationGranularity", "option=" + std::to_string(option), [&](std::string&) {
    if (granularity == nullptr || !ValidProp(prop)) return CUDA_ERROR_INVALID_VALUE;
    if (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED)
      return CUDA_ERROR_INVALID_VALUE;
    *granularity = kGranularity;
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                         unsigned long long flags) {
  std::string args = "size=" + std::to_string(size) + " align=" + std::to_string(alignment) + " hint=" + Hex(addr);
  return Call("cuMemAddressReserve", args, [&](std::string& extra) {
    if (ptr == nullptr || size == 0 || size % kGranularity != 0 || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (alignment & (alignment - 1)) return CUDA_ERROR_INVALID_VALUE;
    size_t align = alignment > kGranularity ? alignment : kGranularity;
    void* p = nullptr;
    // The hint is honoured when that range is free (the restore path asks for
    // the same address again), else it is only a hint, as on the driver.
    if (addr != 0 && addr % align == 0) {
      void* at = ::mmap(Ptr(addr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE,
                        -1, 0);
      if (at == Ptr(addr)) p = at;
      else if (at != MAP_FAILED) ::munmap(at, size);  // a kernel without MAP_FIXED_NOREPLACE put it elsewhere
    }
    if (p == nullptr) p = MapAligned(size, align, PROT_NONE, 0);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    std::unique_lock lock(g_mem_mu);
    g_regions[reinterpret_cast<uintptr_t>(p)] = {size, size, RegionKind::kReservation};
    *ptr = reinterpret_cast<uintptr_t>(p);
    extra += " ptr=" + Hex(*ptr);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  return Call("cuMemAddressFree", "ptr=" + Hex(ptr) + " size=" + std::to_string(size), [&](std::string&) {
    std::unique_lock lock(g_mem_mu);
    auto it = g_regions.find(ptr);
    if (it == g_regions.end() || it->second.kind != RegionKind::kReservation || it->second.size != size)
      return CUDA_ERROR_INVALID_VALUE;
    // Stricter than the driver documents: freeing a range that still has
    // mappings is a bug in the caller, and here it is reported as one.
    auto m = g_mappings.lower_bound(ptr);
    if (m != g_mappings.end() && m->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
    ::munmap(Ptr(ptr), size);
    g_regions.erase(it);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                                 unsigned long long flags) {
  std::string args = "size=" + std::to_string(size) + " device=" + std::to_string(prop ? prop->location.id : -1);
  return Call("cuMemCreate", args, [&](std::string& extra) {
    if (handle == nullptr || size == 0 || size % kGranularity != 0 || flags != 0 || !ValidProp(prop))
      return CUDA_ERROR_INVALID_VALUE;
    std::unique_lock lock(g_mem_mu);
    if (g_device_bytes_used + size > DeviceMemoryBytes()) return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = ::memfd_create("fake-cuda-vmm", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      ::close(fd);
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUmemGenericAllocationHandle id = g_next_handle++;
    g_handles[id] = {fd, size, prop->location.id, prop->requestedHandleTypes, 1, 0, true};
    g_device_bytes_used += size;
    *handle = id;
    extra += " handle=" + Hex(id);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  return Call("cuMemRelease", "handle=" + Hex(handle), [&](std::string&) {
    std::unique_lock lock(g_mem_mu);
    auto it = g_handles.find(handle);
    if (it == g_handles.end() || it->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
    --it->second.refs;
    MaybeFreeHandle(it);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                              unsigned long long flags) {
  std::string args = "ptr=" + Hex(ptr) + " size=" + std::to_string(size) + " offset=" + std::to_string(offset) +
                     " handle=" + Hex(handle);
  return Call("cuMemMap", args, [&](std::string&) {
    // The driver documents offset as "currently must be zero".
    if (size == 0 || size % kGranularity != 0 || ptr % kGranularity != 0 || offset != 0 || flags != 0)
      return CUDA_ERROR_INVALID_VALUE;
    std::unique_lock lock(g_mem_mu);
    auto h = g_handles.find(handle);
    if (h == g_handles.end() || h->second.refs == 0 || offset + size > h->second.size) return CUDA_ERROR_INVALID_VALUE;
    auto r = RegionAt(ptr);
    if (r == g_regions.end() || r->second.kind != RegionKind::kReservation || ptr + size > r->first + r->second.size)
      return CUDA_ERROR_INVALID_VALUE;
    auto next = g_mappings.lower_bound(ptr);
    if (next != g_mappings.end() && next->first < ptr + size) return CUDA_ERROR_INVALID_VALUE;
    if (next != g_mappings.begin() && std::prev(next)->first + std::prev(next)->second.size > ptr)
      return CUDA_ERROR_INVALID_VALUE;
    // PROT_NONE until cuMemSetAccess, as on the driver.
    if (::mmap(Ptr(ptr), size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->second.fd, static_cast<off_t>(offset)) ==
        MAP_FAILED)
      return CUDA_ERROR_OUT_OF_MEMORY;
    g_mappings[ptr] = {size, handle, PROT_NONE};
    ++h->second.mappings;
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc* desc, size_t count) {
  std::string args = "ptr=" + Hex(ptr) + " size=" + std::to_string(size) + " count=" + std::to_string(count);
  return Call("cuMemSetAccess", args, [&](std::string& extra) {
    if (desc == nullptr || count == 0 || size == 0) return CUDA_ERROR_INVALID_VALUE;
    // Every device sees the same host pages, so the widest access asked wins.
    int prot = PROT_NONE;
    for (size_t i = 0; i < count; ++i) {
      if (desc[i].location.type != CU_MEM_LOCATION_TYPE_DEVICE || !ValidDevice(desc[i].location.id))
        return CUDA_ERROR_INVALID_DEVICE;
      if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE) prot |= PROT_READ | PROT_WRITE;
      else if (desc[i].flags == CU_MEM_ACCESS_FLAGS_PROT_READ) prot |= PROT_READ;
      else if (desc[i].flags != CU_MEM_ACCESS_FLAGS_PROT_NONE) return CUDA_ERROR_INVALID_VALUE;
    }
    std::unique_lock lock(g_mem_mu);
    auto mappings = WholeMappings(ptr, size);
    if (mappings.empty()) return CUDA_ERROR_INVALID_VALUE;
    if (::mprotect(Ptr(ptr), size, prot) != 0) return CUDA_ERROR_INVALID_VALUE;
    for (auto& m : mappings) m->second.prot = prot;
    extra += " prot=" + std::to_string(prot);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  return Call("cuMemUnmap", "ptr=" + Hex(ptr) + " size=" + std::to_string(size), [&](std::string&) {
    std::unique_lock lock(g_mem_mu);
    auto mappings = WholeMappings(ptr, size);
    if (mappings.empty()) return CUDA_ERROR_INVALID_VALUE;
    // The reservation stays: the range goes back to inaccessible, unbacked memory.
    if (::mmap(Ptr(ptr), size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
      return CUDA_ERROR_UNKNOWN;
    for (auto& m : mappings) {
      auto h = g_handles.find(m->second.handle);
      g_mappings.erase(m);
      if (h == g_handles.end()) continue;
      --h->second.mappings;
      MaybeFreeHandle(h);
    }
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                                  CUmemAllocationHandleType type, unsigned long long flags) {
  return Call("cuMemExportToShareableHandle", "handle=" + Hex(handle) + " type=" + std::to_string(type),
              [&](std::string& extra) {
    if (shareable == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR || flags != 0)
      return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_mem_mu);
    auto h = g_handles.find(handle);
    if (h == g_handles.end() || h->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
    // As on the driver: only a handle created for this kind of export.
    if (!(h->second.requested_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) return CUDA_ERROR_INVALID_VALUE;
    int fd = ::fcntl(h->second.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    std::memcpy(shareable, &fd, sizeof fd);
    extra += " fd=" + std::to_string(fd);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                                    CUmemAllocationHandleType type) {
  int shared_fd = static_cast<int>(reinterpret_cast<uintptr_t>(os_handle));
  return Call("cuMemImportFromShareableHandle", "fd=" + std::to_string(shared_fd), [&](std::string& extra) {
    if (handle == nullptr || type != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) return CUDA_ERROR_INVALID_VALUE;
    struct stat st {};
    if (::fstat(shared_fd, &st) != 0 || st.st_size <= 0 || st.st_size % static_cast<off_t>(kGranularity) != 0)
      return CUDA_ERROR_INVALID_VALUE;
    int fd = ::fcntl(shared_fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_OUT_OF_MEMORY;
    std::unique_lock lock(g_mem_mu);
    // Memory this process created keeps its device and is counted once;
    // memory of another process is on device 0.
    int device = 0;
    bool ours = false;
    for (const auto& [id, h] : g_handles) {
      struct stat other {};
      if (::fstat(h.fd, &other) == 0 && other.st_dev == st.st_dev && other.st_ino == st.st_ino) {
        device = h.device;
        ours = true;
      }
    }
    CUmemGenericAllocationHandle id = g_next_handle++;
    size_t size = static_cast<size_t>(st.st_size);
    g_handles[id] = {fd, size, device, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1, 0, !ours};
    if (!ours) g_device_bytes_used += size;
    *handle = id;
    extra += " handle=" + Hex(id) + " size=" + std::to_string(size);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  return Call("cuMemRetainAllocationHandle", "ptr=" + Hex(reinterpret_cast<uintptr_t>(addr)), [&](std::string& extra) {
    if (handle == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::unique_lock lock(g_mem_mu);
    uintptr_t p = reinterpret_cast<uintptr_t>(addr);
    auto m = g_mappings.upper_bound(p);
    if (m == g_mappings.begin() || p >= std::prev(m)->first + std::prev(m)->second.size) return CUDA_ERROR_INVALID_VALUE;
    auto h = g_handles.find(std::prev(m)->second.handle);
    if (h == g_handles.end()) return CUDA_ERROR_INVALID_VALUE;
    ++h->second.refs;
    *handle = h->first;
    extra += " handle=" + Hex(h->first);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp* prop,
                                                            CUmemGenericAllocationHandle handle) {
  return Call("cuMemGetAllocationPropertiesFromHandle", "handle=" + Hex(handle), [&](std::string&) {
    if (prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_mem_mu);
    auto h = g_handles.find(handle);
    if (h == g_handles.end() || h->second.refs == 0) return CUDA_ERROR_INVALID_VALUE;
    *prop = CUmemAllocationProp{};
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = static_cast<CUmemAllocationHandleType>(h->second.requested_types);
    prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop->location.id = h->second.device;
    return CUDA_SUCCESS;
  });
}

// --- copies and sets (streams run synchronously in the fake)

FAKE_EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  return Copy("cuMemcpyDtoH_v2", dst, Ptr(src), n, nullptr,
              [&] { return DeviceOk(src, n, PROT_READ) && HostOk(dst, n, PROT_READ | PROT_WRITE); });
}

FAKE_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  return Copy("cuMemcpyHtoD_v2", Ptr(dst), src, n, nullptr,
              [&] { return DeviceOk(dst, n, PROT_READ | PROT_WRITE) && HostOk(src, n, PROT_READ); });
}

FAKE_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return Copy("cuMemcpyDtoD_v2", Ptr(dst), Ptr(src), n, nullptr,
              [&] { return DeviceOk(dst, n, PROT_READ | PROT_WRITE) && DeviceOk(src, n, PROT_READ); });
}

// Unified addressing: either side may be host memory.
FAKE_EXPORT CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n) {
  return Copy("cuMemcpy", Ptr(dst), Ptr(src), n, nullptr,
              [&] { return HostOk(Ptr(dst), n, PROT_READ | PROT_WRITE) && HostOk(Ptr(src), n, PROT_READ); });
}

FAKE_EXPORT CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  return Copy("cuMemcpyAsync", Ptr(dst), Ptr(src), n, stream,
              [&] { return HostOk(Ptr(dst), n, PROT_READ | PROT_WRITE) && HostOk(Ptr(src), n, PROT_READ); });
}

FAKE_EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t n, CUstream stream) {
  return Copy("cuMemcpyDtoHAsync_v2", dst, Ptr(src), n, stream,
              [&] { return DeviceOk(src, n, PROT_READ) && HostOk(dst, n, PROT_READ | PROT_WRITE); });
}

FAKE_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t n, CUstream stream) {
  return Copy("cuMemcpyHtoDAsync_v2", Ptr(dst), src, n, stream,
              [&] { return DeviceOk(dst, n, PROT_READ | PROT_WRITE) && HostOk(src, n, PROT_READ); });
}

FAKE_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream stream) {
  return Copy("cuMemcpyDtoDAsync_v2", Ptr(dst), Ptr(src), n, stream,
              [&] { return DeviceOk(dst, n, PROT_READ | PROT_WRITE) && DeviceOk(src, n, PROT_READ); });
}

FAKE_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
  return Set("cuMemsetD8_v2", dst, value, 1, n, nullptr);
}

FAKE_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream stream) {
  return Set("cuMemsetD8Async", dst, value, 1, n, stream);
}

FAKE_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dst, unsigned int value, size_t n) {
  return Set("cuMemsetD32_v2", dst, value, 4, n, nullptr);
}

FAKE_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t n, CUstream stream) {
  return Set("cuMemsetD32Async", dst, value, 4, n, stream);
}

// --- streams and events

namespace {
CUresult NewToken(const char* fn, void** out, std::map<void*, long long>& table, const std::string& args) {
  return Call(fn, args, [&](std::string& extra) {
    if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
    void* token = new char;
    std::lock_guard<std::mutex> lock(g_obj_mu);
    table[token] = 0;
    *out = token;
    extra += " handle=" + Hex(reinterpret_cast<uintptr_t>(token));
    return CUDA_SUCCESS;
  });
}

CUresult DropToken(const char* fn, void* token, std::map<void*, long long>& table) {
  return Call(fn, "handle=" + Hex(reinterpret_cast<uintptr_t>(token)), [&](std::string&) {
    std::lock_guard<std::mutex> lock(g_obj_mu);
    auto it = table.find(token);
    if (it == table.end()) return kInvalidHandle;
    table.erase(it);
    delete static_cast<char*>(token);
    return CUDA_SUCCESS;
  });
}

bool ValidEvent(void* e) {
  std::lock_guard<std::mutex> lock(g_obj_mu);
  return g_events.count(e) > 0;
}
}  // namespace

FAKE_EXPORT CUresult cuStreamCreate(CUstream* stream, unsigned int flags) {
  return NewToken("cuStreamCreate", reinterpret_cast<void**>(stream), g_streams, "flags=" + std::to_string(flags));
}

FAKE_EXPORT CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned int flags, int priority) {
  return NewToken("cuStreamCreateWithPriority", reinterpret_cast<void**>(stream), g_streams,
                  "flags=" + std::to_string(flags) + " priority=" + std::to_string(priority));
}

FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream stream) { return DropToken("cuStreamDestroy_v2", stream, g_streams); }

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream stream) {
  return Call("cuStreamSynchronize", "stream=" + Hex(reinterpret_cast<uintptr_t>(stream)),
              [&](std::string&) { return ValidStream(stream) ? CUDA_SUCCESS : kInvalidHandle; });
}

FAKE_EXPORT CUresult cuStreamQuery(CUstream stream) {
  return Call("cuStreamQuery", "stream=" + Hex(reinterpret_cast<uintptr_t>(stream)),
              [&](std::string&) { return ValidStream(stream) ? CUDA_SUCCESS : kInvalidHandle; });
}

struct CUevent_st;
FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent_st* event, unsigned int flags) {
  return Call("cuStreamWaitEvent", "stream=" + Hex(reinterpret_cast<uintptr_t>(stream)) + " flags=" + std::to_string(flags),
              [&](std::string&) { return ValidStream(stream) && ValidEvent(event) ? CUDA_SUCCESS : kInvalidHandle; });
}

FAKE_EXPORT CUresult cuEventCreate(CUevent_st** event, unsigned int flags) {
  return NewToken("cuEventCreate", reinterpret_cast<void**>(event), g_events, "flags=" + std::to_string(flags));
}

FAKE_EXPORT CUresult cuEventRecord(CUevent_st* event, CUstream stream) {
  return Call("cuEventRecord", "handle=" + Hex(reinterpret_cast<uintptr_t>(event)), [&](std::string&) {
    if (!ValidStream(stream)) return kInvalidHandle;
    std::lock_guard<std::mutex> lock(g_obj_mu);
    auto it = g_events.find(event);
    if (it == g_events.end()) return kInvalidHandle;
    it->second = NowNs();
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent_st* event) {
  return Call("cuEventSynchronize", "handle=" + Hex(reinterpret_cast<uintptr_t>(event)),
              [&](std::string&) { return ValidEvent(event) ? CUDA_SUCCESS : kInvalidHandle; });
}

FAKE_EXPORT CUresult cuEventQuery(CUevent_st* event) {
  return Call("cuEventQuery", "handle=" + Hex(reinterpret_cast<uintptr_t>(event)),
              [&](std::string&) { return ValidEvent(event) ? CUDA_SUCCESS : kInvalidHandle; });
}

FAKE_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent_st* start_event, CUevent_st* end_event) {
  return Call("cuEventElapsedTime", "", [&](std::string&) {
    if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g_obj_mu);
    auto a = g_events.find(start_event), b = g_events.find(end_event);
    if (a == g_events.end() || b == g_events.end()) return kInvalidHandle;
    if (a->second == 0 || b->second == 0) return CUDA_ERROR_NOT_READY;
    *ms = static_cast<float>(b->second - a->second) / 1e6f;
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent_st* event) { return DropToken("cuEventDestroy_v2", event, g_events); }

// --- modules: the fingerprint kernel's only

namespace {
char g_fingerprint_module;  // the one module's token
}

FAKE_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return Call("cuModuleLoadData", "", [&](std::string&) {
    if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
    std::string entry = std::string(".entry ") + gpusnap::gpushare::kFingerprintKernelName + "(";
    if (std::strstr(static_cast<const char*>(image), entry.c_str()) == nullptr) return kInvalidImage;
    *module = reinterpret_cast<CUmodule>(&g_fingerprint_module);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
  return Call("cuModuleGetFunction", std::string("name=") + (name ? name : "(null)"), [&](std::string&) {
    if (function == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (module != reinterpret_cast<CUmodule>(&g_fingerprint_module)) return kInvalidHandle;
    if (std::strcmp(name, gpusnap::gpushare::kFingerprintKernelName) != 0) return CUDA_ERROR_NOT_FOUND;
    *function = FingerprintFunction();
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuModuleUnload(CUmodule module) {
  return Call("cuModuleUnload", "", [&](std::string&) {
    return module == reinterpret_cast<CUmodule>(&g_fingerprint_module) ? CUDA_SUCCESS : kInvalidHandle;
  });
}

// --- launches: `f` is a host function void(void** kernel_params), run at once

FAKE_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                                    unsigned int block_x, unsigned int block_y, unsigned int block_z,
                                    unsigned int shared_mem_bytes, CUstream stream, void** kernel_params,
                                    void** extra) {
  (void)shared_mem_bytes;
  (void)extra;
  return Launch("cuLaunchKernel", f, grid_x, grid_y, grid_z, block_x, block_y, block_z, stream, kernel_params);
}

FAKE_EXPORT CUresult cuLaunchKernelEx(const FakeLaunchConfig* config, CUfunction f, void** kernel_params,
                                      void** extra) {
  (void)extra;
  if (config == nullptr)
    return Call("cuLaunchKernelEx", "", [](std::string&) { return CUDA_ERROR_INVALID_VALUE; });
  return Launch("cuLaunchKernelEx", f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                config->blockDimY, config->blockDimZ, config->hStream, kernel_params);
}

// --- pinned host memory

FAKE_EXPORT CUresult cuMemHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
  return HostAllocate("cuMemHostAlloc", ptr, bytes, flags);
}

FAKE_EXPORT CUresult cuMemAllocHost_v2(void** ptr, size_t bytes) {
  return HostAllocate("cuMemAllocHost_v2", ptr, bytes, 0);
}

FAKE_EXPORT CUresult cuMemFreeHost(void* ptr) {
  return Call("cuMemFreeHost", "ptr=" + Hex(reinterpret_cast<uintptr_t>(ptr)), [&](std::string&) {
    std::unique_lock lock(g_mem_mu);
    auto it = g_regions.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_regions.end() || it->second.kind != RegionKind::kHostAlloc) return CUDA_ERROR_INVALID_VALUE;
    ::munmap(ptr, it->second.mapped);
    g_regions.erase(it);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemHostRegister_v2(void* ptr, size_t bytes, unsigned int flags) {
  std::string args = "ptr=" + Hex(reinterpret_cast<uintptr_t>(ptr)) + " size=" + std::to_string(bytes) +
                     " flags=" + std::to_string(flags);
  return Call("cuMemHostRegister_v2", args, [&](std::string&) {
    if (ptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    std::unique_lock lock(g_mem_mu);
    if (OverlapsRegion(reinterpret_cast<uintptr_t>(ptr), bytes)) return kAlreadyRegistered;
    g_regions[reinterpret_cast<uintptr_t>(ptr)] = {bytes, bytes, RegionKind::kHostRegistered};
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemHostUnregister(void* ptr) {
  return Call("cuMemHostUnregister", "ptr=" + Hex(reinterpret_cast<uintptr_t>(ptr)), [&](std::string&) {
    std::unique_lock lock(g_mem_mu);
    auto it = g_regions.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_regions.end() || it->second.kind != RegionKind::kHostRegistered) return kNotRegistered;
    g_regions.erase(it);
    return CUDA_SUCCESS;
  });
}

FAKE_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* dptr, void* ptr, unsigned int flags) {
  return Call("cuMemHostGetDevicePointer_v2", "ptr=" + Hex(reinterpret_cast<uintptr_t>(ptr)), [&](std::string&) {
    if (dptr == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::shared_lock lock(g_mem_mu);
    auto it = RegionAt(reinterpret_cast<uintptr_t>(ptr));
    if (it == g_regions.end() ||
        (it->second.kind != RegionKind::kHostAlloc && it->second.kind != RegionKind::kHostRegistered))
      return CUDA_ERROR_INVALID_VALUE;
    *dptr = reinterpret_cast<uintptr_t>(ptr);  // unified addressing: the same address
    return CUDA_SUCCESS;
  });
}

// --- entry points by name, as cudart fetches them

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* status);
FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags);

namespace {

#define FAKE_ENTRY(name) {#name, reinterpret_cast<void*>(&name)}
// A table rather than dlsym on this library: a preloaded shim that intercepts
// dlsym must not get its own wrappers back from the driver, or it would end
// up calling itself.
const std::map<std::string, void*>& EntryPoints() {
  static const std::map<std::string, void*> table = {
      FAKE_ENTRY(cuInit), FAKE_ENTRY(cuDriverGetVersion), FAKE_ENTRY(cuGetErrorName), FAKE_ENTRY(cuGetErrorString),
      FAKE_ENTRY(cuDeviceGetCount), FAKE_ENTRY(cuDeviceGet), FAKE_ENTRY(cuDeviceGetName),
      FAKE_ENTRY(cuDeviceGetUuid), FAKE_ENTRY(cuDeviceGetUuid_v2), FAKE_ENTRY(cuDeviceTotalMem_v2),
      FAKE_ENTRY(cuDeviceGetAttribute), FAKE_ENTRY(cuCheckpointProcessGetState),
      FAKE_ENTRY(cuCheckpointProcessGetRestoreThreadId),
#ifndef FAKE_CUDA_OMIT_LOCK
      FAKE_ENTRY(cuCheckpointProcessLock),
#endif
      FAKE_ENTRY(cuCheckpointProcessCheckpoint), FAKE_ENTRY(cuCheckpointProcessRestore),
      FAKE_ENTRY(cuCheckpointProcessUnlock), FAKE_ENTRY(cuGetProcAddress), FAKE_ENTRY(cuGetProcAddress_v2),
      FAKE_ENTRY(cuDevicePrimaryCtxRetain), FAKE_ENTRY(cuDevicePrimaryCtxRelease_v2),
      FAKE_ENTRY(cuDevicePrimaryCtxGetState), FAKE_ENTRY(cuCtxSetCurrent), FAKE_ENTRY(cuCtxGetCurrent),
      FAKE_ENTRY(cuCtxPushCurrent_v2), FAKE_ENTRY(cuCtxPopCurrent_v2), FAKE_ENTRY(cuCtxGetDevice),
      FAKE_ENTRY(cuCtxSynchronize), FAKE_ENTRY(cuMemAlloc_v2), FAKE_ENTRY(cuMemFree_v2), FAKE_ENTRY(cuMemGetInfo_v2),
      FAKE_ENTRY(cuMemGetAddressRange_v2), FAKE_ENTRY(cuMemGetAllocationGranularity),
      FAKE_ENTRY(cuMemAddressReserve), FAKE_ENTRY(cuMemAddressFree), FAKE_ENTRY(cuMemCreate),
      FAKE_ENTRY(cuMemRelease), FAKE_ENTRY(cuMemMap), FAKE_ENTRY(cuMemSetAccess), FAKE_ENTRY(cuMemUnmap),
      FAKE_ENTRY(cuMemExportToShareableHandle), FAKE_ENTRY(cuMemImportFromShareableHandle),
      FAKE_ENTRY(cuMemRetainAllocationHandle), FAKE_ENTRY(cuMemGetAllocationPropertiesFromHandle),
      FAKE_ENTRY(cuMemcpyDtoH_v2), FAKE_ENTRY(cuMemcpyHtoD_v2), FAKE_ENTRY(cuMemcpyDtoD_v2), FAKE_ENTRY(cuMemcpy),
      FAKE_ENTRY(cuMemcpyAsync), FAKE_ENTRY(cuMemcpyDtoHAsync_v2), FAKE_ENTRY(cuMemcpyHtoDAsync_v2),
      FAKE_ENTRY(cuMemcpyDtoDAsync_v2), FAKE_ENTRY(cuMemsetD8_v2), FAKE_ENTRY(cuMemsetD8Async),
      FAKE_ENTRY(cuMemsetD32_v2), FAKE_ENTRY(cuMemsetD32Async), FAKE_ENTRY(cuStreamCreate),
      FAKE_ENTRY(cuStreamCreateWithPriority), FAKE_ENTRY(cuStreamDestroy_v2), FAKE_ENTRY(cuStreamSynchronize),
      FAKE_ENTRY(cuStreamQuery), FAKE_ENTRY(cuStreamWaitEvent), FAKE_ENTRY(cuEventCreate), FAKE_ENTRY(cuEventRecord),
      FAKE_ENTRY(cuEventSynchronize), FAKE_ENTRY(cuEventQuery), FAKE_ENTRY(cuEventElapsedTime),
      FAKE_ENTRY(cuEventDestroy_v2), FAKE_ENTRY(cuLaunchKernel), FAKE_ENTRY(cuLaunchKernelEx),
      FAKE_ENTRY(cuMemHostAlloc), FAKE_ENTRY(cuMemAllocHost_v2), FAKE_ENTRY(cuMemFreeHost),
      FAKE_ENTRY(cuMemHostRegister_v2), FAKE_ENTRY(cuMemHostUnregister), FAKE_ENTRY(cuMemHostGetDevicePointer_v2),
      FAKE_ENTRY(cuIpcGetMemHandle), FAKE_ENTRY(cuIpcOpenMemHandle_v2), FAKE_ENTRY(cuIpcCloseMemHandle),
      FAKE_ENTRY(cuModuleLoadData), FAKE_ENTRY(cuModuleGetFunction), FAKE_ENTRY(cuModuleUnload),
  };
  return table;
}
#undef FAKE_ENTRY

// The CUDA version from which the driver hands out the _v2 ABI of a name; a
// name not listed gets its _v2 (when the fake has one) for any version.
int V2Since(const std::string& name) {
  static const std::map<std::string, int> since = {
      {"cuDeviceGetUuid", 11040}, {"cuGetProcAddress", 12000}, {"cuDevicePrimaryCtxRelease", 11000},
      {"cuMemHostRegister", 6050}, {"cuIpcOpenMemHandle", 11000}};
  auto it = since.find(name);
  return it == since.end() ? 0 : it->second;
}

// What cuGetProcAddress answers for `symbol`: the _v2 ABI when the caller's
// CUDA version has it, else the name itself. (Per-thread-stream variants,
// asked for through `flags`, are the same functions in the fake.)
void* Resolve(const std::string& symbol, int cuda_version) {
  const auto& table = EntryPoints();
  if (cuda_version >= V2Since(symbol)) {
    if (auto it = table.find(symbol + "_v2"); it != table.end()) return it->second;
  }
  auto it = table.find(symbol);
  return it == table.end() ? nullptr : it->second;
}

}  // namespace

FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* status) {
  std::string args = "symbol=" + std::string(symbol ? symbol : "(null)") + " version=" + std::to_string(cuda_version) +
                     " flags=" + std::to_string(flags);
  // Before cuInit too: cudart fetches cuInit itself through here.
  return Call("cuGetProcAddress_v2", args, [&](std::string&) {
    if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pfn = Resolve(symbol, cuda_version);
    if (*pfn == nullptr) return CUDA_ERROR_NOT_FOUND;
    if (status != nullptr) *status = CU_GET_PROC_ADDRESS_SUCCESS;
    return CUDA_SUCCESS;
  }, false);
}

FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags) {
  std::string args = "symbol=" + std::string(symbol ? symbol : "(null)") + " version=" + std::to_string(cuda_version) +
                     " flags=" + std::to_string(flags);
  return Call("cuGetProcAddress", args, [&](std::string&) {
    if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *pfn = Resolve(symbol, cuda_version);
    return *pfn == nullptr ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
  }, false);
}
