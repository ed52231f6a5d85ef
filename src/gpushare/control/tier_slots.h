// Which chunks the pinned tier (pinned_tier.h) keeps, in which of its slots:
// the bookkeeping alone, pure, so that its rules are tested without a driver.
//
// A tier has a fixed number of slots of one chunk each. Chunks are named by
// their digest, so a chunk two snapshots share takes one slot. A chunk is
// held while something uses its slot: the admission filling it, a fill
// copying from it. A held chunk is never evicted; an idle one is, least
// recently used first, when a new chunk needs its slot. The slot of a chunk
// being filled is not read until the fill says it is whole.
//
// Thread-safety: none; PinnedTier guards it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "chunks/chunk_store.h"

namespace gpusnap::gpushare::control {

class TierSlots {
 public:
  explicit TierSlots(size_t capacity);

  enum class Placed {
    kHeld,  // present and whole: now held by the caller
    kBusy,  // another admission is filling it: not held
    kFill,  // a slot to fill it into, held by the caller (an idle chunk evicted if needed)
    kFull,  // every slot is held: not placed
  };
  struct Placement {
    Placed placed = Placed::kFull;
    size_t slot = 0;                              // kHeld, kFill
    std::optional<chunks::ChunkDigest> evicted;   // kFill: the chunk whose slot it took
  };
  // Where `digest` goes, for an admission. The caller says Filled or
  // Abandon of a kFill placement; it Releases a kHeld one, and a Filled one,
  // once done (an abandoned chunk is gone, and its hold with it).
  Placement Place(const chunks::ChunkDigest& digest);
  // The chunk placed kFill is whole: fills may read it.
  void Filled(const chunks::ChunkDigest& digest);
  // The chunk placed kFill could not be filled: its slot is free again.
  void Abandon(const chunks::ChunkDigest& digest);

  // For a fill: the slot of `digest` when it is present and whole, now held
  // (and used now); nullopt otherwise.
  std::optional<size_t> Hold(const chunks::ChunkDigest& digest);
  // One hold of `digest` ends.
  void Release(const chunks::ChunkDigest& digest);

  size_t capacity() const { return capacity_; }
  size_t used() const { return entries_.size(); }  // slots taken, whole or being filled
  size_t whole() const;  // chunks fills may read
  uint64_t evictions() const { return evictions_; }
  bool Contains(const chunks::ChunkDigest& digest) const;

 private:
  struct Entry {
    size_t slot = 0;
    uint64_t last_use = 0;
    int holds = 0;
    bool whole = false;
  };
  size_t capacity_;
  std::map<chunks::ChunkDigest, Entry> entries_;
  std::vector<size_t> free_;  // slots never used or given back, lowest last
  uint64_t clock_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace gpusnap::gpushare::control
