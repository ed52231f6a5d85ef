// The restore of a rootfs snapshot (or of a `both` snapshot whose process
// part cannot run here) into a placeholder container: a cold start with warm
// caches (docs/CAPTURE-PATHS.md). Restore (restore.cc) dispatches here.
#pragma once

#include <string>

#include "gpusnap/operations.h"

namespace gpusnap {

// `fallback_reason`: why a `both` snapshot is not restored as a process
// (empty for a rootfs snapshot); it is the result's.
Result<RestoreResult> RestoreRootfs(const RestoreOptions& options, const std::string& fallback_reason);

}  // namespace gpusnap
