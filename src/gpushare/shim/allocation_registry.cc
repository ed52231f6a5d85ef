#include "gpushare/shim/allocation_registry.h"

#include <algorithm>

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

bool AllocationRegistry::Remove(uint64_t va) { return by_va_.erase(va) == 1; }

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
  return t;
}

uint64_t RoundUpToGranularity(uint64_t bytes, uint64_t granularity) {
  return (bytes + granularity - 1) & ~(granularity - 1);
}

}  // namespace gpusnap::gpushare::shim
