// What a snapshot directory may hold (docs/snapshot-format.md): regular files
// only, at its top or in the directories the format has (store/layout.h);
// and, once published, exactly the files its metadata lists, besides
// gpusnap.json and CRIU's accounting files. Anything else (a symbolic link, a
// FIFO, a socket, a device, a directory the format does not have) is refused
// naming its path and its type: CRIU must never read an image through a link
// planted in a snapshot, and verification must never pass over what it did
// not hash.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"

namespace gpusnap {

struct SnapshotEntry {
  std::string path;  // relative to the snapshot directory
  mode_t type = 0;   // S_IFREG, S_IFDIR, S_IFLNK, ...: of the entry itself, links not followed
};

// Every entry under `dir`, sorted by path, not following links. `dir` itself
// must be a directory, not a link to one (kCorruption naming its type).
Result<std::vector<SnapshotEntry>> ListSnapshotEntries(const std::string& dir);

// "a regular file", "a directory", "a symbolic link", "a FIFO", "a socket",
// "a character device", "a block device", or "of unknown type".
std::string DescribeFileType(mode_t type);

// Pure. Checks `entries` against the format and, given `listed` (a published
// snapshot's metadata), against its files. kCorruption naming the first
// entry the format refuses ("`checkpoint/cgroup.img` is a symbolic link, not
// a regular file"), else the first listed file that is missing, else the
// first regular file not listed. Returns the files to digest: every regular
// file but gpusnap.json and CRIU's accounting files, sorted.
Result<std::vector<std::string>> CheckSnapshotEntries(const std::vector<SnapshotEntry>& entries,
                                                      const std::map<std::string, FileDigest>* listed);

}  // namespace gpusnap
