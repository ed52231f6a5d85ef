#include "util/heap.h"

#include <malloc.h>

#include <climits>

namespace gpusnap {

Status MapLargeAllocations(size_t bytes) {
  if (bytes == 0 || bytes > INT_MAX)
    return Status::Error(Code::kInvalidArgument, "a mapping threshold of {} bytes: not between 1 and {}", bytes,
                         INT_MAX);
  // A threshold set by hand also ends glibc's moving it.
  if (::mallopt(M_MMAP_THRESHOLD, static_cast<int>(bytes)) != 1)
    return Status::Error(Code::kInternal, "the C library refused a mapping threshold of {} bytes", bytes);
  return Status::Ok();
}

}  // namespace gpusnap
