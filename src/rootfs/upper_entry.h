// What a rootfs capture does with each entry of a container's overlay upper
// directory (docs/CAPTURE-PATHS.md, "What the upper directory holds"). Pure:
// the caller lstat()s the entry and reads its xattrs, these functions decide.
//
//   regular file, directory, symbolic link     kept: into rootfs-diff.tar
//   character device 0/0                       a whiteout: the path was deleted
//   empty regular file with <ovl>whiteout      a whiteout (the xattr form, kernels from 6.7)
//   directory with <ovl>opaque = "y"           an opaque directory: kept, and what the
//                                              lower layers hold in it is deleted
//   regular file with <ovl>metacopy            refused: its data is in a lower layer
//   directory with <ovl>redirect               refused: a renamed directory whose content
//                                              is in a lower layer under another name
//   socket, FIFO                               skipped: the workload makes them again
//   any other device                           refused
//
// where <ovl> is "trusted.overlay." (or "user.overlay." on an overlay mounted
// with userxattr). A refused entry fails the capture, naming it, unless the
// exclusions leave it out; a skipped one is recorded with its reason.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace gpusnap::rootfs {

enum class FileKind { kRegular, kDirectory, kSymlink, kCharDevice, kBlockDevice, kFifo, kSocket, kUnknown };

// "regular file", "directory", "symbolic link", ... for messages.
const char* FileKindName(FileKind kind);
// From a stat's st_mode.
FileKind FileKindOfMode(uint32_t st_mode);

struct UpperEntry {
  std::string path;  // relative to the upper dir, "etc/app.conf"; never empty
  FileKind kind = FileKind::kUnknown;
  uint32_t rdev_major = 0;  // devices only
  uint32_t rdev_minor = 0;
  uint64_t size = 0;
  std::map<std::string, std::string> xattrs;  // name -> value, as read (llistxattr/lgetxattr)
};

enum class Disposition {
  kKeep,       // into the archive
  kWhiteout,   // into deleted.files, not the archive
  kOpaqueDir,  // into the archive as a directory; the lower layers' names in it into deleted.files
  kSkip,       // left out, recorded with the reason
  kRefuse,     // the capture fails with the reason
};

const char* DispositionName(Disposition d);

struct EntryDecision {
  Disposition disposition = Disposition::kKeep;
  std::string reason;  // for kSkip and kRefuse: a sentence naming the entry
};

// The xattr prefix of an overlay's own attributes.
inline constexpr std::string_view kTrustedOverlayPrefix = "trusted.overlay.";
inline constexpr std::string_view kUserOverlayPrefix = "user.overlay.";

// The decision for one entry; `overlay_prefix` is kTrustedOverlayPrefix or
// kUserOverlayPrefix (OverlayLayers::userxattr).
EntryDecision DecideUpperEntry(const UpperEntry& entry, std::string_view overlay_prefix = kTrustedOverlayPrefix);

// The xattrs of a kept entry that go into the archive: user.* (but the
// overlay's own), security.capability (a binary's file capabilities) and the
// POSIX ACLs (system.posix_acl_access, system.posix_acl_default). The
// overlay's attributes, SELinux labels (the new container has its own) and
// trusted.* are dropped.
std::map<std::string, std::string> ArchivedXattrs(const std::map<std::string, std::string>& xattrs,
                                                  std::string_view overlay_prefix = kTrustedOverlayPrefix);

// The deletions an opaque directory `dir` (relative, as UpperEntry::path)
// stands for: every name the lower layers hold in it (`lower_names`, the
// union over the layers) that the upper directory does not (`upper_names`),
// as container paths ("/dir/name"), sorted. A name in the upper directory
// replaces the lower one in the archive already.
std::vector<std::string> OpaqueDeletions(std::string_view dir, const std::vector<std::string>& upper_names,
                                         const std::vector<std::string>& lower_names);

// The container path of an upper entry: "/" + path.
std::string ContainerPath(std::string_view upper_relative_path);

// The container path of an entry `relative_path` ("a/b", "" for the top) of
// the tree at container path `container_root` ("/" for a writable layer,
// "/root/.triton" for a cache): "/root/.triton/a/b".
std::string ContainerPathIn(std::string_view container_root, std::string_view relative_path);

// The decision for one entry of a cache directory (docs/CAPTURE-PATHS.md,
// "Cache directories"), at container path `container_root`: regular files,
// directories and symbolic links kept, sockets and FIFOs skipped, every
// device refused (no overlay is there: a 0/0 character device is a device
// like any other, and overlay xattrs mean nothing).
EntryDecision DecideCacheEntry(const UpperEntry& entry, std::string_view container_root);

}  // namespace gpusnap::rootfs
