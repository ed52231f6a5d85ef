// What names the snapshot a restore starts from, wherever the request enters
// (a CLI argument, the agent's `snapshot` field, a pod's
// gpusnap.io/restore-from annotation): an id of the store, or a reference to a
// registry. One grammar, parsed once at that edge and carried typed after.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "gpusnap/status.h"
#include "store/registry_reference.h"

namespace gpusnap {

struct SnapshotRef {
  std::string id;                              // a snapshot of the store, or
  std::optional<RegistryReference> reference;  // one in a registry (pulled: what the store lacks)

  bool from_registry() const { return reference.has_value(); }
  // The id, or the reference as ToString writes it.
  std::string ToString() const { return reference ? reference->ToString() : id; }
  bool operator==(const SnapshotRef&) const = default;
};

// Pure. Text holding a `/` is a registry reference and must parse as one;
// other text is a snapshot id and must be a valid one (IsValidSnapshotId).
// kInvalidArgument "invalid snapshot id `TEXT` ..., nor a registry
// reference", with the reference's fault where the text holds a `/`.
Result<SnapshotRef> ParseSnapshotRef(std::string_view text);

}  // namespace gpusnap
