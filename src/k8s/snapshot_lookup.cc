#include "k8s/snapshot_lookup.h"

#include "store/store.h"

namespace gpusnap::k8s {

std::function<Result<int>(const std::string&)> StoreGpuCountLookup(std::string store_root) {
  return [root = std::move(store_root)](const std::string& id) -> Result<int> {
    GPUSNAP_ASSIGN_OR_RETURN(Store store, Store::Open(root, /*for_writing=*/false));
    GPUSNAP_ASSIGN_OR_RETURN(SnapshotMeta meta, store.Load(id));
    if (!meta.gpu || meta.gpu->gpus.empty())
      return Status::Error(Code::kNotFound, "snapshot `{}` records no GPU", id);
    return static_cast<int>(meta.gpu->gpus.size());
  };
}

}  // namespace gpusnap::k8s
