#include "rootfs/cache_archive.h"

#include "rootfs/tree_archive.h"

namespace gpusnap::rootfs {

namespace {

struct CacheScan {
  TreeOrigin origin;
  UpperTree tree;
  DiffPlan plan;
};

Result<CacheScan> ScanCache(int dir_fd, std::string_view container_path, const PathMatcher& exclusions) {
  if (container_path.empty() || container_path.front() != '/')
    return Status::Error(Code::kInvalidArgument, "cache directory `{}` is not an absolute container path",
                         container_path);
  CacheScan scan;
  scan.origin.container_root = ContainerPathIn(container_path, "");
  scan.origin.description = fmt::format("the cache `{}`", scan.origin.container_root);
  if (auto pattern = exclusions.Match(scan.origin.container_root))
    return Status::Error(Code::kInvalidArgument, "the exclusion `{}` leaves out the whole cache `{}`", *pattern,
                         scan.origin.container_root);
  GPUSNAP_ASSIGN_OR_RETURN(scan.tree, ScanTree(dir_fd, scan.origin, exclusions));
  GPUSNAP_ASSIGN_OR_RETURN(scan.plan, CachePlanOf(scan.tree, scan.origin.container_root));
  return scan;
}

}  // namespace

Result<CacheWritten> WriteCacheArchive(int dir_fd, std::string_view container_path, const std::string& tar_path,
                                       const PathMatcher& exclusions) {
  GPUSNAP_ASSIGN_OR_RETURN(CacheScan scan, ScanCache(dir_fd, container_path, exclusions));
  GPUSNAP_ASSIGN_OR_RETURN(TreeArchiveWritten tar,
                           WriteTreeArchive(dir_fd, scan.origin, scan.tree, scan.plan.archived, tar_path));
  CacheWritten out;
  out.entries = tar.entries;
  out.data_bytes = tar.data_bytes;
  out.archive_bytes = tar.archive_bytes;
  out.skipped = std::move(scan.plan.skipped);
  out.excluded = std::move(scan.plan.excluded);
  return out;
}

Result<uint64_t> CacheArchiveBytesBound(int dir_fd, std::string_view container_path, const PathMatcher& exclusions) {
  GPUSNAP_ASSIGN_OR_RETURN(CacheScan scan, ScanCache(dir_fd, container_path, exclusions));
  return ArchiveBytesBound(scan.tree, scan.plan);
}

}  // namespace gpusnap::rootfs
