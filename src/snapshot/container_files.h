// config.dump and spec.dump: the two files that make a gpusnap snapshot read
// as a container checkpoint archive (the layout Podman, CRI-O and the
// Kubernetes checkpoint API share, and that checkpointctl reads). Pure.
#pragma once

#include <string>

#include "gpusnap/snapshot.h"

namespace gpusnap {

// REQUIRES: meta.id, meta.created and meta.source filled in.
std::string ConfigDumpJson(const SnapshotMeta& meta, const std::string& workload_started);
std::string SpecDumpJson(const SnapshotMeta& meta);

}  // namespace gpusnap
