// The fingerprint of a chunk of device memory: what a release compares to
// tell a chunk that has not changed since it was stored from one that has,
// without copying it off the GPU (docs/GPUSHARE.md, "Unchanged chunks").
//
// This header is the one definition of the function. The shim computes it on
// the GPU with its own kernel (fingerprint_kernel.h, PTX that must give the
// identical value), the fake driver of the tests computes it here over its
// host-backed device memory, and the unit tests and the GPU test hold the two
// to each other.
//
// The chunk is read as little-endian 64-bit words w_0 .. w_{n-1}; the
// fingerprint is two 64-bit sums, each over every word of a bijective mix of
// the word and its index:
//   a = sum_i MixA(w_i XOR i * kIndexA)
//   b = sum_i MixB(w_i + (i + 1) * kIndexB)      (all mod 2^64)
// Each mix is a bijection of the word for a fixed index, so a change confined
// to one word (any byte of it, any bit) changes both sums with certainty; a
// change of several words leaves one sum as it was by chance only (about 2^-64
// each). The index makes it depend on order (two words swapped change it).
// Sums are commutative, so any split of the words (a GPU's threads) adds up to
// the same value. It is no cryptographic hash: it is only ever compared with
// the value the same process computed when it stored the chunk, and the
// chunk's XXH3-128 digest is still what names it in the store.
#pragma once

#include <cstdint>
#include <cstring>

namespace gpusnap::gpushare {

struct ChunkFingerprint {
  uint64_t a = 0;
  uint64_t b = 0;
  bool operator==(const ChunkFingerprint&) const = default;
};

// The kernel's entry name; the fake driver recognizes the module by it.
inline constexpr const char* kFingerprintKernelName = "gpusnap_chunk_fingerprint";

// Odd multipliers (the golden ratio's and MurmurHash3's and SplitMix64's
// finalizer constants, well-mixed odd numbers); the kernel's PTX uses the same.
inline constexpr uint64_t kFingerprintIndexA = 0x9e3779b97f4a7c15ull;
inline constexpr uint64_t kFingerprintIndexB = 0xd6e8feb86659fd93ull;
inline constexpr uint64_t kFingerprintMulA1 = 0xff51afd7ed558ccdull;
inline constexpr uint64_t kFingerprintMulA2 = 0xc4ceb9fe1a85ec53ull;
inline constexpr uint64_t kFingerprintMulB1 = 0xbf58476d1ce4e5b9ull;
inline constexpr uint64_t kFingerprintMulB2 = 0x94d049bb133111ebull;

// A 64-bit finalizer: xor-shift, multiply, xor-shift, multiply, xor-shift.
// Each step is a bijection, so the whole is one. The kernel's PTX spells out
// the same steps (fingerprint_kernel.cc, FinalizeAndAdd).
struct Finalizer {
  int shift1;
  uint64_t mul1;
  int shift2;
  uint64_t mul2;
  int shift3;
};
inline constexpr Finalizer kFinalizerA{33, kFingerprintMulA1, 33, kFingerprintMulA2, 33};
inline constexpr Finalizer kFinalizerB{30, kFingerprintMulB1, 27, kFingerprintMulB2, 31};

constexpr uint64_t Finalize(uint64_t x, const Finalizer& f) {
  x ^= x >> f.shift1;
  x *= f.mul1;
  x ^= x >> f.shift2;
  x *= f.mul2;
  x ^= x >> f.shift3;
  return x;
}

constexpr uint64_t FingerprintMixA(uint64_t word, uint64_t index) {
  return Finalize(word ^ (index * kFingerprintIndexA), kFinalizerA);
}

constexpr uint64_t FingerprintMixB(uint64_t word, uint64_t index) {
  return Finalize(word + (index + 1) * kFingerprintIndexB, kFinalizerB);
}

// The fingerprint of `bytes` bytes at `data` (a chunk, or a whole range read
// as one chunk). REQUIRES: bytes % 8 == 0 (device memory comes in whole pages).
inline ChunkFingerprint FingerprintBytes(const void* data, uint64_t bytes) {
  ChunkFingerprint f;
  const auto* p = static_cast<const unsigned char*>(data);
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    uint64_t w = 0;
    std::memcpy(&w, p + i * 8, 8);  // little-endian on every machine gpusnap runs on, as on the GPU
    f.a += FingerprintMixA(w, i);
    f.b += FingerprintMixB(w, i);
  }
  return f;
}

}  // namespace gpusnap::gpushare
