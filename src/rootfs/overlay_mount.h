// A container's writable layer, found from its mounts: the overlay mounted at
// its root, as one line of /proc/<pid>/mountinfo shows it
// (docs/CAPTURE-PATHS.md, "Finding the writable layer"). Pure functions over
// text.
//
//   36 35 0:52 / / rw,relatime - overlay overlay rw,lowerdir=/l2:/l1,upperdir=/u,workdir=/w
//   id parent dev root mount-point options [optional...] - fstype source super-options
//
// The kernel escapes a space, a tab, a newline and a backslash in the root and
// mount point as \040, \011, \012 and \134 (octal), and, in an option's value,
// a comma too (\054), so that fields split on ' ' and options on ','. A legacy
// `lowerdir=` value is the colon-separated list the mount was given, in which a
// literal colon is `\:` (shown as `\134:`) and `::` comes before each data-only
// layers; kernels from 6.7 may show the layers as `lowerdir+=` and `datadir+=`
// options instead, one per layer.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::rootfs {

// `text` with every \ooo (three octal digits) replaced by the byte it names.
// A backslash not followed by three octal digits stays as it is.
std::string UnescapeMountField(std::string_view text);

struct MountInfoEntry {
  int mount_id = 0;
  int parent_id = 0;
  std::string root;         // the path inside the mounted filesystem that is mounted here, unescaped
  std::string mount_point;  // as the reading process sees it, unescaped
  std::string fstype;
  std::string source;
  std::string super_options;  // raw (still escaped): ParseOverlayOptions splits them
};

// One line of mountinfo. kInvalidArgument, quoting the line, when it lacks a
// field or its ids are not numbers.
Result<MountInfoEntry> ParseMountInfoLine(std::string_view line);

// Every line of a mountinfo text, in order (empty lines skipped). The first
// malformed line is an error, naming its number.
Result<std::vector<MountInfoEntry>> ParseMountInfo(std::string_view text);

// The layers of an overlay mount, from its super options.
struct OverlayLayers {
  std::string upper;                     // empty: a read-only overlay, no writable layer
  std::string work;
  std::vector<std::string> lowers;       // topmost first, as overlayfs lists them
  std::vector<std::string> data_lowers;  // data-only layers (after `::`, or datadir+=)
  bool userxattr = false;                // its xattrs are user.overlay.*, not trusted.overlay.*
  bool metacopy = false;                 // metacopy=on: an upper file may hold no data
  bool redirect_dir = false;             // redirect_dir=on|follow: a renamed directory points into a lower
  bool index = false;                    // index=on
};

// Parses overlay super options ("rw,lowerdir=...,upperdir=...,workdir=...").
// kInvalidArgument for a legacy lowerdir list with an empty layer, for both a
// legacy lowerdir and lowerdir+=, or for an option repeated that must not be.
Result<OverlayLayers> ParseOverlayOptions(std::string_view super_options);

// The overlay a process's root is: the last entry of `mounts` whose mount
// point is "/" (a later mount at the same point hides an earlier one). Its
// fstype must be "overlay" with an upper dir; kFailedPrecondition otherwise,
// naming what the root is ("the container's root is an `ext4` mount of
// /dev/sda1, not an overlay: it has no writable layer to capture").
// kNotFound when nothing is mounted at "/".
Result<OverlayLayers> RootOverlay(const std::vector<MountInfoEntry>& mounts);

// The mount points other than "/" in `mounts` (unescaped, as listed, each
// once): what a rootfs capture leaves to the cache archives or excludes, and
// what a restore must not write into.
std::vector<std::string> MountPointsBesideRoot(const std::vector<MountInfoEntry>& mounts);

}  // namespace gpusnap::rootfs
