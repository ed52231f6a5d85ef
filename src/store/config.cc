#include "store/config.h"

#include <nlohmann/json.hpp>
#include <set>

#include "util/byte_size.h"
#include "util/files.h"

namespace gpusnap {

using nlohmann::json;

namespace {

constexpr const char* kChunkCacheBytes = "chunk_cache_bytes";

std::string Quote(const json& v) {
  std::string s = v.dump();
  return s.size() > 60 ? s.substr(0, 57) + "..." : s;
}

Result<uint64_t> ByteCount(const json& v, const char* key) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_string()) {
    auto parsed = ParseByteSize(v.get_ref<const std::string&>());
    if (parsed.ok()) return parsed;
  }
  return Status::Error(Code::kInvalidArgument,
                       "member `{}` is {}, not a byte count (an integer >= 0, or a size such as \"20G\")", key,
                       Quote(v));
}

}  // namespace

std::string StoreConfigPath(const std::string& store_root) { return store_root + "/" + kStoreConfigFile; }

Result<StoreConfig> StoreConfigFromJson(std::string_view text) {
  // A plain parse takes the last of a key given twice; the callback sees each.
  std::set<std::string> seen;
  std::string twice;
  auto note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second &&
        twice.empty())
      twice = parsed.get<std::string>();
    return true;
  };
  json j;
  try {
    j = json::parse(text, note_keys);
  } catch (const json::parse_error& e) {
    std::string why = e.what();
    if (auto pos = why.find("] "); pos != std::string::npos) why = why.substr(pos + 2);
    return Status::Error(Code::kInvalidArgument, "a JSON syntax error at byte {}: {}", e.byte, why);
  }
  if (!j.is_object()) return Status::Error(Code::kInvalidArgument, "{}, not a JSON object", j.type_name());
  if (!twice.empty()) return Status::Error(Code::kInvalidArgument, "member `{}` is given twice", twice);
  StoreConfig config;
  for (const auto& [key, value] : j.items()) {
    if (key == kChunkCacheBytes) {
      GPUSNAP_ASSIGN_OR_RETURN(config.chunk_cache_bytes, ByteCount(value, kChunkCacheBytes));
    } else {
      return Status::Error(Code::kInvalidArgument, "unknown member `{}` (this gpusnap knows `{}`)", key,
                           kChunkCacheBytes);
    }
  }
  return config;
}

Result<StoreConfig> ReadStoreConfig(const std::string& store_root) {
  std::string path = StoreConfigPath(store_root);
  auto text = ReadFile(path);
  if (!text.ok() && text.status().sys_errno() == ENOENT) return StoreConfig{};
  if (!text.ok()) return text.status();
  auto config = StoreConfigFromJson(*text);
  if (!config.ok()) return config.status().Wrap(fmt::format("store settings `{}`", path));
  return config;
}

}  // namespace gpusnap
