#include "store/snapshot_ref.h"

#include "gpusnap/snapshot.h"

namespace gpusnap {

Result<SnapshotRef> ParseSnapshotRef(std::string_view text) {
  SnapshotRef source;
  if (LooksLikeRegistryReference(text)) {
    auto reference = ParseRegistryReference(text);
    if (!reference.ok())
      return Status::Error(Code::kInvalidArgument, "invalid snapshot id `{}` (an id holds no `/`), nor a registry "
                           "reference: {}", text, reference.status().message());
    source.reference = std::move(reference).value();
    return source;
  }
  if (!IsValidSnapshotId(text))
    return Status::Error(Code::kInvalidArgument, "invalid snapshot id `{}` (1-64 of [A-Za-z0-9._-], not starting "
                         "with `.`), nor a registry reference host[:port]/repository[:tag|@digest]", text);
  source.id = std::string(text);
  return source;
}

}  // namespace gpusnap
