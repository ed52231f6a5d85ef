#include "registry/snapshot_blobs.h"

#include "chunks/chunk_gc.h"
#include "chunks/chunk_manifest.h"
#include "chunks/chunk_store.h"
#include "store/layout.h"
#include "util/files.h"

namespace gpusnap::registry {

std::vector<std::string> ManifestFiles(const SnapshotMeta& meta) {
  std::string prefix = std::string(SnapshotFiles::kGpuDir) + "/";
  std::vector<std::string> names;
  for (const auto& [path, _] : meta.files)
    if (path.starts_with(prefix)) names.push_back(path.substr(prefix.size()));
  return chunks::SnapshotManifests(meta, names);
}

Result<std::vector<std::string>> ChunksInLoadOrder(const std::string& dir, const SnapshotMeta& meta) {
  std::vector<std::string> order;
  std::set<std::string> seen;
  for (const std::string& rel : ManifestFiles(meta)) {
    std::string path = dir + "/" + rel;
    GPUSNAP_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
    GPUSNAP_ASSIGN_OR_RETURN(auto m, chunks::DecodeChunkManifest(bytes, path));
    for (const chunks::ChunkedAllocation& a : m.allocations)
      for (const chunks::ChunkRef& ref : a.chunks)
        if (std::string hex = chunks::DigestHex(ref.digest); !ref.zero && seen.insert(hex).second)
          order.push_back(hex);
  }
  return order;
}

Result<std::set<std::string>> ChunksNamed(const std::string& dir, const SnapshotMeta& meta) {
  GPUSNAP_ASSIGN_OR_RETURN(auto order, ChunksInLoadOrder(dir, meta));
  return std::set<std::string>(order.begin(), order.end());
}

}  // namespace gpusnap::registry
