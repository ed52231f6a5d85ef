#include "gpushare/shim/vmm_table.h"

#include <algorithm>

namespace gpusnap::gpushare::shim {

uint64_t VmmTable::AddObject(VmmObject o) {
  o.id = (kIdTag << 48) | next_++;
  uint64_t id = o.id;
  objects_[id] = o;
  return id;
}

VmmObject* VmmTable::Find(uint64_t id) {
  auto it = objects_.find(id);
  return it == objects_.end() ? nullptr : &it->second;
}

void VmmTable::RemoveObject(uint64_t id) { objects_.erase(id); }

std::vector<VmmObject*> VmmTable::Objects() {
  std::vector<VmmObject*> out;
  for (auto& [_, o] : objects_) out.push_back(&o);
  return out;
}

bool VmmTable::AddMapping(const VmmMapping& m) {
  if (m.size == 0 || objects_.count(m.object) == 0) return false;
  auto next = mappings_.lower_bound(m.va);
  if (next != mappings_.end() && next->first < m.va + m.size) return false;
  if (next != mappings_.begin() && std::prev(next)->first + std::prev(next)->second.size > m.va) return false;
  mappings_[m.va] = m;
  return true;
}

std::optional<std::vector<VmmMapping>> VmmTable::MappingsIn(uint64_t va, uint64_t size) const {
  std::vector<VmmMapping> out;
  auto it = mappings_.upper_bound(va);
  if (it != mappings_.begin() && std::prev(it)->first + std::prev(it)->second.size > va) --it;
  for (; it != mappings_.end() && it->first < va + size; ++it) {
    if (it->first < va || it->first + it->second.size > va + size) return std::nullopt;
    out.push_back(it->second);
  }
  if (out.empty()) return std::nullopt;
  return out;
}

void VmmTable::RemoveMapping(uint64_t va) { mappings_.erase(va); }

std::optional<VmmMapping> VmmTable::MappingContaining(uint64_t addr) const {
  auto it = mappings_.upper_bound(addr);
  if (it == mappings_.begin()) return std::nullopt;
  --it;
  if (addr >= it->first + it->second.size) return std::nullopt;
  return it->second;
}

std::vector<VmmMapping> VmmTable::MappingsOf(uint64_t object) const {
  std::vector<VmmMapping> out;
  for (const auto& [_, m] : mappings_)
    if (m.object == object) out.push_back(m);
  return out;
}

std::optional<VmmMapping> VmmTable::WholeMappingOf(uint64_t object) const {
  auto o = objects_.find(object);
  if (o == objects_.end()) return std::nullopt;
  for (const auto& [_, m] : mappings_)
    if (m.object == object && m.offset == 0 && m.size == o->second.size) return m;
  return std::nullopt;
}

bool VmmTable::SetAccess(uint64_t va, uint64_t size, const std::vector<AccessGrant>& grants) {
  auto in = MappingsIn(va, size);
  if (!in) return false;
  for (const VmmMapping& m : *in) mappings_[m.va].access = grants;
  return true;
}

bool VmmTable::Unused(uint64_t id) const {
  auto o = objects_.find(id);
  if (o == objects_.end()) return true;
  if (o->second.app_refs > 0) return false;
  return std::none_of(mappings_.begin(), mappings_.end(), [&](const auto& kv) { return kv.second.object == id; });
}

}  // namespace gpusnap::gpushare::shim
