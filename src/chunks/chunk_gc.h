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
// The cache: given a limit (`keep_unused_bytes`: `gpusnap gc --keep-unused`,
// else the store's chunk_cache_bytes, store/config.h), the chunks that no
// manifest names are a cache for later pulls and checkpoints rather than
// garbage. They are evicted least recently used first (a chunk's mtime is its
// last use, chunk_store.h) until those left total at most the limit; a chunk
// a manifest names is never evicted, and does not count against the limit.
// Limit 0 (the default) keeps none: every unreferenced chunk goes.
//
// Concurrency: the caller holds the store's ChunkStoreLock exclusively
// (chunk_lock.h), so no checkpoint can be between finding a chunk present
// and naming it in a manifest.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "chunks/chunk_lock.h"
#include "chunks/chunk_manifest.h"
#include "gpusnap/gc.h"
#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"
#include "store/store.h"

namespace gpusnap::chunks {

// Older temporaries of chunk writes belong to writes that were interrupted.
inline constexpr int64_t kChunkTempMaxAgeS = 3600;

// Pure: the digests (32 hex) of the stored chunks that `manifests` name
// (ZERO chunks are not stored and name nothing).
std::set<std::string> LiveChunks(const std::vector<ChunkManifest>& manifests);

// Pure: the manifests of a published snapshot, as paths relative to its
// directory: one for each gpushare process `meta` lists, and every
// `<name>.chunks` among `gpu_dir_names` (the names in its gpu/ directory).
std::vector<std::string> SnapshotManifests(const SnapshotMeta& meta, const std::vector<std::string>& gpu_dir_names);

// A chunk, for the choice of what the cache gives up.
struct CachedChunk {
  std::string name;          // for the order of ties
  uint64_t bytes = 0;
  int64_t last_used_ns = 0;  // since the epoch
  bool referenced = false;   // some manifest names it
};

// Pure: the chunks to evict so that the unreferenced ones left total at most
// `keep_bytes`: unreferenced ones only, least recently used first (ties by
// name), and no more than it takes. Indices into `chunks`, in that order.
std::vector<size_t> ChooseEvictions(const std::vector<CachedChunk>& chunks, uint64_t keep_bytes);

// A regular file under <store>/chunks/.
struct ChunkStoreFile {
  std::string name;  // relative to chunks/: "<fan-out dir>/<file>"
  uint64_t size = 0;
  int64_t age_s = 0;     // since its last modification
  int64_t mtime_ns = 0;  // that modification, since the epoch (a chunk's last use)
};

// Pure: the sweep. `removed` gets the files to delete (paths as the names
// given): the chunks ChooseEvictions gives up to keep `keep_unused_bytes` of
// unreferenced ones, least recently used first, then the stale temporaries.
// `kept_*` counts the chunk files `live` names, `cached_*` the unreferenced
// ones kept. Files matching neither rule count nowhere.
GcResult DecideSweep(const std::set<std::string>& live, const std::vector<ChunkStoreFile>& files,
                     int64_t temp_max_age_s, uint64_t keep_unused_bytes);

// Marks, then (unless `dry_run`) deletes what DecideSweep decides, and removes
// fan-out directories left empty. REQUIRES: `lock` is the store's, held
// kExclusive. Errors: as CollectGarbage (gpusnap/operations.h).
Result<GcResult> CollectChunks(const Store& store, const ChunkStoreLock& lock, bool dry_run,
                               uint64_t keep_unused_bytes);

}  // namespace gpusnap::chunks
