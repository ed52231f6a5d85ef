// Where a snapshot lives in an OCI registry: `host[:port]/repository[:tag]`
// or `host[:port]/repository@sha256:<64 hex>` (both at once is allowed, as
// docker allows it; the digest wins). The host is always named: gpusnap has
// no default registry to guess.
//
// Pure syntax, in the store's layer so that every layer that names snapshots
// (the registry client, the restore, the agent, the webhook) can tell a
// reference from a snapshot id and check it without reaching a registry.
#pragma once

#include <string>
#include <string_view>

#include "gpusnap/status.h"

namespace gpusnap {

struct RegistryReference {
  std::string host;        // "registry.example:5000", "127.0.0.1:5000", "[::1]:5000"
  std::string repository;  // "team/models/llama"
  std::string tag;         // "v1"; "latest" when neither tag nor digest is given
  std::string digest;      // "sha256:...", or empty

  // The manifest's name in the registry's API: the digest if any, else the tag.
  const std::string& ManifestName() const { return digest.empty() ? tag : digest; }
  std::string ToString() const;
  bool operator==(const RegistryReference&) const = default;
};

// Pure. kInvalidArgument naming what is wrong: no host, a repository with
// upper case, `..`, an empty component or other characters the distribution
// spec forbids, a tag or digest of the wrong form.
Result<RegistryReference> ParseRegistryReference(std::string_view text);

// Pure. Whether `text` is meant as a reference rather than a snapshot id:
// snapshot ids never hold a `/`.
bool LooksLikeRegistryReference(std::string_view text);

}  // namespace gpusnap
