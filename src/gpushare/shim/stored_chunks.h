// What a process last stored of each chunk of its device memory: the chunk's
// fingerprint (chunk_fingerprint.h) and its ref in the chunk store. A release
// fingerprints every chunk on the GPU and writes a chunk whose fingerprint is
// the one recorded, and whose file the store still holds, to the manifest as
// it was, without copying it off the GPU (docs/GPUSHARE.md, "Unchanged
// chunks").
//
// The record stays true across a load: the memory is then filled from the
// manifest of the release that recorded it (a resume in place, the rollback
// of a failed release), or the process is one restored from that very
// release's snapshot, whose record came back with its memory (CRIU). A load
// from a manifest that names other chunks drops what disagrees (ForgetOthers).
//
// Thread-safety: none; the shim's control thread alone uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <tuple>
#include <vector>

#include "chunks/chunk_manifest.h"
#include "chunks/chunk_store.h"
#include "gpushare/common/chunk_copy.h"
#include "gpushare/common/chunk_fingerprint.h"

namespace gpusnap::gpushare::shim {

// A chunk of a range: the range's address and size, the chunk's index.
struct ChunkKey {
  uint64_t va = 0;
  uint64_t size = 0;
  size_t index = 0;
  auto operator<=>(const ChunkKey&) const = default;
};

struct StoredChunk {
  ChunkFingerprint fingerprint;
  chunks::ChunkRef ref;
  bool operator==(const StoredChunk&) const = default;
};

using StoredChunks = std::map<ChunkKey, StoredChunk>;

// The fingerprints of each range's chunks now (nullopt: that range has none).
using RangeFingerprints = std::vector<std::optional<std::vector<ChunkFingerprint>>>;

// Pure: for each job (a chunk of ranges[job.range]), the ref to write for it
// as it is, or nullopt when it must be copied and stored: when it has no
// fingerprint now, none recorded, a different one, or when `held` says the
// store no longer holds the recorded chunk.
std::vector<std::optional<chunks::ChunkRef>> PlanUnchangedChunks(
    const std::vector<ChunkJob>& jobs, const std::vector<DeviceRange>& ranges, const RangeFingerprints& now,
    const StoredChunks& stored, const std::function<bool(const chunks::ChunkRef&)>& held);

// Pure: the record after a release that wrote `refs` (per job) for `jobs`,
// with the fingerprints `now`: each job that has a fingerprint, and only
// those (scratch and unfingerprinted chunks are not recorded).
StoredChunks RecordStoredChunks(const std::vector<ChunkJob>& jobs, const std::vector<DeviceRange>& ranges,
                                const RangeFingerprints& now, const std::vector<chunks::ChunkRef>& refs);

// Pure: `stored` without the chunks `manifest` names otherwise (a load from it
// leaves the memory of those chunks other than recorded).
StoredChunks ForgetOthers(const StoredChunks& stored, const chunks::ChunkManifest& manifest);

}  // namespace gpusnap::gpushare::shim
