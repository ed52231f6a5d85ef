#include "gpushare/common/fingerprint_kernel.h"

#include <algorithm>

#include <fmt/format.h>

#include "chunks/chunk_store.h"

namespace gpusnap::gpushare {
namespace {

// One step of the warp's tree sum of a 64-bit register: its two halves from
// the lane `offset` higher, added in.
std::string WarpSumStep(const char* reg, int offset) {
  return fmt::format(
      "  mov.b64 {{%lo, %hi}}, {0};\n"
      "  shfl.sync.down.b32 %lo, %lo, {1}, 31, 0xffffffff;\n"
      "  shfl.sync.down.b32 %hi, %hi, {1}, 31, 0xffffffff;\n"
      "  mov.b64 %t, {{%lo, %hi}};\n"
      "  add.u64 {0}, {0}, %t;\n",
      reg, offset);
}

// Finalize(reg, f) of chunk_fingerprint.h in PTX, then `sum` += reg.
std::string FinalizeAndAdd(const char* reg, const char* sum, const Finalizer& f) {
  return fmt::format(
      "  shr.u64 %s, {0}, {2};\n"
      "  xor.b64 {0}, {0}, %s;\n"
      "  mul.lo.u64 {0}, {0}, {3:#018x}U;\n"
      "  shr.u64 %s, {0}, {4};\n"
      "  xor.b64 {0}, {0}, %s;\n"
      "  mul.lo.u64 {0}, {0}, {5:#018x}U;\n"
      "  shr.u64 %s, {0}, {6};\n"
      "  xor.b64 {0}, {0}, %s;\n"
      "  add.u64 {1}, {1}, {0};\n",
      reg, sum, f.shift1, f.mul1, f.shift2, f.mul2, f.shift3);
}

}  // namespace

std::string FingerprintPtx() {
  // PTX ISA 7.8 for sm_80 and later: every driver since r520 JIT-compiles it
  // forward to the GPU it runs on (an H200 is sm_90).
  std::string ptx = fmt::format(R"(.version 7.8
.target sm_80
.address_size 64

.visible .entry {name}(
  .param .u64 p_data,
  .param .u64 p_words,
  .param .u64 p_chunk_words,
  .param .u64 p_out)
{{
  .reg .pred %done;
  .reg .pred %leader;
  .reg .b32 %cy, %cx, %nt, %tx, %ncx, %lane, %lo, %hi;
  .reg .b64 %data, %words, %chunk_words, %out, %first, %n, %base, %i, %stride, %p, %w, %x, %s, %y, %a, %b, %t, %chunk;

  ld.param.u64 %data, [p_data];
  ld.param.u64 %words, [p_words];
  ld.param.u64 %chunk_words, [p_chunk_words];
  ld.param.u64 %out, [p_out];
  cvta.to.global.u64 %data, %data;
  cvta.to.global.u64 %out, %out;

  // This block's chunk: words [first, first + n) of the range.
  mov.u32 %cy, %ctaid.y;
  cvt.u64.u32 %chunk, %cy;
  mul.lo.u64 %first, %chunk, %chunk_words;
  sub.u64 %n, %words, %first;
  min.u64 %n, %n, %chunk_words;
  shl.b64 %base, %first, 3;
  add.u64 %base, %data, %base;

  // Index i inside the chunk, a grid-wide stride apart.
  mov.u32 %cx, %ctaid.x;
  mov.u32 %nt, %ntid.x;
  mov.u32 %tx, %tid.x;
  mov.u32 %ncx, %nctaid.x;
  mul.wide.u32 %i, %cx, %nt;
  cvt.u64.u32 %t, %tx;
  add.u64 %i, %i, %t;
  mul.wide.u32 %stride, %ncx, %nt;
  mov.u64 %a, 0;
  mov.u64 %b, 0;

LOOP:
  setp.ge.u64 %done, %i, %n;
  @%done bra SUM;
  shl.b64 %p, %i, 3;
  add.u64 %p, %base, %p;
  ld.global.nc.u64 %w, [%p];
  // a += MixA(w, i): x = w ^ i * kFingerprintIndexA, finalized
  mul.lo.u64 %x, %i, {ia:#018x}U;
  xor.b64 %x, %w, %x;
{finalize_a}  // b += MixB(w, i): y = w + (i + 1) * kFingerprintIndexB, finalized
  add.u64 %y, %i, 1;
  mul.lo.u64 %y, %y, {ib:#018x}U;
  add.u64 %y, %w, %y;
{finalize_b}  add.u64 %i, %i, %stride;
  bra.uni LOOP;

SUM:
)",
                                fmt::arg("name", kFingerprintKernelName), fmt::arg("ia", kFingerprintIndexA),
                                fmt::arg("ib", kFingerprintIndexB),
                                fmt::arg("finalize_a", FinalizeAndAdd("%x", "%a", kFinalizerA)),
                                fmt::arg("finalize_b", FinalizeAndAdd("%y", "%b", kFinalizerB)));
  // The warp's 32 partial sums into its first lane; that lane adds them to
  // the chunk's pair (sums commute, so the order of the adds is free).
  for (int offset = 16; offset >= 1; offset /= 2) ptx += WarpSumStep("%a", offset) + WarpSumStep("%b", offset);
  ptx += R"(  and.b32 %lane, %tx, 31;
  setp.eq.u32 %leader, %lane, 0;
  @!%leader bra END;
  shl.b64 %t, %chunk, 4;
  add.u64 %p, %out, %t;
  red.global.add.u64 [%p], %a;
  red.global.add.u64 [%p+8], %b;
END:
  ret;
}
)";
  return ptx;
}

FingerprintKernel::~FingerprintKernel() {
  for (auto& [ctx, k] : loaded_) {
    d_.ctx_set_current(reinterpret_cast<abi::CUcontext>(ctx));
    if (k.stream) d_.stream_destroy(k.stream);
    if (k.module) d_.module_unload(k.module);
  }
}

Result<FingerprintKernel::Loaded> FingerprintKernel::In(uint64_t ctx) {
  GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.ctx_set_current(reinterpret_cast<abi::CUcontext>(ctx)), "cuCtxSetCurrent");
  if (auto it = loaded_.find(ctx); it != loaded_.end()) return it->second;
  Loaded k;
  std::string ptx = FingerprintPtx();
  GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.module_load_data(&k.module, ptx.c_str()), "cuModuleLoadData");
  abi::CUresult rc = d_.module_get_function(&k.function, k.module, kFingerprintKernelName);
  if (rc == abi::CUDA_SUCCESS) rc = d_.stream_create(&k.stream, abi::kStreamNonBlocking);
  if (rc != abi::CUDA_SUCCESS) {
    d_.module_unload(k.module);
    return d_.Error(k.function == nullptr ? "cuModuleGetFunction" : "cuStreamCreate", rc);
  }
  loaded_[ctx] = k;
  return k;
}

Result<std::vector<std::optional<std::vector<ChunkFingerprint>>>> FingerprintKernel::Ranges(
    const std::vector<DeviceRange>& ranges) {
  constexpr uint64_t kMaxChunksPerLaunch = 65535;  // gridDim.y
  std::vector<std::optional<std::vector<ChunkFingerprint>>> out(ranges.size());
  // Per context: one buffer for the sums of all its ranges' chunks.
  std::map<uint64_t, std::vector<size_t>> by_context;
  for (size_t r = 0; r < ranges.size(); ++r) {
    uint64_t chunks = (ranges[r].size + chunks::kChunkBytes - 1) / chunks::kChunkBytes;
    if (ranges[r].size == 0 || ranges[r].size % 8 != 0 || chunks > kMaxChunksPerLaunch) continue;
    out[r].emplace(chunks);
    by_context[ranges[r].context].push_back(r);
  }
  for (const auto& [ctx, members] : by_context) {
    GPUSNAP_ASSIGN_OR_RETURN(Loaded k, In(ctx));
    uint64_t total = 0;
    for (size_t r : members) total += out[r]->size();
    std::vector<ChunkFingerprint> sums(total);
    abi::CUdeviceptr dev = 0;
    GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.mem_alloc(&dev, total * sizeof(ChunkFingerprint)), "cuMemAlloc");
    auto run = [&]() -> Status {
      GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.memset_d8_async(dev, 0, total * sizeof(ChunkFingerprint), k.stream),
                                 "cuMemsetD8Async");
      uint64_t at = 0;
      for (size_t r : members) {
        uint64_t data = ranges[r].va, words = ranges[r].size / 8, chunk_words = chunks::kChunkBytes / 8;
        uint64_t sums_at = dev + at * sizeof(ChunkFingerprint);
        void* params[] = {&data, &words, &chunk_words, &sums_at};
        GPUSNAP_RETURN_IF_CU_ERROR(
            d_,
            d_.launch_kernel(k.function, kFingerprintBlocksPerChunk, static_cast<unsigned>(out[r]->size()), 1,
                             kFingerprintBlockThreads, 1, 1, 0, k.stream, params, nullptr),
            "cuLaunchKernel");
        at += out[r]->size();
      }
      GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.copy_dtoh_async(sums.data(), dev, total * sizeof(ChunkFingerprint), k.stream),
                                 "cuMemcpyDtoHAsync");
      GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.stream_synchronize(k.stream), "cuStreamSynchronize");
      return Status::Ok();
    };
    Status st = run();
    d_.mem_free(dev);
    GPUSNAP_RETURN_IF_ERROR(st.Wrap("fingerprinting device memory"));
    uint64_t at = 0;
    for (size_t r : members) {
      std::copy(sums.begin() + static_cast<std::ptrdiff_t>(at),
                sums.begin() + static_cast<std::ptrdiff_t>(at + out[r]->size()), out[r]->begin());
      at += out[r]->size();
    }
  }
  return out;
}

}  // namespace gpusnap::gpushare
