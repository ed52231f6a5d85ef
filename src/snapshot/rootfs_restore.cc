// The rootfs restore, as docs/CAPTURE-PATHS.md tells it.
//
// 1. Verify the snapshot (schema, every file's digest): a flipped byte in an
//    archive stops here.
// 2. The placeholder: an idle `gpusnap __placeholder` container of the
//    snapshot's image (its runtime's annotation; another image is refused
//    naming both).
// 3. Check every archive whole (rootfs-diff.tar with deleted.files, each
//    cache archive): an entry that would leave the root, one under a link
//    the archive makes, one in a mount point of the new container, or an
//    archive that does not parse refuses the restore, nothing written.
// 4. Apply the diff onto the container's root, then each cache into its
//    directory, beneath descriptors that follow no link.
// 5. Start the recorded command in the container (its namespaces, cgroups,
//    root and working directory, the placeholder's environment: the pod's),
//    as the placeholder's child, and record the workload: the point of no
//    return.
//
// One exit: nothing needs undoing before step 4, and what steps 4-5 wrote is
// in the placeholder's root, which goes with the container: a failure there
// leaves it for the caller to discard (the error says so). The store is never
// changed.
#include "snapshot/rootfs_restore.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "container/oci_bundle.h"
#include "ns/enter.h"
#include "proc/proc.h"
#include "rootfs/applier.h"
#include "rootfs/beneath.h"
#include "rootfs/exclusions.h"
#include "rootfs/overlay_mount.h"
#include "snapshot/phases.h"
#include "snapshot/placeholder.h"
#include "store/layout.h"
#include "store/store.h"
#include "util/clock.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/test_hooks.h"

namespace gpusnap {

namespace {

// A cache directory in the new container, made where it is missing: every
// component opened beneath the root with no link followed, crossing into the
// container's mounts (a cache is often a volume).
Result<UniqueFd> OpenOrMakeContainerDir(int root_fd, const std::string& path) {
  UniqueFd dir(::dup(root_fd));
  if (!dir.valid()) return Status::Errno(errno, "dup");
  size_t start = 1;
  while (start < path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string name = path.substr(start, end - start);
    if (::mkdirat(dir.get(), name.c_str(), 0755) != 0 && errno != EEXIST)
      return Status::Errno(errno, "making cache directory `{}` in the container", path.substr(0, end));
    int fd = rootfs::OpenBeneathAcrossMounts(dir.get(), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (fd < 0)
      return Status::Error(errno == ELOOP ? Code::kFailedPrecondition : Code::kIoError,
                           "cache directory `{}` of the container: `{}` {}", path, path.substr(0, end),
                           errno == ELOOP || errno == ENOTDIR ? "is no directory (a link or a file): nothing is "
                                                                "written through it"
                                                              : std::strerror(errno));
    dir = UniqueFd(fd);
    start = end + 1;
  }
  return dir;
}

Result<RestoreResult> TakeRootfsRestore(const RestoreOptions& options, const Store& store, const SnapshotMeta& meta,
                                        const std::string& fallback_reason, Phases& phases) {
  RestoreResult result;
  result.restore_path = CapturePath::kRootfs;
  result.fallback_reason = fallback_reason;

  // 1. Verify.
  phases.Start("verify");
  if (!meta.rootfs)
    return Status::Error(Code::kInvalidArgument, "snapshot `{}` holds no rootfs capture (its capture path is {})",
                         meta.id, CapturePathName(meta.capture_path.path));
  if (options.into_container.empty())
    return Status::Error(Code::kInvalidArgument,
                         "snapshot `{}` is a rootfs capture: it restores into a placeholder container of image `{}` "
                         "(--into-container ID), where its command starts",
                         meta.id, meta.rootfs->image);
  if (options.standby || !options.gpus.empty() || options.lazy_pages)
    return Status::Error(Code::kInvalidArgument,
                         "snapshot `{}` is restored by its rootfs capture, a cold start: --standby, --gpu-map, --gpus "
                         "and --lazy-pages do not apply",
                         meta.id);
  std::string dir = store.SnapshotDir(meta.id);
  GPUSNAP_RETURN_IF_ERROR(store.Verify(meta, dir).Wrap("refusing to restore"));
  std::string name = RestoredWorkloadName(meta, options.name);
  GPUSNAP_ASSIGN_OR_RETURN(NameClaim name_claim, ClaimWorkloadName(name));
  phases.Done(meta.total_bytes);

  // 2. The placeholder, of the snapshot's image.
  phases.Start("placeholder");
  GPUSNAP_ASSIGN_OR_RETURN(auto target, FindIdlePlaceholder(options.into_container));
  GPUSNAP_ASSIGN_OR_RETURN(auto bundle, container::ReadContainerBundle(target.init_pid));
  const RootfsRecord& rf = *meta.rootfs;
  bool same_id = rf.image_id.empty() || bundle.image_id().empty() || rf.image_id == bundle.image_id();
  if (bundle.image() != rf.image || !same_id)
    return Status::Error(Code::kFailedPrecondition,
                         "refusing to restore: snapshot `{}` was taken from image `{}`{}; container {} runs `{}`{}: "
                         "its diff applies only onto the image it came from",
                         meta.id, rf.image, rf.image_id.empty() ? "" : " (" + rf.image_id + ")", target.container_id,
                         bundle.image().empty() ? "an image its runtime did not name" : bundle.image(),
                         bundle.image_id().empty() ? "" : " (" + bundle.image_id() + ")");
  GPUSNAP_ASSIGN_OR_RETURN(std::string mountinfo, ReadFile(fmt::format("/proc/{}/mountinfo", target.init_pid)));
  GPUSNAP_ASSIGN_OR_RETURN(auto mounts, rootfs::ParseMountInfo(mountinfo));
  std::vector<std::string> mount_points = rootfs::MountPointsBesideRoot(mounts);
  phases.Done();

  // 3. Every archive checked whole before a byte is written.
  phases.Start("rootfs-check");
  GPUSNAP_ASSIGN_OR_RETURN(auto deleted, rootfs::ReadDeletedFiles(dir + "/" + SnapshotFiles::kDeletedFiles));
  GPUSNAP_ASSIGN_OR_RETURN(auto diff_plan, rootfs::CheckArchive(dir + "/" + SnapshotFiles::kRootfsDiffTar, deleted,
                                                                SnapshotFiles::kRootfsDiffTar));
  for (size_t i : diff_plan.order) {
    std::string path = "/" + diff_plan.normalized[i];
    bool directory = diff_plan.entries[i].kind == rootfs::FileKind::kDirectory && !diff_plan.entries[i].hardlink;
    // A directory at a mount point is the volume's: left alone.
    for (const auto& m : mount_points)
      if (rootfs::IsAtOrUnder(path, m) && !(directory && path == m))
        return Status::Error(Code::kFailedPrecondition,
                             "refusing to restore: `{}` of `{}` lies in `{}`, a mount point of container {}: a diff "
                             "never writes into a volume (nothing was applied)",
                             diff_plan.normalized[i], SnapshotFiles::kRootfsDiffTar, m, target.container_id);
  }
  std::vector<rootfs::ExtractionPlan> cache_plans;
  for (const auto& cache : rf.caches) {
    GPUSNAP_ASSIGN_OR_RETURN(auto plan, rootfs::CheckArchive(dir + "/" + cache.file, {}, cache.file));
    cache_plans.push_back(std::move(plan));
  }
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("rootfs-check"));
  phases.Done();

  // 4. The diff onto the root, the caches into their directories.
  auto discard = [&](const Status& st) {
    return st.Wrap(fmt::format("restore of `{}` failed part-way: container {}'s root holds part of the snapshot; "
                               "discard the container",
                               meta.id, target.container_id));
  };
  phases.Start("rootfs-apply");
  UniqueFd root_fd(::open(fmt::format("/proc/{}/root", target.init_pid).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root_fd.valid()) return Status::Errno(errno, "opening the root of container {}", target.container_id);
  auto applied = rootfs::ApplyArchive(root_fd.get(), dir + "/" + SnapshotFiles::kRootfsDiffTar, diff_plan);
  if (!applied.ok()) return discard(applied.status());
  uint64_t bytes = applied->data_bytes;
  for (size_t i = 0; i < rf.caches.size(); ++i) {
    auto cache_fd = OpenOrMakeContainerDir(root_fd.get(), rf.caches[i].path);
    if (!cache_fd.ok()) return discard(cache_fd.status());
    auto cache = rootfs::ApplyArchive(cache_fd->get(), dir + "/" + rf.caches[i].file, cache_plans[i]);
    if (!cache.ok()) return discard(cache.status());
    bytes += cache->data_bytes;
  }
  if (Status st = InjectedFailure("rootfs-apply"); !st.ok()) return discard(st);
  phases.Done(bytes);

  // 5. The command, and its record.
  phases.Start("start");
  auto pid = ns::SpawnInContainer({.init = target.init_pid,
                                   .argv = rf.command,
                                   .env = bundle.env,
                                   .cwd = rf.cwd.empty() ? "/" : rf.cwd,
                                   .cgroup_procs = target.cgroup_procs});
  if (!pid.ok()) return discard(pid.status());
  auto stat = proc::ReadStat(*pid);
  Workload& w = result.workload;
  w.name = name;
  w.pid = *pid;
  w.reaper_pid = target.init_pid;
  w.cmdline = rf.command;
  w.started = NowRfc3339();
  w.restored_from = meta.id;
  w.start_time = stat.ok() ? stat->start_time : 0;
  w.running = true;
  GPUSNAP_RETURN_IF_ERROR(RecordWorkload(w, std::move(name_claim)));
  phases.Done();
  phases.Total();
  result.timings_s = phases.timings();
  return result;
}

}  // namespace

Result<RestoreResult> RestoreRootfs(const RestoreOptions& options, const Store& store, const SnapshotMeta& meta,
                                    const std::string& fallback_reason) {
  Phases phases(options.progress);
  return TakeRootfsRestore(options, store, meta, fallback_reason, phases);
}

}  // namespace gpusnap
