// Garbage collection of the chunk store (chunk_store.h): mark the chunks some
// manifest names, sweep the other files under <store>/chunks/.
//
// Mark: every manifest from which memory may still be loaded:
//   - each published snapshot's gpu/*.chunks, and the manifest of every
//     process its gpusnap.json lists under gpu.gpushare (gpu/<ns pid>.chunks);
//   - each snapshot being written (snapshots/.tmp-<id>/gpu/*.chunks) whose
//     writer is alive; the leftovers of dead writers are removed first, as
//     every checkpoint does (a dry run only skips them);
//   - each process suspended in place (<store>/suspended/<pid>/*.chunks).
// A manifest that cannot be read or decoded, a snapshot whose gpusnap.json
// cannot be read, or a gpushare snapshot missing a manifest stops the
// collection before anything is deleted, with an error naming the file:
// never delete on incomplete knowledge.
//
// Sweep: a chunk file (<2 hex>/<32 hex>, the first two digits repeated) that
// no manifest names, and a temporary of a chunk write
// (<32 hex><kChunkTempInfix>...) older than kChunkTempMaxAgeS. Any other name
// is left alone, and so are the fan-out directories that still hold files.
//
// Concurrency: the caller holds the store's ChunkStoreLock exclusively
// (chunk_lock.h), so no checkpoint can be between finding a chunk present
// and naming it in a manifest.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "gpushare/control/chunk_lock.h"
#include "gpushare/common/chunk_manifest.h"
#include "gpusnap/gc.h"
#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"
#include "store/store.h"

namespace gpusnap::gpushare::control {

// Older temporaries of chunk writes belong to writes that were interrupted.
inline constexpr int64_t kChunkTempMaxAgeS = 3600;

// Pure: the digests (32 hex) of the stored chunks that `manifests` name
// (ZERO chunks are not stored and name nothing).
std::set<std::string> LiveChunks(const std::vector<ChunkManifest>& manifests);

// Pure: the manifests of a published snapshot, as paths relative to its
// directory: one for each gpushare process `meta` lists, and every
// `<name>.chunks` among `gpu_dir_names` (the names in its gpu/ directory).
std::vector<std::string> SnapshotManifests(const SnapshotMeta& meta, const std::vector<std::string>& gpu_dir_names);

// A regular file under <store>/chunks/.
struct ChunkStoreFile {
  std::string name;  // relative to chunks/: "<fan-out dir>/<file>"
  uint64_t size = 0;
  int64_t age_s = 0;  // since its last modification
};

// Pure: the sweep. `removed` gets the files to delete (paths as the names
// given), `kept_*` the chunk files `live` names. Files matching neither rule
// count nowhere.
GcResult DecideSweep(const std::set<std::string>& live, const std::vector<ChunkStoreFile>& files,
                     int64_t temp_max_age_s);

// Marks, then (unless `dry_run`) deletes what DecideSweep decides, and removes
// fan-out directories left empty. REQUIRES: `lock` is the store's, held
// kExclusive. Errors: as CollectGarbage (gpusnap/operations.h).
Result<GcResult> CollectChunks(const Store& store, const ChunkStoreLock& lock, bool dry_run);

}  // namespace gpusnap::gpushare::control
