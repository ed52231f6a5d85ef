// Whether the device memory a standby's wake needs fits the GPUs it wakes
// onto (docs/STANDBY.md), decided before the wake touches anything.
#pragma once

#include <cstdint>
#include <map>

#include "gpusnap/status.h"

namespace gpusnap::gpu {

// Pure. `need` and `free_bytes` by this machine's GPU ordinal. Ok when every
// GPU of `need` has at least that much free; else kFailedPrecondition naming
// the first GPU (lowest ordinal) that lacks room, its need and its free
// memory: "GPU 1 has 3.0 GiB free; the wake needs 5.0 GiB of device memory on
// it". A GPU of `need` missing from `free_bytes` is kInternal (not measured).
Status PlanWakeFit(const std::map<int, uint64_t>& need, const std::map<int, uint64_t>& free_bytes);

}  // namespace gpusnap::gpu
