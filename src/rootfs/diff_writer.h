// The effects of a rootfs capture: reading a container's overlay upper
// directory (and, for its opaque directories, the lower layers), and writing
// rootfs-diff.tar and deleted.files as CRI-O and checkpointctl lay them out
// (docs/CAPTURE-PATHS.md). The decisions are rootfs/diff_plan.h's; the scan
// and the tar writer are the ones the cache archives use too
// (rootfs/tree_archive.h).
//
// The upper directory is read without following a symbolic link anywhere:
// every entry is opened beneath the upper directory's descriptor with
// openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV), so an
// entry the container swaps for a link while it is read fails the capture
// instead of taking it elsewhere. A regular file that changes size while it is
// written fails it too ("`/x` changed while it was captured"): the caller
// freezes the container (its cgroup) for a consistent diff.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gpusnap/status.h"
#include "rootfs/diff_plan.h"
#include "rootfs/exclusions.h"
#include "rootfs/extract_plan.h"

namespace gpusnap::rootfs {

// Reads the tree under `upper_dir`: every entry's kind, size, device numbers
// and xattrs, parents first, each directory's names sorted. What `exclusions`
// matches is not descended into (and is listed in UpperTree::excluded).
// kFailedPrecondition naming a mount point inside it; kNotFound / kIoError
// naming the entry that could not be read.
Result<UpperTree> ScanUpperDir(const std::string& upper_dir, const PathMatcher& exclusions);

// The names the lower layers (topmost first) hold in directory `dir`
// (relative): the union over the layers down to the first where `dir` is
// opaque, a whiteout or no directory, without the names a higher layer
// whites out. A layer without `dir` adds nothing.
Result<std::vector<std::string>> LowerNames(const std::vector<std::string>& lowers, const std::string& dir,
                                            std::string_view overlay_prefix = kTrustedOverlayPrefix);

struct DiffFiles {
  std::string tar_path;            // rootfs-diff.tar, created (it must not exist)
  std::string deleted_files_path;  // deleted.files: a JSON array of container paths, always written
};

struct DiffWritten {
  uint64_t entries = 0;       // archive entries written
  uint64_t data_bytes = 0;    // file data in them
  uint64_t archive_bytes = 0; // the tar's size
};

// Writes `plan`'s entries of `tree`, read from `upper_dir`, as a pax tar
// (entries relative to the root: "etc/app.conf", directories as
// "var/cache/"; modes, owners, times, the xattrs ArchivedXattrs keeps, hard
// links as links to the first name), and plan.deleted as deleted.files.
// Errors name the entry; a failure leaves what it wrote for the caller's
// temporary directory to take away.
Result<DiffWritten> WriteRootfsDiff(const std::string& upper_dir, const UpperTree& tree, const DiffPlan& plan,
                                    const DiffFiles& files);

// Lists a tar's entries as the restore's safety check reads them
// (rootfs/extract_plan.h), without extracting anything. kCorruption naming
// `tar_path` when it is no tar archive or is cut short.
Result<std::vector<ArchiveEntry>> ListArchive(const std::string& tar_path);

}  // namespace gpusnap::rootfs
