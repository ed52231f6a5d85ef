// Paths beneath a directory descriptor: how the rootfs code reads a writable
// layer or a cache directory and writes into a container's root, never
// following a symbolic link (nor a /proc magic link) and never entering
// another mount, whatever the tree it works on holds. The tree's owner (a
// container) controls every name in it; the descriptor is the only thing
// gpusnap trusts.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gpusnap/status.h"
#include "rootfs/upper_entry.h"

namespace gpusnap::rootfs {

// `rel` ("a/b"; "" for the directory itself) beneath `dir_fd`, opened with
// `flags` (O_CLOEXEC added) by openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
// RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV). -1 with errno on failure: ELOOP
// for a symbolic link on the way (or at the end, unless `flags` holds both
// O_PATH and O_NOFOLLOW, which open the link itself), EXDEV for a mount point
// on the way or at the end, ENOTDIR for a non-directory on the way.
int OpenBeneath(int dir_fd, const std::string& rel, int flags);

// The same, but entering the mounts on the way: how a cache directory, often
// a volume of the container, is reached from the container's root. Still no
// link of any kind is followed; what lies beneath the directory is opened
// with OpenBeneath from its descriptor.
int OpenBeneathAcrossMounts(int dir_fd, const std::string& rel, int flags);

// What `name` in `dir_fd` is, the entry itself (a link is not followed).
struct EntryStat {
  FileKind kind = FileKind::kUnknown;
  uint64_t size = 0;  // regular files only
  uint32_t rdev_major = 0;
  uint32_t rdev_minor = 0;
  // The root of a mount (a volume, a bind mount): what it shows is another
  // mount's, which nothing here reads or writes into.
  bool mount_point = false;
};

// Nothing when `name` does not exist. Errors name `what`.
Result<std::optional<EntryStat>> StatEntry(int dir_fd, const std::string& name, const std::string& what);

// The names in the directory `dir_fd`, sorted, "." and ".." left out (the
// descriptor may be O_PATH; its offset is not moved). Errors name `what`.
Result<std::vector<std::string>> DirectoryNames(int dir_fd, const std::string& what);

// The xattrs of `name` in `dir_fd`, the entry itself (not what a link
// names); none where the filesystem has no xattrs. Errors name `what`.
Result<std::map<std::string, std::string>> EntryXattrs(int dir_fd, const std::string& name, const std::string& what);

// Removes `name` in `dir_fd` and, when it is a directory, everything beneath
// it, without following a link. A mount point met on the way (at `name` or
// beneath it) is kFailedPrecondition naming it, and nothing in it is touched.
// A missing `name` is fine. Errors name `what` (the container path of `name`).
Status RemoveBeneath(int dir_fd, const std::string& name, const std::string& what);

}  // namespace gpusnap::rootfs
