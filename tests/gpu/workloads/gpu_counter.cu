// gpu_counter: holds N GiB of device memory in a known pattern and advances it
// one step at a time, checking itself, so that a GPU checkpoint and restore
// (or a move to another GPU) in between must be invisible.
//
// After `s` steps, word i of the buffer is Seed(i) + s * Stride(i) (mod 2^64).
// Each step one kernel checks every word against that closed form, adds
// Stride(i) and sums the new words. The host knows what the sum must be:
// S0 + s * K, where S0 and K (the sums of the seeds and strides) are computed
// once at start. Prints one line per step:
//   step <s> checksum <hex> mismatches <m>
// and exits 1 with a line starting "MISMATCH" at the first wrong word or sum.
//
// With --static-gib S it also holds S GiB written once (word i: Seed(~i)) and
// only read after: each step checks all of it, and counts its wrong words
// among the step's mismatches. Memory that never changes, as a server's
// weights: a release finds its chunks unchanged since they were stored.
//
// Usage: gpu_counter [--gib N (4)] [--static-gib S (0)] [--interval-ms MS (200)] [--steps N (0: forever)]
//                    [--device D (0)]
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "check.cuh"

__host__ __device__ inline uint64_t Seed(uint64_t i) { return Mix(i); }
__host__ __device__ inline uint64_t Stride(uint64_t i) { return Mix(i ^ 0x5bd1e995ull) | 1; }

struct Sums {
  unsigned long long sum;
  unsigned long long mismatches;
};

__device__ void Accumulate(Sums* out, uint64_t sum, uint64_t bad) {
  for (int off = 16; off > 0; off /= 2) {
    sum += __shfl_down_sync(0xffffffffu, sum, off);
    bad += __shfl_down_sync(0xffffffffu, bad, off);
  }
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&out->sum, static_cast<unsigned long long>(sum));
    if (bad) atomicAdd(&out->mismatches, static_cast<unsigned long long>(bad));
  }
}

// Fills the pattern for step 0 and sums seeds (into sums[0]) and strides (sums[1]).
__global__ void Init(uint64_t* a, size_t n, Sums* sums) {
  uint64_t s0 = 0, k = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    a[i] = Seed(i);
    s0 += Seed(i);
    k += Stride(i);
  }
  Accumulate(&sums[0], s0, 0);
  Accumulate(&sums[1], k, 0);
}

// Checks step `s`, advances to s + 1, sums the new words.
__global__ void Step(uint64_t* a, size_t n, uint64_t s, Sums* out) {
  uint64_t sum = 0, bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t v = a[i];
    if (v != Seed(i) + s * Stride(i)) ++bad;
    v += Stride(i);
    a[i] = v;
    sum += v;
  }
  Accumulate(out, sum, bad);
}

__global__ void InitStatic(uint64_t* a, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    a[i] = Seed(~i);
}

__global__ void CheckStatic(const uint64_t* a, size_t n, Sums* out) {
  uint64_t bad = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    if (a[i] != Seed(~i)) ++bad;
  Accumulate(out, 0, bad);
}

int main(int argc, char** argv) {
  double gib = 4, static_gib = 0;
  int interval_ms = 200, device = 0;
  long steps = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--gib")) gib = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--static-gib")) static_gib = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--interval-ms")) interval_ms = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--steps")) steps = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--device")) device = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--gib N] [--static-gib S] [--interval-ms MS] [--steps N] [--device D]\n",
                   argv[0]);
      return 64;
    }
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  CHECK(cudaSetDevice(device));
  size_t n = static_cast<size_t>(gib * (1ull << 30)) / sizeof(uint64_t);
  uint64_t* a = nullptr;
  Sums* sums = nullptr;
  CHECK(cudaMalloc(&a, n * sizeof(uint64_t)));
  CHECK(cudaMalloc(&sums, 3 * sizeof(Sums)));
  CHECK(cudaMemset(sums, 0, 3 * sizeof(Sums)));
  const int blocks = 1024, threads = 256;
  size_t n_static = static_cast<size_t>(static_gib * (1ull << 30)) / sizeof(uint64_t);
  uint64_t* fixed = nullptr;
  if (n_static > 0) {
    CHECK(cudaMalloc(&fixed, n_static * sizeof(uint64_t)));
    InitStatic<<<blocks, threads>>>(fixed, n_static);
    CHECK(cudaGetLastError());
  }
  Init<<<blocks, threads>>>(a, n, sums);
  CHECK(cudaGetLastError());
  Sums init[2];
  CHECK(cudaMemcpy(init, sums, sizeof init, cudaMemcpyDeviceToHost));
  const uint64_t s0 = init[0].sum, k = init[1].sum;
  char bus[32] = "?";
  cudaDeviceGetPCIBusId(bus, sizeof bus, device);
  std::printf("gpu_counter pid %d device %d bus %s bytes %zu static %zu\n", getpid(), device, bus,
              n * sizeof(uint64_t), n_static * sizeof(uint64_t));
  for (uint64_t s = 0; steps == 0 || static_cast<long>(s) < steps; ++s) {
    CHECK(cudaMemset(&sums[2], 0, sizeof(Sums)));
    Step<<<blocks, threads>>>(a, n, s, &sums[2]);
    CHECK(cudaGetLastError());
    if (n_static > 0) {
      CheckStatic<<<blocks, threads>>>(fixed, n_static, &sums[2]);
      CHECK(cudaGetLastError());
    }
    Sums got;
    CHECK(cudaMemcpy(&got, &sums[2], sizeof got, cudaMemcpyDeviceToHost));
    uint64_t want = s0 + (s + 1) * k;
    std::printf("step %llu checksum %016llx mismatches %llu\n", static_cast<unsigned long long>(s + 1),
                static_cast<unsigned long long>(got.sum), static_cast<unsigned long long>(got.mismatches));
    if (got.mismatches != 0 || got.sum != want) {
      std::printf("MISMATCH at step %llu: %llu wrong words, checksum %016llx, expected %016llx\n",
                  static_cast<unsigned long long>(s + 1), static_cast<unsigned long long>(got.mismatches),
                  static_cast<unsigned long long>(got.sum), static_cast<unsigned long long>(want));
      return 1;
    }
    if (interval_ms > 0) usleep(static_cast<useconds_t>(interval_ms) * 1000);
  }
  return 0;
}
