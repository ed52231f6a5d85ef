// Shared by the GPU test workloads: fail loudly on a CUDA error, and a cheap
// well-mixed 64-bit pattern (splitmix64's finaliser).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

// Prints "CUDA error <name> at file:line: <text>" on stdout (where the test
// harness looks) and exits 2.
#define CHECK(call)                                                                            \
  do {                                                                                         \
    cudaError_t err_ = (call);                                                                 \
    if (err_ != cudaSuccess) {                                                                 \
      std::printf("CUDA error %s at %s:%d: %s\n", cudaGetErrorName(err_), __FILE__, __LINE__, \
                  cudaGetErrorString(err_));                                                   \
      std::exit(2);                                                                            \
    }                                                                                          \
  } while (0)

__host__ __device__ inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
