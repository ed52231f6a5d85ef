// The C library's heap, set for a long-running process.
#pragma once

#include <cstddef>

#include "gpusnap/status.h"

namespace gpusnap {

// Serves every allocation of at least `bytes` with a mapping of its own,
// returned to the kernel when it is freed, from now on. Why: glibc raises its
// own threshold past a large block once one is freed, and from then on each
// thread's arena keeps a freed block of that size resident: in the node
// agent, whose jobs hash files through 4 MiB buffers on threads of their own,
// that grew the resident memory by 4-6 MiB an arena over a soak
// (bench/agent_soak.py) while the bytes in use stayed flat.
// kInvalidArgument for 0 or more than an int holds (what the C library
// takes); kInternal when the C library refuses the setting.
Status MapLargeAllocations(size_t bytes);

// Large enough that what is small and frequent stays on the heap, small
// enough for a buffer that reads files.
inline constexpr size_t kLargeAllocationBytes = size_t{1} << 20;

}  // namespace gpusnap
