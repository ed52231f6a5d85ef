// What the two kinds of archive of a rootfs snapshot share
// (docs/CAPTURE-PATHS.md): a directory tree read beneath its descriptor (a
// container's writable layer, or one of its cache directories), and entries of
// it written as a pax tar. rootfs/diff_writer.h and rootfs/cache_archive.h
// are the two uses.
//
// Nothing is read through a symbolic link or in another mount: every entry is
// reached beneath the tree's descriptor (rootfs/beneath.h), so an entry the
// container swaps for a link while it is read fails the capture instead of
// taking it elsewhere, and a mount point inside the tree is refused naming it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gpusnap/status.h"
#include "rootfs/diff_plan.h"
#include "rootfs/exclusions.h"

namespace gpusnap::rootfs {

// Where a tree lies in the container, and how messages name it.
struct TreeOrigin {
  std::string container_root;  // the tree's top as a container path: "/", "/root/.triton"
  std::string description;     // "the writable layer", "the cache `/root/.triton`"
};

// Reads the tree under `dir_fd` (which may be O_PATH): every entry's kind,
// size, device numbers and xattrs, parents first, each directory's names
// sorted. What `exclusions` matches (by container path) is not descended into
// and is listed in UpperTree::excluded. kFailedPrecondition naming a mount
// point inside the tree ("exclude it"); kNotFound / kIoError naming an entry
// that could not be read.
Result<UpperTree> ScanTree(int dir_fd, const TreeOrigin& origin, const PathMatcher& exclusions);

struct TreeArchiveWritten {
  uint64_t entries = 0;        // archive entries written
  uint64_t data_bytes = 0;     // file data in them
  uint64_t archive_bytes = 0;  // the tar's size
};

// Writes the entries `archived` (indices into tree.entries, in order) as a
// pax tar at `tar_path`, which must not exist: paths relative to the tree's
// top ("etc/app.conf", directories "var/cache/"), modes, numeric owners,
// times, the xattrs ArchivedXattrs keeps, hard links as links to the first
// name met. Each entry is opened again beneath `dir_fd`; one whose kind
// differs from the scan's, or a regular file whose size or modification time
// changes while it is read, fails naming it ("`/x` changed while it was
// captured"). A failure leaves what was written for the caller to take away.
Result<TreeArchiveWritten> WriteTreeArchive(int dir_fd, const TreeOrigin& origin, const UpperTree& tree,
                                            const std::vector<size_t>& archived, const std::string& tar_path);

}  // namespace gpusnap::rootfs
