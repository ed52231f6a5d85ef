// The restore of a rootfs snapshot (or of a `both` snapshot whose process
// part cannot run here) into a placeholder container: a cold start with warm
// caches (docs/CAPTURE-PATHS.md). Restore (restore.cc) dispatches here.
#pragma once

#include <string>

#include "gpusnap/operations.h"
#include "store/store.h"

namespace gpusnap {

// `meta`: the snapshot's, read from `store` (where it is published).
// `fallback_reason`: why a `both` snapshot is not restored as a process
// (empty for a rootfs snapshot); it is the result's.
Result<RestoreResult> RestoreRootfs(const RestoreOptions& options, const Store& store, const SnapshotMeta& meta,
                                    const std::string& fallback_reason);

}  // namespace gpusnap
