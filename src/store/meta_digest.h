// The digest gpusnap.json carries of itself (`meta_sha256`, schema 1.5):
// SHA-256 of the metadata's canonical form, which leaves that member out
// (docs/snapshot-format.md):
//   - no whitespace; object members sorted by key (bytes of the UTF-8);
//   - strings (keys too) escaped only where JSON must: \" \\ \b \f \n \r \t,
//     other control characters as \u00xx (lower-case hex), the rest as UTF-8;
//   - integers in decimal; every other number exactly as the file writes it,
//     so that the digest does not hang on how a library prints a double.
// The form is the same whether the file is indented (as gpusnap writes it) or
// compact (as the agent passes it on), and survives any re-indentation.
#pragma once

#include <string>
#include <string_view>

#include "gpusnap/status.h"

namespace gpusnap {

inline constexpr const char* kMetaDigestField = "meta_sha256";

// Pure. The canonical form of the JSON object `json`, without its top-level
// `meta_sha256`. kCorruption for a syntax error or a key twice in one object.
Result<std::string> CanonicalMeta(std::string_view json);

// SHA-256 (lower-case hex) of CanonicalMeta(json).
Result<std::string> MetaDigest(std::string_view json);

}  // namespace gpusnap
