// Whether a rootfs snapshot's archive may be applied to a container's root,
// and in which order (docs/CAPTURE-PATHS.md, "Applying the diff safely"). Pure:
// the caller lists the archive's headers (and deleted.files) first, this
// decides, and nothing is written unless every entry is accepted.
//
// An entry is refused, with a reason naming it, when its path:
//   - is empty, absolute, or has a `..` component ("." and empty components
//     are dropped: "./etc//a" is "etc/a"; "." alone is the root, which an
//     archive may list and which is left as the container has it);
//   - is listed twice;
//   - lies under an entry of the archive that is a symbolic link (the link
//     would take the write anywhere, out of the root included) or that is
//     not a directory (a regular file, a hard link);
//   - is of a kind a rootfs diff never holds (a device, a FIFO, a socket);
//   - is a hard link whose target is not an earlier, non-directory entry of
//     the archive (after the same path checks).
// A deleted path (deleted.files: container paths, "/etc/old.conf") is refused
// when it is the root, has a `..` component, or lies under a symbolic link of
// the archive.
//
// Symbolic links may point anywhere: their targets are resolved inside the
// container when it runs, never while applying. What the container's image
// already holds (a symbolic link of the image on the way to an entry) the
// applier refuses to follow as it writes; this plan covers the archive.
//
// The order: every directory and regular file in archive order (a missing
// parent is made as the applier goes), then the symbolic links, then the hard
// links: so no entry is ever written through a link the archive made, and
// every hard link finds its target.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"
#include "rootfs/upper_entry.h"

namespace gpusnap::rootfs {

struct ArchiveEntry {
  std::string path;  // as the archive names it
  FileKind kind = FileKind::kUnknown;
  bool hardlink = false;    // a hard link (then `kind` is ignored)
  std::string link_target;  // a symbolic link's target, or a hard link's target path
};

struct Refusal {
  std::string entry;   // the path as the archive (or deleted.files) names it
  std::string reason;  // a sentence naming it
};

struct ExtractionPlan {
  // Indices into the entries, in the order to apply them; refused entries,
  // and the root entry, are in none.
  std::vector<size_t> order;
  std::vector<std::string> normalized;  // per entry: its clean relative path ("" for the root)
  std::vector<std::string> deletions;   // the accepted deleted paths, clean and relative, in the order given
  std::vector<Refusal> refused;         // in archive order, then the deletions'
  // The entries as listed: what the applier holds the archive to as it reads
  // it, so that one changed since the check (a path, a kind, a link's
  // target) is refused, not applied.
  std::vector<ArchiveEntry> entries;
};

// "etc/a" for "./etc//a/", "" for "." or "./"; kInvalidArgument for an
// empty, absolute or `..` path (the message names it).
Result<std::string> NormalizeArchivePath(std::string_view path);

ExtractionPlan PlanExtraction(const std::vector<ArchiveEntry>& entries,
                              const std::vector<std::string>& deleted_paths = {});

// OK when nothing was refused; else kCorruption: "`<archive>`: <first reason>
// also refused: `<entry>`, ... (up to three, then how many more); nothing was applied".
Status PlanStatus(const ExtractionPlan& plan, std::string_view archive_name);

}  // namespace gpusnap::rootfs
