#include "gpushare/shim/allocation_registry.h"

#include <algorithm>
#include <cerrno>

namespace gpusnap::gpushare::shim {

bool AllocationRegistry::Add(const TrackedAllocation& a) {
  if (a.size == 0 || a.va + a.size < a.va) return false;
  auto next = by_va_.lower_bound(a.va);
  if (next != by_va_.end() && next->first < a.va + a.size) return false;
  if (next != by_va_.begin()) {
    auto prev = std::prev(next);
    if (prev->second.va + prev->second.size > a.va) return false;
  }
  by_va_.emplace(a.va, a);
  return true;
}

std::optional<TrackedAllocation> AllocationRegistry::FindStart(uint64_t va) const {
  auto it = by_va_.find(va);
  if (it == by_va_.end()) return std::nullopt;
  return it->second;
}

std::optional<TrackedAllocation> AllocationRegistry::FindContaining(uint64_t addr) const {
  auto it = by_va_.upper_bound(addr);
  if (it == by_va_.begin()) return std::nullopt;
  --it;
  if (addr - it->second.va >= it->second.size) return std::nullopt;
  return it->second;
}

bool AllocationRegistry::Remove(uint64_t va) {
  scratch_.erase(va);
  return by_va_.erase(va) == 1;
}

bool AllocationRegistry::Update(const TrackedAllocation& a) {
  auto it = by_va_.find(a.va);
  if (it == by_va_.end() || it->second.size != a.size) return false;
  it->second = a;
  return true;
}

std::vector<TrackedAllocation> AllocationRegistry::All() const {
  std::vector<TrackedAllocation> out;
  out.reserve(by_va_.size());
  for (const auto& [va, a] : by_va_) out.push_back(a);
  return out;
}

std::vector<uint64_t> AllocationRegistry::Contexts() const {
  std::vector<uint64_t> out;
  for (const auto& [va, a] : by_va_) {
    if (std::find(out.begin(), out.end(), a.context) == out.end()) out.push_back(a.context);
  }
  return out;
}

RegistryTotals AllocationRegistry::Totals() const {
  RegistryTotals t;
  for (const auto& [va, a] : by_va_) {
    ++t.allocations;
    t.bytes += a.size;
    if (a.released) t.released_bytes += a.size;
  }
  for (const auto& [va, ranges] : scratch_)
    for (const auto& [start, end] : ranges) t.scratch_bytes += end - start;
  return t;
}

int AllocationRegistry::Pieces(uint64_t ptr, uint64_t bytes, std::vector<std::pair<uint64_t, uint64_t>>* out) const {
  if (bytes == 0 || ptr + bytes < ptr) return EINVAL;
  uint64_t end = ptr + bytes;
  for (uint64_t at = ptr; at < end;) {
    std::optional<TrackedAllocation> a = FindContaining(at);
    if (!a) return ENOENT;
    uint64_t a_end = a->va + a->size;
    uint64_t piece_end = std::min(end, a_end);
    uint64_t asked = a->requested == 0 ? a->size : std::min(a->requested, a->size);
    if (piece_end >= a->va + asked) piece_end = a_end;
    out->emplace_back(at, piece_end);
    at = a_end;
  }
  return 0;
}

int AllocationRegistry::MarkScratch(uint64_t ptr, uint64_t bytes) {
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  if (int err = Pieces(ptr, bytes, &pieces); err != 0) return err;
  for (auto [start, end] : pieces) {
    std::map<uint64_t, uint64_t>& ranges = scratch_[FindContaining(start)->va];
    // Swallow every range that overlaps or touches [start, end).
    auto it = ranges.upper_bound(start);
    if (it != ranges.begin() && std::prev(it)->second >= start) --it;
    while (it != ranges.end() && it->first <= end) {
      start = std::min(start, it->first);
      end = std::max(end, it->second);
      it = ranges.erase(it);
    }
    ranges.emplace(start, end);
  }
  return 0;
}

int AllocationRegistry::UnmarkScratch(uint64_t ptr, uint64_t bytes) {
  std::vector<std::pair<uint64_t, uint64_t>> pieces;
  if (int err = Pieces(ptr, bytes, &pieces); err != 0) return err;
  for (auto [start, end] : pieces) {
    auto found = scratch_.find(FindContaining(start)->va);
    if (found == scratch_.end()) continue;
    std::map<uint64_t, uint64_t>& ranges = found->second;
    auto it = ranges.upper_bound(start);
    if (it != ranges.begin() && std::prev(it)->second > start) --it;
    std::vector<std::pair<uint64_t, uint64_t>> kept;  // what is left of the ranges cut
    while (it != ranges.end() && it->first < end) {
      if (it->first < start) kept.emplace_back(it->first, start);
      if (it->second > end) kept.emplace_back(end, it->second);
      it = ranges.erase(it);
    }
    for (auto [s, e] : kept) ranges.emplace(s, e);
    if (ranges.empty()) scratch_.erase(found);
  }
  return 0;
}

std::vector<bool> AllocationRegistry::ScratchChunks(uint64_t va, uint64_t chunk_bytes) const {
  auto a = by_va_.find(va);
  if (a == by_va_.end() || chunk_bytes == 0) return {};
  const uint64_t size = a->second.size;
  std::vector<bool> out((size + chunk_bytes - 1) / chunk_bytes, false);
  auto marks = scratch_.find(va);
  if (marks == scratch_.end()) return out;
  for (size_t i = 0; i < out.size(); ++i) {
    uint64_t start = va + i * chunk_bytes;
    uint64_t end = va + std::min(size, (i + 1) * chunk_bytes);
    // Touching ranges are merged, so a chunk wholly marked lies in one range.
    auto it = marks->second.upper_bound(start);
    if (it == marks->second.begin()) continue;
    --it;
    out[i] = it->first <= start && it->second >= end;
  }
  return out;
}

std::vector<std::pair<uint64_t, uint64_t>> AllocationRegistry::ScratchRanges(uint64_t va) const {
  auto marks = scratch_.find(va);
  if (marks == scratch_.end()) return {};
  return {marks->second.begin(), marks->second.end()};
}

uint64_t RoundUpToGranularity(uint64_t bytes, uint64_t granularity) {
  return (bytes + granularity - 1) & ~(granularity - 1);
}

}  // namespace gpusnap::gpushare::shim
