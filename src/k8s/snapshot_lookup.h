// Where the webhook learns a snapshot's GPU count when a pod does not say it
// (gpusnap.io/gpu-count): the snapshot's metadata in a gpusnap store that the
// webhook can read (a shared volume, or the node's store in tests).
//
// Thread-safety: the returned function only reads files; safe to call from
// several threads at once.
#pragma once

#include <functional>
#include <string>

#include "gpusnap/status.h"

namespace gpusnap::k8s {

// A MutateConfig::snapshot_gpu_count reading <store_root>/snapshots/<id>/.
// The function returns the number of GPUs the snapshot's processes used
// (metadata schema 1.1 `gpu.gpus`), or kNotFound when the store has no such
// snapshot or the snapshot records no GPU (a CPU-only tree, or schema 1.0),
// or the store's error (kCorruption, kInvalidArgument) naming the snapshot.
std::function<Result<int>(const std::string&)> StoreGpuCountLookup(std::string store_root);

}  // namespace gpusnap::k8s
