// Removing snapshots and collecting the chunks they leave behind
// (gpusnap/operations.h; the mechanism is src/chunks/chunk_gc.h).
#include <unistd.h>

#include <optional>

#include "chunks/chunk_gc.h"
#include "chunks/chunk_lock.h"
#include "chunks/chunk_store.h"
#include "gpusnap/operations.h"
#include "store/config.h"
#include "store/store.h"

namespace gpusnap {

namespace {

// How many bytes of unreferenced chunks to keep: `keep_unused_bytes` when
// given, else the store's chunk_cache_bytes, else none. A settings file that
// cannot be read stops the collection: its limit might have kept them.
Result<uint64_t> CacheLimit(const Store& store, std::optional<uint64_t> keep_unused_bytes) {
  if (keep_unused_bytes) return *keep_unused_bytes;
  auto config = ReadStoreConfig(store.root());
  if (!config.ok()) return config.status().Wrap("garbage collection refused, nothing deleted");
  return config->chunk_cache_bytes.value_or(0);
}

// A store without chunks/ has never held a gpushare snapshot: nothing to collect.
Result<GcResult> LockAndCollect(const Store& store, bool dry_run, int wait_ms,
                                std::optional<uint64_t> keep_unused_bytes) {
  using chunks::ChunkStoreLock;
  if (::access(chunks::ChunksDir(store.root()).c_str(), F_OK) != 0) return GcResult{};
  GPUSNAP_ASSIGN_OR_RETURN(uint64_t limit, CacheLimit(store, keep_unused_bytes));
  GPUSNAP_ASSIGN_OR_RETURN(auto lock, ChunkStoreLock::Acquire(store.root(), ChunkStoreLock::Mode::kExclusive, wait_ms));
  return chunks::CollectChunks(store, lock, dry_run, limit);
}

}  // namespace

Result<GcResult> CollectGarbage(const GcOptions& options) {
  GPUSNAP_ASSIGN_OR_RETURN(auto store, Store::Open(StoreOrDefault(options.store), false));
  return LockAndCollect(store, options.dry_run, options.wait_ms, options.keep_unused_bytes);
}

Result<RemoveResult> RemoveSnapshot(const std::string& store_root, const std::string& id) {
  GPUSNAP_ASSIGN_OR_RETURN(auto store, Store::Open(StoreOrDefault(store_root), false));
  GPUSNAP_RETURN_IF_ERROR(store.Remove(id));
  RemoveResult r;
  auto collected = LockAndCollect(store, /*dry_run=*/false, /*wait_ms=*/0, /*keep_unused_bytes=*/std::nullopt);
  if (collected.ok())
    r.chunks = std::move(collected).value();
  else
    r.chunks_status = collected.status().Wrap(
        fmt::format("snapshot `{}` is removed, but its chunks are not collected yet (`gpusnap gc` does it)", id));
  return r;
}

}  // namespace gpusnap
