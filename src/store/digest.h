// File digests for the snapshot store, computed in parallel.
//
// A file's digest is SHA-256 over 64 MiB chunks: a file of one chunk (up to
// 64 MiB) gets the plain SHA-256 of its content (what sha256sum prints); a
// longer one gets the SHA-256 of the concatenated 32-byte SHA-256 digests of
// its chunks, in order. Chunks of all files are hashed on all cores, so a
// multi-GiB page image costs a fraction of a second instead of seconds on one
// thread (docs/BENCHMARK.md), with SHA-256's strength kept.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"
#include "store/sha256.h"

namespace gpusnap {

inline constexpr uint64_t kDigestChunkBytes = 64ull << 20;
inline constexpr const char* kDigestAlgorithm = "sha256-64MiB-chunks";

// How a digest shares the machine with a reader of the same files (CRIU,
// restoring from them while they are checked). Without it, a digest from a
// cold page cache reads the disk at 16 places at once ahead of the reader and
// a core per thread, and the reader, whose pace is the restore's, waits on
// both: it left gpusnap's restore without the shim 1.4x slower than CRIU and
// the driver alone (docs/RESTORE-OPTIONS.md).
struct DigestPace {
  unsigned spare_cores = 0;          // cores left to the reader
  // Until it says the reader has finished, a block is read only once the page
  // cache holds it (mincore), so the disk is read once, by the reader, in its
  // order, and the digest follows from memory. Empty: read at once.
  std::function<bool()> reader_done;
};

// Digests `names` (paths relative to `root`). With `sync`, each file is also
// fsync'd. `threads` 0: one per core (less pace.spare_cores). Errors name the
// file; one that is not a regular file (a symbolic link, which is not
// followed, a FIFO...) is kCorruption naming its type.
Result<std::map<std::string, FileDigest>> DigestFiles(const std::string& root, const std::vector<std::string>& names,
                                                      bool sync, unsigned threads = 0,
                                                      uint64_t chunk_bytes = kDigestChunkBytes,
                                                      const DigestPace& pace = {});

// Whether the page cache holds all of [offset, offset + length) of fd's file
// (false where it cannot tell).
bool PageCacheHolds(int fd, uint64_t offset, uint64_t length);

// The chunk size of a named algorithm: kDigestAlgorithm, or "sha256" (whole
// files, snapshots of schema < 1.2). kNotSupported for any other name.
Result<uint64_t> DigestChunkBytes(std::string_view algorithm);

}  // namespace gpusnap
