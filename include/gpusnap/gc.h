// What a garbage collection of the gpushare chunk store decided and did
// (CollectGarbage in gpusnap/operations.h; the rules in
// src/chunks/chunk_gc.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpusnap {

struct GcItem {
  std::string path;             // absolute
  uint64_t bytes = 0;
  std::string reason;           // "unreferenced", "unreferenced, least recently used" (beyond
                                // the cache's limit) or "stale temporary"
};

struct GcResult {
  std::vector<GcItem> removed;  // what went (with dry_run: what would go)
  uint64_t removed_bytes = 0;
  uint64_t kept_chunks = 0;     // chunk files some manifest names
  uint64_t kept_bytes = 0;
  uint64_t cached_chunks = 0;   // chunk files no manifest names, kept within the limit
  uint64_t cached_bytes = 0;
  uint64_t keep_unused_bytes = 0;  // that limit (0: none are kept)
  uint64_t manifests = 0;       // manifests read
};

}  // namespace gpusnap
