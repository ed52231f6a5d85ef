// The rootfs capture path's part of a checkpoint (docs/CAPTURE-PATHS.md):
// the container's writable layer as rootfs-diff.tar and deleted.files, and
// each named cache directory as caches/<n>.tar, read while the container's
// cgroup is frozen. The checkpoint story (checkpoint.cc) calls these as its
// steps; the decisions are rootfs/'s.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "container/oci_bundle.h"
#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"
#include "rootfs/overlay_mount.h"
#include "snapshot/phases.h"
#include "snapshot/target.h"

namespace gpusnap {

// What a rootfs capture of a target's container reads.
struct ContainerRootfs {
  pid_t init = 0;                         // the container's init (host pid)
  rootfs::OverlayLayers overlay;          // its root
  std::vector<std::string> mount_points;  // its other mounts (volumes), as container paths
  container::BundleConfig bundle;         // its command, cwd and annotations
  std::string image;                      // the image it runs
};

// The rootfs path's pre-check: `target`'s tree runs in a container (its root's
// parent is the init of a pid namespace other than ours) whose root is an
// overlay with a writable layer, whose OCI config is found, and whose image is
// known (`image`, else the config's annotation). Errors say which is missing.
Result<ContainerRootfs> FindContainerRootfs(const Target& target, const std::string& image);

// The user's cache directories and exclusions, checked before anything is
// frozen: a cache path must be absolute, clean, not the root, without glob
// characters, and given once. kInvalidArgument naming it.
Status CheckRootfsRequest(const std::vector<std::string>& caches, const std::vector<std::string>& exclude);

// Writes the rootfs part into the snapshot directory `dir` (rootfs-diff.tar,
// deleted.files, caches/<n>.tar), the container frozen from its scan to the
// last archive. `reserve_bytes` stay free in `dir`'s filesystem: a diff that
// would not fit is refused before a byte is written. The record it returns
// is the snapshot's `rootfs`.
Result<RootfsRecord> CaptureRootfs(const ContainerRootfs& container, const std::vector<std::string>& caches,
                                   const std::vector<std::string>& exclude, const std::string& dir,
                                   uint64_t reserve_bytes, Phases& phases);

}  // namespace gpusnap
