// A fake libcuda.so.1 for machines without a GPU: the same entry points as the
// driver (those gpusnap resolves), with the checkpoint API's per-pid state
// machine RUNNING -> LOCKED -> CHECKPOINTED -> LOCKED -> RUNNING, so a wrong
// order fails as on the real driver (CUDA_ERROR_ILLEGAL_STATE).
//
// Loaded by gpusnap through its ordinary dlopen("libcuda.so.1"): put this
// library's directory first in LD_LIBRARY_PATH. Controlled by environment
// variables, read at every call (see docs/CUDA.md):
//   FAKE_CUDA_LOG=path           append one line per call:
//                                "t=<end ns> start=<start ns> tid=<tid> fn=<name> pid=<pid> rc=<CUresult> [k=v...]"
//                                (CLOCK_MONOTONIC; pid=0 for calls without one)
//   FAKE_CUDA_GPUS=n             number of GPUs (default 1); UUIDs GPU-5afec0da-0000-0000-0000-0000000000<nn>
//   FAKE_CUDA_FAIL=fn:pid:code[,...]  make `fn` return `code` for `pid` ('*': any pid) without changing state
//   FAKE_CUDA_DELAY_MS=n         sleep n ms in lock, checkpoint, restore and unlock (before the state changes)
//   FAKE_CUDA_DRIVER_VERSION=n   what cuDriverGetVersion says (default 13000)
//   FAKE_CUDA_HANG_MS=fn:ms      make one function take ms milliseconds
//   FAKE_CUDA_STATE_FILE=path    keep the per-pid states in this file, so they outlive the process
//   (a process mapping /dev/nvidia-gpusnap-test-* keeps its state in that file instead)
// A pid never seen is RUNNING. Built with -DFAKE_CUDA_OMIT_LOCK it lacks
// cuCheckpointProcessLock (for the missing-symbol test).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "cuda/driver_abi.h"

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
CUresult InjectedFailure(const char* fn, int pid) {
  const char* spec = std::getenv("FAKE_CUDA_FAIL");
  if (spec == nullptr) return CUDA_SUCCESS;
  std::string s = spec;
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
void Delay(const char* fn) {
  int ms = EnvInt("FAKE_CUDA_DELAY_MS", 0);
  if (const char* hang = std::getenv("FAKE_CUDA_HANG_MS")) {
    const char* colon = std::strchr(hang, ':');
    if (colon && std::strncmp(hang, fn, static_cast<size_t>(colon - hang)) == 0 && std::strlen(fn) == static_cast<size_t>(colon - hang))
      ms = std::atoi(colon + 1);
  }
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
  Log(start, "cuInit", 0, rc, "count=" + std::to_string(count));
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
