#include "snapshot/rootfs_capture.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "container/freezer.h"
#include "proc/proc.h"
#include "rootfs/beneath.h"
#include "rootfs/cache_archive.h"
#include "rootfs/diff_plan.h"
#include "rootfs/diff_writer.h"
#include "rootfs/exclusions.h"
#include "store/layout.h"
#include "util/fd.h"
#include "util/files.h"

namespace gpusnap {

namespace {

constexpr std::string_view kUserOverlayPrefix = "user.overlay.";

// A cache directory of the container opened from its root, entering its
// volumes but following no link at all: a cache directory reached through a
// link is refused rather than read wherever the link points. (Its path is
// clean, CheckRootfsRequest's: no `..` to climb.)
Result<UniqueFd> OpenContainerDir(int root_fd, const std::string& path) {
  int fd = rootfs::OpenBeneathAcrossMounts(root_fd, path.substr(1), O_RDONLY | O_DIRECTORY);
  if (fd < 0) {
    if (errno == ELOOP) return Status::Error(Code::kFailedPrecondition, "cache directory `{}` lies through a symbolic "
                                             "link in the container: name the directory itself", path);
    return Status::Errno(errno, "opening cache directory `{}` in the container", path);
  }
  return UniqueFd(fd);
}

}  // namespace

Status CheckRootfsRequest(const std::vector<std::string>& caches, const std::vector<std::string>& exclude) {
  std::set<std::string> seen;
  for (const std::string& c : caches) {
    auto bad = [&](std::string_view why) {
      return Status::Error(Code::kInvalidArgument, "cache directory `{}`: {}", c, why);
    };
    if (c.empty() || c[0] != '/') return bad("not an absolute container path");
    if (c == "/") return bad("the root is captured by the diff, not as a cache");
    if (c.find_first_of("*?[") != std::string::npos) return bad("a cache is a directory, not a pattern");
    if (c.back() == '/' || c.find("//") != std::string::npos || c.find("/./") != std::string::npos ||
        c.find("/../") != std::string::npos || c.ends_with("/..") || c.ends_with("/."))
      return bad("not a clean path (no `.`, `..`, empty components or trailing `/`)");
    if (!seen.insert(c).second) return bad("named twice");
  }
  for (const auto& a : caches)
    for (const auto& b : caches)
      if (a != b && rootfs::IsAtOrUnder(b, a))
        return Status::Error(Code::kInvalidArgument, "cache directory `{}` lies inside cache directory `{}`", b, a);
  return rootfs::PathMatcher::Make(exclude).status();
}

Result<ContainerRootfs> FindContainerRootfs(const Target& target, const std::string& image) {
  ContainerRootfs c;
  GPUSNAP_ASSIGN_OR_RETURN(auto root_stat, proc::ReadStat(target.host_pid));
  c.init = root_stat.ppid;
  auto nspids = proc::NsPids(c.init);
  if (!nspids.ok() || nspids->size() < 2 || nspids->back() != 1)
    return Status::Error(Code::kFailedPrecondition,
                         "pid {} runs in no container (its parent, pid {}, is not the init of a pid namespace of its "
                         "own): the rootfs path captures a container's filesystem",
                         target.host_pid, c.init);
  GPUSNAP_ASSIGN_OR_RETURN(std::string mountinfo, ReadFile(fmt::format("/proc/{}/mountinfo", c.init)));
  GPUSNAP_ASSIGN_OR_RETURN(auto mounts, rootfs::ParseMountInfo(mountinfo));
  GPUSNAP_ASSIGN_OR_RETURN(c.overlay, rootfs::RootOverlay(mounts));
  c.mount_points = rootfs::MountPointsBesideRoot(mounts);
  GPUSNAP_ASSIGN_OR_RETURN(c.bundle, container::ReadContainerBundle(c.init));
  c.image = image.empty() ? c.bundle.image() : image;
  if (c.image.empty())
    return Status::Error(Code::kFailedPrecondition,
                         "the image of the container of pid {} is unknown (its OCI config `{}` has no `{}` "
                         "annotation): name it with --image, so that a restore can refuse another image",
                         target.host_pid, c.bundle.path, container::kImageNameAnnotation);
  return c;
}

Result<RootfsRecord> CaptureRootfs(const ContainerRootfs& c, const std::vector<std::string>& caches,
                                   const std::vector<std::string>& exclude, const std::string& dir,
                                   uint64_t reserve_bytes, Phases& phases) {
  // What the diff leaves out: the runtime's own files, the container's
  // mounts (their content is not in the writable layer), the caches (each
  // its own archive) and the user's patterns.
  std::vector<std::string> patterns = rootfs::DefaultExclusions();
  for (const auto& m : c.mount_points)
    if (m.find_first_of("*?[") == std::string::npos) patterns.push_back(m);
  for (const auto& cache : caches) patterns.push_back(cache);
  patterns.insert(patterns.end(), exclude.begin(), exclude.end());
  std::set<std::string> seen;
  std::erase_if(patterns, [&seen](const std::string& p) { return !seen.insert(p).second; });
  GPUSNAP_ASSIGN_OR_RETURN(auto diff_exclusions, rootfs::PathMatcher::Make(patterns));
  GPUSNAP_ASSIGN_OR_RETURN(auto cache_exclusions, rootfs::PathMatcher::Make(exclude));
  std::string_view prefix = c.overlay.userxattr ? kUserOverlayPrefix : rootfs::kTrustedOverlayPrefix;
  UniqueFd root_fd(::open(fmt::format("/proc/{}/root", c.init).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root_fd.valid()) return Status::Errno(errno, "opening the root of the container of pid {}", c.init);

  // From the scan to the last archive, the container does nothing.
  phases.Start("rootfs-freeze");
  GPUSNAP_ASSIGN_OR_RETURN(auto frozen, container::FrozenCgroup::Freeze(c.init, std::chrono::seconds(10)));
  phases.Done();

  phases.Start("rootfs-diff");
  GPUSNAP_ASSIGN_OR_RETURN(rootfs::UpperTree tree, rootfs::ScanUpperDir(c.overlay.upper, diff_exclusions));
  std::map<std::string, std::vector<std::string>> lower_names;
  for (const std::string& opaque : rootfs::OpaqueDirectories(tree, prefix)) {
    GPUSNAP_ASSIGN_OR_RETURN(lower_names[opaque], rootfs::LowerNames(c.overlay.lowers, opaque, prefix));
  }
  GPUSNAP_ASSIGN_OR_RETURN(rootfs::DiffPlan plan, rootfs::DiffPlanOf(tree, diff_exclusions, lower_names, prefix));
  struct statvfs vfs{};
  if (::statvfs(dir.c_str(), &vfs) != 0) return Status::Errno(errno, "statvfs `{}`", dir);
  GPUSNAP_RETURN_IF_ERROR(rootfs::CheckFits(rootfs::ArchiveBytesBound(tree, plan),
                                            static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize, reserve_bytes, dir));
  GPUSNAP_ASSIGN_OR_RETURN(auto written,
                           rootfs::WriteRootfsDiff(c.overlay.upper, tree, plan,
                                                   {dir + "/" + SnapshotFiles::kRootfsDiffTar,
                                                    dir + "/" + SnapshotFiles::kDeletedFiles}));
  phases.Done(written.archive_bytes);

  RootfsRecord record;
  record.image = c.image;
  record.image_id = c.bundle.image_id();
  record.command = c.bundle.args;
  record.cwd = c.bundle.cwd;
  record.upper = c.overlay.upper;
  record.lowers = c.overlay.lowers;
  record.excluded = patterns;
  record.excluded_paths = plan.excluded;
  for (const auto& s : plan.skipped) record.skipped.push_back({s.path, s.reason});
  record.entries = written.entries;
  record.deleted = plan.deleted.size();

  if (!caches.empty()) {
    phases.Start("rootfs-caches");
    std::string caches_dir = dir + "/" + SnapshotFiles::kCachesDir;
    if (::mkdir(caches_dir.c_str(), 0700) != 0) return Status::Errno(errno, "creating `{}`", caches_dir);
    uint64_t bytes = 0;
    for (size_t i = 0; i < caches.size(); ++i) {
      const std::string& path = caches[i];
      GPUSNAP_ASSIGN_OR_RETURN(UniqueFd cache_fd, OpenContainerDir(root_fd.get(), path));
      std::string file = fmt::format("{}/{}.tar", SnapshotFiles::kCachesDir, i);
      GPUSNAP_ASSIGN_OR_RETURN(auto archived,
                               rootfs::WriteCacheArchive(cache_fd.get(), path, dir + "/" + file, cache_exclusions));
      bool mount = std::find(c.mount_points.begin(), c.mount_points.end(), path) != c.mount_points.end();
      record.caches.push_back({path, file, mount, archived.entries});
      for (const auto& s : archived.skipped) record.skipped.push_back({s.path, s.reason});
      for (const auto& e : archived.excluded) record.excluded_paths.push_back(e);
      bytes += archived.archive_bytes;
    }
    phases.Done(bytes);
  }
  GPUSNAP_RETURN_IF_ERROR(frozen.Thaw());
  return record;
}

}  // namespace gpusnap
