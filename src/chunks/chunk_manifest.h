// The chunk manifest gpu/<pid>.chunks: one process's device allocations and
// the chunks that hold their bytes (see chunk_store.h).
//
// Byte format, all integers little-endian:
//   manifest   := magic:u32 "GPCK" (0x4b435047) version:u32 (2 or 3; 1 is read too)
//                 count:u32 allocation*count
//   allocation := va:u64 size:u64 device:i32 origin:u8 uuid:16 nchunks:u32 chunk*nchunks
//                 (version 1: no origin, no uuid)
//   chunk      := kind:u8 (0 ZERO, 1 XXH3-128, 2 SCRATCH) length:u64 [digest:16 if kind 1]
// Every chunk length is 1..kChunkBytes and an allocation's chunk lengths sum to
// its size. Nothing follows the last allocation.
//
// Version 3 is version 2 with SCRATCH chunks (memory the workload marked as
// needing no saving: not stored, zeroed at load). A manifest is written as
// version 2 unless it has a SCRATCH chunk, so one without any stays readable
// by a gpusnap that knows version 2 only; one with them is refused by such a
// gpusnap as an unknown version, never read as if the memory were stored.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chunks/chunk_store.h"
#include "gpusnap/status.h"

namespace gpusnap::chunks {

inline constexpr uint32_t kChunkManifestMagic = 0x4b435047;  // "GPCK" as bytes on disk
// The newest version read; EncodeChunkManifest writes the lowest that holds its input.
inline constexpr uint32_t kChunkManifestVersion = 3;
inline constexpr uint32_t kChunkManifestVersionScratch = 3;  // the first with SCRATCH chunks

struct ChunkManifest {
  std::vector<ChunkedAllocation> allocations;

  bool operator==(const ChunkManifest&) const = default;
};

// The bytes of `manifest`: version 3 if a chunk is SCRATCH, else 2.
// REQUIRES: every allocation is well formed (lengths 1..kChunkBytes summing to
// its size; a scratch chunk is zero); DecodeChunkManifest rejects it otherwise.
std::string EncodeChunkManifest(const ChunkManifest& manifest);

// Parses EncodeChunkManifest's output. kCorruption for a bad magic, a
// truncated or over-long input, an unknown chunk kind (SCRATCH before
// version 3), a chunk length out of
// range or lengths not summing to the size; kNotSupported for an unknown
// version (naming it and the one supported). Messages name `source` (a path).
Result<ChunkManifest> DecodeChunkManifest(std::string_view bytes, std::string_view source = "chunk manifest");

// The manifest's path inside a snapshot directory: gpu/<pid>.chunks.
std::string ChunkManifestName(int pid);

// <store_root>/suspended: the manifests of the processes suspended in place
// (`gpusnap gpushare suspend`), each under <pid>/ (the chunk collection reads
// them, chunk_gc.h).
std::string SuspendedRoot(const std::string& store_root);

}  // namespace gpusnap::chunks
