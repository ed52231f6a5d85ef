// Which blobs a snapshot is: its files (meta.files) and the gpushare chunks
// its manifests name.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"

namespace gpusnap::registry {

// Pure. The snapshot's chunk manifests (gpu/*.chunks), as meta.files names them.
std::vector<std::string> ManifestFiles(const SnapshotMeta& meta);

// The chunks (32 hex) the manifests under `dir` (a snapshot directory, or a
// pull's staging of one) name. Errors name the manifest that does not decode.
Result<std::set<std::string>> ChunksNamed(const std::string& dir, const SnapshotMeta& meta);

// The same chunks in the order a restore loads them (manifest by manifest,
// allocation by allocation), each once.
Result<std::vector<std::string>> ChunksInLoadOrder(const std::string& dir, const SnapshotMeta& meta);

}  // namespace gpusnap::registry
