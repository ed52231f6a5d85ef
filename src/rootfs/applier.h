// Applying a rootfs snapshot's archives (docs/CAPTURE-PATHS.md, "Applying the
// diff safely"): rootfs-diff.tar and deleted.files onto a new container's
// root, and each cache archive into its directory. The restore checks every
// archive whole first (CheckArchive: rootfs/extract_plan.h decides), and
// writes nothing unless all of them pass; ApplyArchive then writes one.
//
// ApplyArchive writes beneath one directory descriptor and trusts nothing
// else: each entry's parent is opened with openat2(RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV) and its last
// name is made with *at() calls relative to that parent, never following a
// link. So what the target already holds cannot redirect a write: a symbolic
// link of the image on the way to an entry (the image has `opt -> /etc`, the
// archive `opt/x`), or a mount point (a volume), fails the apply naming the
// entry and what is in the way, kFailedPrecondition (the archive is sound; the
// target is not one it can be applied to). Nothing is written through it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"
#include "rootfs/extract_plan.h"

namespace gpusnap::rootfs {

// Reads deleted.files: a JSON array of container paths, as WriteRootfsDiff
// writes it (each path's checks are PlanExtraction's). kCorruption naming
// `path` when it is not a JSON array of strings; ReadFile's error when it
// cannot be read.
Result<std::vector<std::string>> ReadDeletedFiles(const std::string& path);

// The restore's whole check of one archive before anything is written:
// ListArchive, PlanExtraction with `deleted_paths` (none for a cache
// archive), PlanStatus. kCorruption naming `archive_name` (as the snapshot
// names the file: "rootfs-diff.tar", "caches/0.tar") for an archive that does
// not parse or holds a refused entry.
Result<ExtractionPlan> CheckArchive(const std::string& tar_path, const std::vector<std::string>& deleted_paths,
                                    std::string_view archive_name);

struct Applied {
  uint64_t entries = 0;     // entries written (the archive's root entry, left as it is, not counted)
  uint64_t data_bytes = 0;  // file data written
  uint64_t deleted = 0;     // deleted paths that existed and were removed
};

// Writes the archive at `tar_path` beneath the directory `dir_fd` (O_PATH is
// enough: a container's root as /proc/<pid>/root opens, or a cache directory
// in it), as `plan` (CheckArchive's for this archive) orders it: directories
// and regular files in archive order while the archive is read once, then the
// symbolic links, then the hard links, then plan.deletions, then every
// directory's mode and times (after what was made in it).
//
//   - Paths are the plan's normalized ones, never the archive's raw names.
//     Missing parents are made (0755). An entry of another kind at a path is
//     replaced (a directory removed whole, beneath the descriptor, without
//     following links); a directory over a directory keeps it and takes the
//     archive's owner, mode and times.
//   - Regular files: data streamed from the archive (holes kept), numeric
//     owner, mode, modification time, and the xattrs ArchivedXattrs keeps,
//     all set on the new file's descriptor. Other xattrs an archive might
//     carry (an overlay's, trusted.*, SELinux labels) are never set.
//   - Symbolic links keep their target as it is: it is resolved inside the
//     container when it runs. Hard links link to their (normalized) target
//     entry, itself beneath the descriptor, never following a link.
//   - A deleted path is removed whole; one already missing (or under a
//     missing or non-directory parent) is fine.
//
// kCorruption when the archive is not the one `plan` was made from (an
// entry's path, kind or link target differs from plan.entries, or their
// number: it changed since the check; met before the entry is written) or
// does not read to its end; kFailedPrecondition for a link or mount point in
// the way (above); kIoError / the errno's code for what the filesystem
// refuses. Every message names the archive and the entry. A failure leaves
// what was written before it: the caller discards the target (a placeholder
// container's root goes with the container).
// REQUIRES: `plan` is PlanExtraction's (else kInvalidArgument) and refused
// nothing (else PlanStatus's error).
Result<Applied> ApplyArchive(int dir_fd, const std::string& tar_path, const ExtractionPlan& plan);

}  // namespace gpusnap::rootfs
