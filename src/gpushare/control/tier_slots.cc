#include "gpushare/control/tier_slots.h"

#include <algorithm>

namespace gpusnap::gpushare::control {

TierSlots::TierSlots(size_t capacity) : capacity_(capacity) {
  // Lowest first: a tier that never fills pins only the slots it uses.
  for (size_t s = capacity; s > 0; --s) free_.push_back(s - 1);
}

TierSlots::Placement TierSlots::Place(const chunks::ChunkDigest& digest) {
  if (auto it = entries_.find(digest); it != entries_.end()) {
    if (!it->second.whole) return {Placed::kBusy, 0, std::nullopt};
    ++it->second.holds;
    it->second.last_use = ++clock_;
    return {Placed::kHeld, it->second.slot, std::nullopt};
  }
  Placement out{Placed::kFill, 0, std::nullopt};
  if (!free_.empty()) {
    out.slot = free_.back();
    free_.pop_back();
  } else {
    auto victim = entries_.end();
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (it->second.holds == 0 && it->second.whole &&
          (victim == entries_.end() || it->second.last_use < victim->second.last_use))
        victim = it;
    if (victim == entries_.end()) return {Placed::kFull, 0, std::nullopt};
    out.slot = victim->second.slot;
    out.evicted = victim->first;
    entries_.erase(victim);
    ++evictions_;
  }
  entries_[digest] = Entry{out.slot, ++clock_, 1, false};
  return out;
}

void TierSlots::Filled(const chunks::ChunkDigest& digest) {
  if (auto it = entries_.find(digest); it != entries_.end()) it->second.whole = true;
}

void TierSlots::Abandon(const chunks::ChunkDigest& digest) {
  auto it = entries_.find(digest);
  if (it == entries_.end() || it->second.whole) return;
  free_.push_back(it->second.slot);
  entries_.erase(it);
}

std::optional<size_t> TierSlots::Hold(const chunks::ChunkDigest& digest) {
  auto it = entries_.find(digest);
  if (it == entries_.end() || !it->second.whole) return std::nullopt;
  ++it->second.holds;
  it->second.last_use = ++clock_;
  return it->second.slot;
}

void TierSlots::Release(const chunks::ChunkDigest& digest) {
  if (auto it = entries_.find(digest); it != entries_.end() && it->second.holds > 0) --it->second.holds;
}

size_t TierSlots::whole() const {
  return static_cast<size_t>(
      std::count_if(entries_.begin(), entries_.end(), [](const auto& e) { return e.second.whole; }));
}

bool TierSlots::Contains(const chunks::ChunkDigest& digest) const {
  auto it = entries_.find(digest);
  return it != entries_.end() && it->second.whole;
}

}  // namespace gpusnap::gpushare::control
