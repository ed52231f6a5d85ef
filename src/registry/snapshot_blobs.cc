#include "registry/snapshot_blobs.h"

#include "gpushare/common/chunk_manifest.h"
#include "gpushare/control/chunk_gc.h"
#include "store/layout.h"
#include "util/files.h"

namespace gpusnap::registry {

std::vector<std::string> ManifestFiles(const SnapshotMeta& meta) {
  std::string prefix = std::string(SnapshotFiles::kGpuDir) + "/";
  std::vector<std::string> names;
  for (const auto& [path, _] : meta.files)
    if (path.starts_with(prefix)) names.push_back(path.substr(prefix.size()));
  return gpushare::control::SnapshotManifests(meta, names);
}

Result<std::set<std::string>> ChunksNamed(const std::string& dir, const SnapshotMeta& meta) {
  std::vector<gpushare::ChunkManifest> manifests;
  for (const std::string& rel : ManifestFiles(meta)) {
    std::string path = dir + "/" + rel;
    GPUSNAP_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
    GPUSNAP_ASSIGN_OR_RETURN(auto m, gpushare::DecodeChunkManifest(bytes, path));
    manifests.push_back(std::move(m));
  }
  return gpushare::control::LiveChunks(manifests);
}

}  // namespace gpusnap::registry
