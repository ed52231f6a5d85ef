// The archive of one cache directory of a container, caches/<n>.tar
// (docs/CAPTURE-PATHS.md, "Cache directories"): the directory's whole tree,
// read beneath a descriptor the caller opened on it (through the container's
// /proc/<pid>/root), written by the same scan and tar writer as
// rootfs-diff.tar (rootfs/tree_archive.h). Applying one is
// rootfs/applier.h's ApplyArchive with no deletions, beneath a descriptor of
// the cache directory in the new container.
//
// Before writing, a capture bounds the archive's size with
// CacheArchiveBytesBound (for CheckFits, rootfs/diff_plan.h); both scan the
// tree, so the container stays frozen from the bound to the write.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"
#include "rootfs/diff_plan.h"
#include "rootfs/exclusions.h"

namespace gpusnap::rootfs {

struct CacheWritten {
  uint64_t entries = 0;        // archive entries written
  uint64_t data_bytes = 0;     // file data in them
  uint64_t archive_bytes = 0;  // the tar's size
  std::vector<Skipped> skipped;       // sockets and FIFOs, with the reasons
  std::vector<std::string> excluded;  // the topmost container paths the exclusions left out
};

// Writes the whole tree under `dir_fd` (a cache directory, opened by the
// caller beneath the container's root; it may be O_PATH) as a pax tar at
// `tar_path`, which must not exist. Entries are relative to the directory
// ("a/b.bin", directories "a/"); the directory itself is no entry. Modes,
// numeric owners, times, the xattrs ArchivedXattrs keeps, symbolic links as
// they are, hard links as links to the first name; sockets and FIFOs skipped
// (CacheWritten::skipped), devices refused (kFailedPrecondition naming the
// first). `container_path` ("/root/.triton") is the directory's absolute path
// in the container: what `exclusions` are matched against, and what messages
// name. Never follows a link, never enters another mount (a mount point in
// the tree is kFailedPrecondition naming it: exclude it, or name it as a
// cache of its own). A file that changes while it is read fails naming it.
// kInvalidArgument when `container_path` is not absolute, or when
// `exclusions` leave out the whole directory (the caller passes the user's
// exclusions here, not the cache paths it leaves out of rootfs-diff.tar).
// A failure leaves what was written for the caller to take away.
Result<CacheWritten> WriteCacheArchive(int dir_fd, std::string_view container_path, const std::string& tar_path,
                                       const PathMatcher& exclusions);

// The bytes WriteCacheArchive's tar of the same tree takes at most
// (ArchiveBytesBound of its plan); the same refusals.
Result<uint64_t> CacheArchiveBytesBound(int dir_fd, std::string_view container_path, const PathMatcher& exclusions);

}  // namespace gpusnap::rootfs
