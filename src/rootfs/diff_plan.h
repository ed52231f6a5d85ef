// The plan of a rootfs diff: which entries of a scanned upper directory go
// into rootfs-diff.tar, which paths into deleted.files, and what is skipped
// or refused, with the reasons (docs/CAPTURE-PATHS.md); and likewise the plan
// of a cache directory's archive. Pure: the scan (rootfs/tree_archive.h)
// reads the directory, this decides.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "gpusnap/status.h"
#include "rootfs/exclusions.h"
#include "rootfs/upper_entry.h"

namespace gpusnap::rootfs {

// An upper directory as read (or a cache directory: the same form): every
// entry, parents before children, the names of each directory's children (by
// the directory's relative path, "" for the top) and the excluded paths the
// scan did not descend into.
struct UpperTree {
  std::vector<UpperEntry> entries;
  std::map<std::string, std::vector<std::string>> children;
  std::vector<std::string> excluded;  // container paths, as the scan met them
};

struct Skipped {
  std::string path;    // container path
  std::string reason;  // a sentence naming it
};

struct DiffPlan {
  std::vector<size_t> archived;       // indices into UpperTree::entries, in order
  std::vector<std::string> deleted;   // container paths for deleted.files, sorted, each once
  std::vector<Skipped> skipped;
  std::vector<std::string> excluded;  // container paths left out by the exclusions
  std::vector<std::string> opaque;    // the opaque directories (container paths)
  uint64_t archived_bytes = 0;        // the regular files' sizes
};

// The relative paths of the opaque directories of `tree` (what the caller
// lists in the lower layers for DiffPlanOf's `lower_names`).
std::vector<std::string> OpaqueDirectories(const UpperTree& tree,
                                           std::string_view overlay_prefix = kTrustedOverlayPrefix);

// The plan. `lower_names` holds, for each opaque directory (relative path),
// the names the lower layers hold in it; a missing one counts as none.
// An entry under an excluded path is left out (and the excluded path listed
// once); a refused entry fails the plan: kFailedPrecondition with the first
// reason and how many more ("...; 2 more entries are refused; exclude them to
// capture the rest").
Result<DiffPlan> DiffPlanOf(const UpperTree& tree, const PathMatcher& exclusions,
                            const std::map<std::string, std::vector<std::string>>& lower_names = {},
                            std::string_view overlay_prefix = kTrustedOverlayPrefix);

// The plan of a cache directory's archive, `tree` as the scan read it (its
// exclusions already applied: what they matched is in tree.excluded) at
// container path `container_root`: every entry DecideCacheEntry keeps, in
// order; no deletions. A refused entry (a device) fails the plan like
// DiffPlanOf's, kFailedPrecondition naming it.
Result<DiffPlan> CachePlanOf(const UpperTree& tree, std::string_view container_root);

// Whether `needed` bytes fit in `available` ones, keeping `reserve` free.
// kFailedPrecondition "the rootfs capture needs N bytes in `where`, which has
// M free (R kept in reserve)".
Status CheckFits(uint64_t needed, uint64_t available, uint64_t reserve, std::string_view where);

// The bytes a tar of `plan` takes at most: each entry's header (with a pax
// extended header) and its data, rounded up to 512-byte blocks, and the
// archive's end. For a rootfs diff's plan or a cache's (CachePlanOf) alike.
uint64_t ArchiveBytesBound(const UpperTree& tree, const DiffPlan& plan);

}  // namespace gpusnap::rootfs
