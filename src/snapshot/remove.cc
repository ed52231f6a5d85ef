// Removing snapshots and collecting the chunks they leave behind
// (gpusnap/operations.h; the mechanism is src/gpushare/control/chunk_gc.h).
#include <unistd.h>

#include "gpushare/control/chunk_gc.h"
#include "gpushare/control/chunk_lock.h"
#include "gpushare/common/chunk_store.h"
#include "gpusnap/operations.h"
#include "store/store.h"

namespace gpusnap {

namespace {

// A store without chunks/ has never held a gpushare snapshot: nothing to collect.
Result<GcResult> LockAndCollect(const Store& store, bool dry_run, int wait_ms) {
  using gpushare::control::ChunkStoreLock;
  if (::access(gpushare::ChunksDir(store.root()).c_str(), F_OK) != 0) return GcResult{};
  GPUSNAP_ASSIGN_OR_RETURN(auto lock, ChunkStoreLock::Acquire(store.root(), ChunkStoreLock::Mode::kExclusive, wait_ms));
  return gpushare::control::CollectChunks(store, lock, dry_run);
}

}  // namespace

Result<GcResult> CollectGarbage(const GcOptions& options) {
  GPUSNAP_ASSIGN_OR_RETURN(auto store, Store::Open(options.store.empty() ? DefaultStore() : options.store, false));
  return LockAndCollect(store, options.dry_run, options.wait_ms);
}

Result<RemoveResult> RemoveSnapshot(const std::string& store_root, const std::string& id) {
  GPUSNAP_ASSIGN_OR_RETURN(auto store, Store::Open(store_root.empty() ? DefaultStore() : store_root, false));
  GPUSNAP_RETURN_IF_ERROR(store.Remove(id));
  RemoveResult r;
  auto collected = LockAndCollect(store, /*dry_run=*/false, /*wait_ms=*/0);
  if (collected.ok())
    r.chunks = std::move(collected).value();
  else
    r.chunks_status = collected.status().Wrap(
        fmt::format("snapshot `{}` is removed, but its chunks are not collected yet (`gpusnap gc` does it)", id));
  return r;
}

}  // namespace gpusnap
