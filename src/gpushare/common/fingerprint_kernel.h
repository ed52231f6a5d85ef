// The chunk fingerprint (chunk_fingerprint.h) computed on the GPU, at the
// speed of its memory, by a kernel of the shim's own: PTX text built here
// (gpusnap builds without nvcc), JIT-compiled by the driver in the process's
// context on first use, and launched on a stream of its own. Only the
// fingerprints (16 bytes a chunk) cross to the host.
//
// The shim calls it while the process is quiesced: its calls go to the
// driver directly, past the work gate that holds the application's launches.
//
// Thread-safety: one caller at a time (the control thread).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpushare/common/chunk_copy.h"
#include "gpushare/common/chunk_fingerprint.h"
#include "gpushare/common/driver_table.h"
#include "gpusnap/status.h"

namespace gpusnap::gpushare {

// The kernel's PTX: entry kFingerprintKernelName, parameters (data, words,
// chunk_words, out): the range's first word, its length in words, the words
// of one chunk, and 2 zeroed words per chunk where each chunk's (a, b) sums
// are added (ctaid.y is the chunk). Blocks of kFingerprintBlockThreads.
std::string FingerprintPtx();

inline constexpr unsigned kFingerprintBlockThreads = 256;
// Blocks per chunk: 16384 threads read a 64 MiB chunk, 512 words each.
inline constexpr unsigned kFingerprintBlocksPerChunk = 64;

class FingerprintKernel {
 public:
  explicit FingerprintKernel(const RealDriver& d) : d_(d) {}
  FingerprintKernel(const FingerprintKernel&) = delete;
  FingerprintKernel& operator=(const FingerprintKernel&) = delete;
  ~FingerprintKernel();

  // The fingerprints of every chunks::kChunkBytes chunk of each range, in
  // order; nullopt for a range the kernel cannot take (a size that is not a
  // whole number of words). Errors name the driver call; the caller then
  // copies every chunk as if it had no fingerprints.
  Result<std::vector<std::optional<std::vector<ChunkFingerprint>>>> Ranges(const std::vector<DeviceRange>& ranges);

 private:
  struct Loaded {
    abi::CUmodule module = nullptr;
    abi::CUfunction function = nullptr;
    abi::CUstream stream = nullptr;
  };
  // The kernel in context `ctx`, loaded there on first use; ctx is current.
  Result<Loaded> In(uint64_t ctx);

  const RealDriver& d_;
  std::map<uint64_t, Loaded> loaded_;  // by context; kept while the process lives
};

}  // namespace gpusnap::gpushare
