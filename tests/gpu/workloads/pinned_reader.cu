// pinned_reader: a CPU thread reads a pinned host buffer (cudaMallocHost) in a
// loop and checks every word, while the main thread round-trips the buffer
// through the GPU and checks the copy. It shows what a GPU checkpoint does to
// pinned host memory that a CPU thread keeps touching (docs/GPU-CHECKPOINT.md,
// "Checkpoint", step 3: the driver may unmap it; CPU threads are frozen first).
//
// SIGUSR1 asks the reader to pause (it prints "reader paused" once it is out
// of the buffer); SIGUSR2 lets it go on ("reader resumed"). A fault in the
// reader prints "reader: SIGSEGV ..." and exits 3. Prints once per round trip:
//   step <n> reads <rounds> ok
// and, from the reader, "reader rounds <n>" every second.
// and "MISMATCH ..." then exits 1 at the first wrong word.
//
// With --write 1 the reader also stores every word back (the same value).
//
// Usage: pinned_reader [--mib N (256)] [--interval-ms MS (200)] [--steps N (0: forever)] [--write 0|1]
#include <cuda_runtime.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "check.cuh"

__host__ __device__ inline uint64_t Pattern(uint64_t i) { return Mix(i); }

__global__ void Check(const uint64_t* d, size_t n, unsigned long long* bad) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (d[i] != Pattern(i)) atomicAdd(bad, 1ull);
}

static std::atomic<bool> g_pause{false};
static std::atomic<unsigned long long> g_rounds{0};
static const uint64_t* g_buf = nullptr;
static size_t g_bytes = 0;
static bool g_write = false;

static void OnSegv(int, siginfo_t* info, void*) {
  char line[160];
  const char* addr = static_cast<const char*>(info->si_addr);
  const char* base = reinterpret_cast<const char*>(g_buf);
  long off = addr >= base && addr < base + g_bytes ? static_cast<long>(addr - base) : -1;
  int len = std::snprintf(line, sizeof line, "reader: SIGSEGV at %p (pinned buffer offset %ld) after %llu rounds\n",
                          info->si_addr, off, g_rounds.load());
  ssize_t ignored = write(1, line, static_cast<size_t>(len));
  (void)ignored;
  _exit(3);
}

static void OnPause(int sig) { g_pause.store(sig == SIGUSR1); }

static double Now() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Reads and checks the whole buffer again and again; says every second how
// far it got, so its progress shows even while the main thread is blocked in
// a locked CUDA call.
static void Reader(size_t n) {
  bool paused = false;
  double next_report = Now() + 1;
  for (;;) {
    if (Now() >= next_report) {
      std::printf("reader rounds %llu\n", g_rounds.load());
      next_report += 1;
    }
    if (g_pause.load() != paused) {
      paused = g_pause.load();
      std::printf("reader %s\n", paused ? "paused" : "resumed");
    }
    if (paused) {
      usleep(1000);
      continue;
    }
    for (size_t i = 0; i < n; ++i) {
      if (g_buf[i] != Pattern(i)) {
        std::printf("MISMATCH reader: word %zu is %016llx, expected %016llx\n", i,
                    static_cast<unsigned long long>(g_buf[i]), static_cast<unsigned long long>(Pattern(i)));
        std::exit(1);
      }
      if (g_write) const_cast<volatile uint64_t*>(g_buf)[i] = Pattern(i);
      if ((i & 0xfffff) == 0 && g_pause.load()) break;  // leave the buffer promptly when asked
    }
    g_rounds.fetch_add(1);
  }
}

int main(int argc, char** argv) {
  size_t mib = 256;
  int interval_ms = 200;
  long steps = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mib")) mib = std::strtoul(argv[i + 1], nullptr, 10);
    else if (!std::strcmp(argv[i], "--interval-ms")) interval_ms = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--write")) g_write = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "usage: %s [--mib N] [--interval-ms MS] [--steps N] [--write 0|1]\n", argv[0]);
      return 64;
    }
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  struct sigaction sa = {};
  sa.sa_sigaction = OnSegv;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &sa, nullptr);
  sigaction(SIGBUS, &sa, nullptr);
  signal(SIGUSR1, OnPause);
  signal(SIGUSR2, OnPause);

  g_bytes = mib << 20;
  size_t n = g_bytes / sizeof(uint64_t);
  uint64_t *host = nullptr, *back = nullptr, *dev = nullptr;
  unsigned long long* bad = nullptr;
  CHECK(cudaMallocHost(&host, g_bytes));
  CHECK(cudaMallocHost(&back, g_bytes));
  CHECK(cudaMalloc(&dev, g_bytes));
  CHECK(cudaMalloc(&bad, sizeof *bad));
  for (size_t i = 0; i < n; ++i) host[i] = Pattern(i);
  g_buf = host;
  std::thread(Reader, n).detach();
  std::printf("pinned_reader pid %d bytes %zu\n", getpid(), g_bytes);
  for (long s = 1; steps == 0 || s <= steps; ++s) {
    CHECK(cudaMemset(bad, 0, sizeof *bad));
    CHECK(cudaMemcpy(dev, host, g_bytes, cudaMemcpyHostToDevice));
    Check<<<1024, 256>>>(dev, n, bad);
    CHECK(cudaGetLastError());
    unsigned long long wrong = 0;
    CHECK(cudaMemcpy(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(back, dev, g_bytes, cudaMemcpyDeviceToHost));
    if (wrong != 0 || std::memcmp(back, host, g_bytes) != 0) {
      std::printf("MISMATCH at step %ld: %llu wrong words on the GPU\n", s, wrong);
      return 1;
    }
    std::printf("step %ld reads %llu ok\n", s, g_rounds.load());
    if (interval_ms > 0) usleep(static_cast<useconds_t>(interval_ms) * 1000);
  }
  return 0;
}
