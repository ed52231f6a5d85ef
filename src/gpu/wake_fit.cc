#include "gpu/wake_fit.h"

#include "util/progress_bar.h"  // HumanBytes

namespace gpusnap::gpu {

Status PlanWakeFit(const std::map<int, uint64_t>& need, const std::map<int, uint64_t>& free_bytes) {
  for (const auto& [gpu, bytes] : need) {
    auto it = free_bytes.find(gpu);
    if (it == free_bytes.end())
      return Status::Error(Code::kInternal, "the free memory of GPU {} was not measured", gpu);
    if (it->second < bytes)
      return Status::Error(Code::kFailedPrecondition,
                           "GPU {} has {} free; the wake needs {} of device memory on it ({} more bytes than free)",
                           gpu, HumanBytes(it->second), HumanBytes(bytes), bytes - it->second);
  }
  return Status::Ok();
}

}  // namespace gpusnap::gpu
