#include "cuda/gpu_map.h"

#include <fmt/format.h>

#include <charconv>

namespace gpusnap::cuda {

namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  return s;
}

Result<GpuRef> ParseRef(std::string_view side, std::string_view entry) {
  GpuRef ref;
  ref.text = std::string(side);
  if (side.starts_with("GPU-")) {
    auto uuid = ParseUuid(side);
    if (!uuid.ok()) return uuid.status().Wrap(fmt::format("--gpu-map entry `{}`", entry));
    ref.uuid = *uuid;
    return ref;
  }
  int index = -1;
  auto [end, ec] = std::from_chars(side.data(), side.data() + side.size(), index);
  if (side.empty() || ec != std::errc() || end != side.data() + side.size() || index < 0)
    return Status::Error(Code::kInvalidArgument,
                         "--gpu-map entry `{}`: `{}` is neither a GPU index nor a GPU UUID (GPU-…)", entry, side);
  ref.index = index;
  return ref;
}

// The position in `gpus` that `ref` names, or an error naming `role`.
Result<size_t> Find(const GpuRef& ref, std::span<const GpuInfo> gpus, const char* role) {
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (ref.index && gpus[i].index == *ref.index) return i;
    if (ref.uuid && gpus[i].uuid == *ref.uuid) return i;
  }
  return Status::Error(Code::kInvalidArgument, "--gpu-map: there is no {} GPU `{}` ({} GPUs: {})", role, ref.text,
                       role, gpus.empty() ? std::string("none") : fmt::format("0-{}", gpus.size() - 1));
}

}  // namespace

Result<std::vector<GpuMapEntry>> ParseGpuMap(std::string_view text) {
  std::vector<GpuMapEntry> entries;
  std::string_view rest = text;
  for (;;) {
    size_t comma = rest.find(',');
    std::string_view entry = Trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    size_t eq = entry.find('=');
    if (eq == std::string_view::npos)
      return Status::Error(Code::kInvalidArgument, "--gpu-map entry `{}`: expected FROM=TO (an index or a GPU UUID each)",
                           entry);
    GPUSNAP_ASSIGN_OR_RETURN(GpuRef from, ParseRef(Trim(entry.substr(0, eq)), entry));
    GPUSNAP_ASSIGN_OR_RETURN(GpuRef to, ParseRef(Trim(entry.substr(eq + 1)), entry));
    for (const auto& e : entries)
      if (e.from.text == from.text)
        return Status::Error(Code::kInvalidArgument, "--gpu-map: GPU `{}` is mapped twice", from.text);
    entries.push_back({std::move(from), std::move(to)});
    if (comma == std::string_view::npos) return entries;
  }
}

std::string GpuMapSpec::ToString() const {
  std::string out;
  for (const auto& e : entries) out += fmt::format("{}{}={}", out.empty() ? "" : ",", e.from.text, e.to.text);
  for (int g : gpus) out += fmt::format("{}{}", out.empty() ? "" : ",", g);
  return out;
}

Result<GpuMapSpec> MakeGpuMapSpec(std::string_view map_text, std::vector<int> gpus) {
  if (!map_text.empty() && !gpus.empty())
    return Status::Error(Code::kInvalidArgument, "give --gpu-map or --gpus, not both");
  GpuMapSpec spec;
  if (!map_text.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(spec.entries, ParseGpuMap(map_text));
  }
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i] < 0) return Status::Error(Code::kInvalidArgument, "--gpus: `{}` is not a GPU index", gpus[i]);
    for (size_t j = 0; j < i; ++j)
      if (gpus[j] == gpus[i])
        return Status::Error(Code::kInvalidArgument, "--gpus: GPU {} is named twice", gpus[i]);
  }
  spec.gpus = std::move(gpus);
  return spec;
}

Result<GpuMap> TranslateGpuMap(std::span<const GpuMapEntry> entries, std::span<const GpuInfo> old_gpus,
                               std::span<const GpuInfo> new_gpus) {
  if (entries.empty()) return GpuMap{};
  // target[i]: the position in new_gpus that old_gpus[i] goes to.
  std::vector<std::optional<size_t>> target(old_gpus.size());
  std::vector<const GpuMapEntry*> named_by(old_gpus.size(), nullptr);
  for (const auto& e : entries) {
    GPUSNAP_ASSIGN_OR_RETURN(size_t from, Find(e.from, old_gpus, "checkpointed"));
    GPUSNAP_ASSIGN_OR_RETURN(size_t to, Find(e.to, new_gpus, "target"));
    if (named_by[from] != nullptr)
      return Status::Error(Code::kInvalidArgument, "--gpu-map: GPU {} is mapped twice (`{}` and `{}`)",
                           old_gpus[from].index, named_by[from]->from.text, e.from.text);
    named_by[from] = &e;
    target[from] = to;
  }
  for (size_t i = 0; i < old_gpus.size(); ++i) {
    if (target[i]) continue;
    for (size_t j = 0; j < new_gpus.size(); ++j)
      if (new_gpus[j].index == old_gpus[i].index) target[i] = j;
    if (!target[i])
      return Status::Error(Code::kInvalidArgument,
                           "--gpu-map: checkpointed GPU {} ({}) is not mapped and there is no target GPU {}; map it",
                           old_gpus[i].index, FormatUuid(old_gpus[i].uuid), old_gpus[i].index);
  }
  for (size_t i = 0; i < old_gpus.size(); ++i)
    for (size_t k = i + 1; k < old_gpus.size(); ++k)
      if (*target[i] == *target[k])
        return Status::Error(Code::kInvalidArgument,
                             "--gpu-map: target GPU {} would receive both GPU {} and GPU {} (a GPU not named keeps its "
                             "index; over the same GPUs the map must be a permutation, e.g. 0=1,1=0)",
                             new_gpus[*target[i]].index, old_gpus[i].index, old_gpus[k].index);
  GpuMap map;
  for (size_t i = 0; i < old_gpus.size(); ++i) map.push_back({old_gpus[i].uuid, new_gpus[*target[i]].uuid});
  return map;
}

std::string FormatGpuMap(const GpuMap& map) {
  std::string out;
  for (const auto& p : map) out += fmt::format("{}{}>{}", out.empty() ? "" : ",", FormatUuid(p.old_uuid), FormatUuid(p.new_uuid));
  return out;
}

std::optional<int> OrdinalAfterMap(const Uuid& checkpoint_uuid, const GpuMap& map, std::span<const GpuInfo> here) {
  if (checkpoint_uuid == Uuid{}) return std::nullopt;
  Uuid target = checkpoint_uuid;
  for (const GpuPair& p : map)
    if (p.old_uuid == checkpoint_uuid) target = p.new_uuid;
  for (const GpuInfo& g : here)
    if (g.uuid == target) return g.index;
  return std::nullopt;
}

}  // namespace gpusnap::cuda
