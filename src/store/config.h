// The settings of a store: <store>/config.json, a small JSON object that the
// store's operator writes (gpusnap only reads it). Every member is optional,
// and a store without the file has every default:
//
//   {"chunk_cache_bytes": 21474836480}      or, the same, {"chunk_cache_bytes": "20G"}
//
//   chunk_cache_bytes  how many bytes of gpushare chunks that no snapshot
//                      names a collection keeps, the most recently used
//                      (src/chunks/chunk_gc.h); an integer >= 0 or
//                      a size as util/byte_size.h reads it. Default 0: every
//                      such chunk goes. `gpusnap gc --keep-unused` overrides it.
//
// An unknown member, a member given twice or a value of the wrong type is
// refused, not ignored: a misspelt limit must not silently become 0 and empty
// the cache.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gpusnap/status.h"

namespace gpusnap {

inline constexpr const char* kStoreConfigFile = "config.json";

struct StoreConfig {
  std::optional<uint64_t> chunk_cache_bytes;  // unset: not in the file
};

// <store_root>/config.json
std::string StoreConfigPath(const std::string& store_root);

// Pure: the settings `text` holds. kInvalidArgument naming the member at
// fault (and quoting its value), or the JSON syntax error's byte offset.
Result<StoreConfig> StoreConfigFromJson(std::string_view text);

// The settings of the store at `store_root`: all defaults when the file does
// not exist. Errors: StoreConfigFromJson's, and the errno's code when the file
// cannot be read, each naming the file.
Result<StoreConfig> ReadStoreConfig(const std::string& store_root);

}  // namespace gpusnap
