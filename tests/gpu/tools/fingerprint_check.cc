// gpusnap_fingerprint_check: the shim's fingerprint kernel (its PTX,
// src/gpushare/common/fingerprint_kernel.h) against the one definition of the
// fingerprint (chunk_fingerprint.h), on whatever libcuda.so.1 loads: on a GPU
// it proves the PTX computes the reference; on the fake driver of CI it only
// runs the launches (the fake computes the reference itself).
//
// It fills device memory with a known pattern, and checks, per chunk, that the
// GPU's fingerprints equal the reference over the same bytes on the host; then
// flips one byte deep inside one chunk and checks that exactly that chunk's
// fingerprint changed, on both sides alike; then times the kernel over
// --gib GiB. Prints one line per check and "fingerprint check ok" at the end;
// exits 1 at the first difference, 2 on a driver error.
//
// usage: gpusnap_fingerprint_check [--gib N (1)] [--device D (0)]
#include <dlfcn.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "chunks/chunk_store.h"
#include "gpushare/common/chunk_fingerprint.h"
#include "gpushare/common/driver_table.h"
#include "gpushare/common/fingerprint_kernel.h"

namespace {

using namespace gpusnap;
using namespace gpusnap::gpushare;

int Fail(const char* what) {
  std::printf("FAIL: %s\n", what);
  return 1;
}

#define DRIVER(call, name)                                               \
  do {                                                                   \
    if (abi::CUresult rc = (call); rc != abi::CUDA_SUCCESS) {            \
      std::printf("driver error: %s\n", d.Describe(name, rc).c_str());   \
      return 2;                                                          \
    }                                                                    \
  } while (0)

std::vector<ChunkFingerprint> Reference(const std::vector<unsigned char>& host) {
  std::vector<ChunkFingerprint> out;
  for (uint64_t off = 0; off < host.size(); off += chunks::kChunkBytes)
    out.push_back(FingerprintBytes(host.data() + off, std::min<uint64_t>(chunks::kChunkBytes, host.size() - off)));
  return out;
}

// Every check and the timing in the primary context `context`; 0, or
// main's exit code.
int Checks(RealDriver& d, uint64_t context, double gib) {
  // 4 chunks and a short one: 262 MiB of a pattern, the same on host and device.
  const uint64_t bytes = 4 * chunks::kChunkBytes + (6ull << 20);
  std::vector<unsigned char> host(bytes);
  uint64_t x = 0x2545f4914f6cdd1dull;
  for (auto& c : host) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<unsigned char>(x);
  }
  abi::CUdeviceptr buf = 0;
  DRIVER(d.mem_alloc(&buf, bytes), "cuMemAlloc");
  DRIVER(d.copy_htod_async(buf, host.data(), bytes, nullptr), "cuMemcpyHtoDAsync");
  DRIVER(d.ctx_synchronize(), "cuCtxSynchronize");

  FingerprintKernel kernel(d);
  auto gpu = kernel.Ranges({{buf, bytes, context}});
  if (!gpu.ok()) {
    std::printf("fingerprint kernel: %s\n", gpu.status().message().c_str());
    return 2;
  }
  std::vector<ChunkFingerprint> before = *(*gpu)[0];
  if (before != Reference(host)) return Fail("the GPU's fingerprints differ from the reference");
  std::printf("pattern: %zu chunks, the GPU's fingerprints equal the reference\n", before.size());

  // One byte flipped deep inside chunk 2.
  const uint64_t at = 2 * chunks::kChunkBytes + 40'000'003;
  host[at] ^= 0x01;
  DRIVER(d.copy_htod_async(buf + at, &host[at], 1, nullptr), "cuMemcpyHtoDAsync");
  DRIVER(d.ctx_synchronize(), "cuCtxSynchronize");
  gpu = kernel.Ranges({{buf, bytes, context}});
  if (!gpu.ok()) return Fail(gpu.status().message().c_str());
  std::vector<ChunkFingerprint> after = *(*gpu)[0];
  if (after != Reference(host)) return Fail("after the flip, the GPU's fingerprints differ from the reference");
  for (size_t c = 0; c < after.size(); ++c)
    if ((after[c] == before[c]) != (c != 2)) return Fail("the flip changed another chunk than its own, or not its own");
  std::printf("flipped byte %llu: chunk 2's fingerprint changed, no other; equal to the reference\n",
              static_cast<unsigned long long>(at));
  DRIVER(d.mem_free(buf), "cuMemFree");

  // Speed over --gib GiB (contents irrelevant: zeroed).
  const uint64_t big = static_cast<uint64_t>(gib * (1ull << 30)) / chunks::kChunkBytes * chunks::kChunkBytes;
  if (big > 0) {
    DRIVER(d.mem_alloc(&buf, big), "cuMemAlloc");
    DRIVER(d.memset_d8_async(buf, 0, big, nullptr), "cuMemsetD8Async");
    DRIVER(d.ctx_synchronize(), "cuCtxSynchronize");
    auto t0 = std::chrono::steady_clock::now();
    gpu = kernel.Ranges({{buf, big, context}});
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!gpu.ok()) return Fail(gpu.status().message().c_str());
    std::vector<unsigned char> zero_chunk(chunks::kChunkBytes, 0);
    if ((*(*gpu)[0])[0] != FingerprintBytes(zero_chunk.data(), zero_chunk.size()))
      return Fail("a zero chunk's fingerprint differs from the reference");
    std::printf("fingerprinted %.1f GiB in %.4f s: %.0f GB/s\n", big / double(1ull << 30), s, big / s / 1e9);
    DRIVER(d.mem_free(buf), "cuMemFree");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double gib = 1;
  int device = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--gib")) gib = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--device")) device = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--gib N] [--device D]\n", argv[0]);
      return 64;
    }
  }
  setvbuf(stdout, nullptr, _IOLBF, 0);
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("no libcuda.so.1: %s\n", dlerror());
    return 2;
  }
  RealDriver d = ResolveRealDriver(lib, &dlsym);
  if (!d.missing.empty()) {
    std::printf("libcuda.so.1 lacks %s\n", d.missing.c_str());
    return 2;
  }
  auto init = reinterpret_cast<abi::PFN_cuInit>(dlsym(lib, "cuInit"));
  DRIVER(init(0), "cuInit");
  abi::CUdevice dev = 0;
  abi::CUcontext ctx = nullptr;
  DRIVER(d.device_get(&dev, device), "cuDeviceGet");
  DRIVER(d.primary_ctx_retain(&ctx, dev), "cuDevicePrimaryCtxRetain");
  DRIVER(d.ctx_set_current(ctx), "cuCtxSetCurrent");
  // The kernel's module and stream go before the context they live in.
  int rc = Checks(d, reinterpret_cast<uint64_t>(ctx), gib);
  d.primary_ctx_release(dev);
  if (rc != 0) return rc;
  std::printf("fingerprint check ok\n");
  return 0;
}
