// --gpu-map: which GPU a checkpointed process is restored onto.
//
// Text form: comma-separated `FROM=TO` entries, each side a device index ("0")
// or a UUID ("GPU-8f1c…"), mixed freely: "0=1,1=0", "GPU-aaaa…=GPU-bbbb…,1=0".
// FROM names a GPU the process was checkpointed on, TO the GPU to restore it
// onto. Pure; thread-safe.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/gpus.h"
#include "gpusnap/status.h"

namespace gpusnap::cuda {

// One side of an entry, as written: exactly one of index and uuid is set.
struct GpuRef {
  std::optional<int> index;
  std::optional<Uuid> uuid;
  std::string text;  // as the user wrote it, for messages
};

struct GpuMapEntry {
  GpuRef from;
  GpuRef to;
};

// Errors (kInvalidArgument, quoting the entry): an entry without '=', a side
// that is neither a non-negative index nor a UUID, an empty map, or the same
// FROM text written twice.
Result<std::vector<GpuMapEntry>> ParseGpuMap(std::string_view text);

// Which GPUs a restore or a wake goes onto, as asked where the request
// entered (the CLI's --gpu-map or --gpus, the agent's `gpuMap` or `gpus`):
// parsed once there, then carried as it is. Empty: every GPU onto the GPU of
// its index here.
struct GpuMapSpec {
  std::vector<GpuMapEntry> entries;  // --gpu-map FROM=TO,...
  std::vector<int> gpus;             // or --gpus: the snapshot's GPUs, in order, onto these indices

  bool empty() const { return entries.empty() && gpus.empty(); }
  // As it was written: "0=1,GPU-…=0" or "1,0" (--gpus), for messages.
  std::string ToString() const;
};

// Pure. `map_text` empty: no --gpu-map. kInvalidArgument: both given, a map
// ParseGpuMap refuses, a negative index or an index named twice in `gpus`.
Result<GpuMapSpec> MakeGpuMapSpec(std::string_view map_text, std::vector<int> gpus);

// What cuCheckpointProcessRestore is given: old UUID -> new UUID.
struct GpuPair {
  Uuid old_uuid{};
  Uuid new_uuid{};
  bool operator==(const GpuPair&) const = default;
};
using GpuMap = std::vector<GpuPair>;

// Resolves `entries` against the GPUs the process was checkpointed on
// (`old_gpus`) and those of this machine (`new_gpus`; the same list when
// restoring in place) into one pair per old GPU, in old_gpus order: the
// driver requires every checkpointed GPU to appear. A GPU no entry names keeps
// its index (new_gpus[old.index]). An empty `entries` gives an empty map (no
// remapping).
// Errors (kInvalidArgument): an index or UUID that is not in its list, an old
// GPU named twice (by index and by UUID counts), an old GPU left unmapped with
// no new GPU of its index, and two old GPUs sent to one new GPU (over the same
// GPUs, the map must be a permutation).
Result<GpuMap> TranslateGpuMap(std::span<const GpuMapEntry> entries, std::span<const GpuInfo> old_gpus,
                               std::span<const GpuInfo> new_gpus);

// "GPU-aaaa…>GPU-bbbb…,GPU-…>GPU-…", for logs and messages.
std::string FormatGpuMap(const GpuMap& map);

// The device ordinal, among `here`, of the GPU that the GPU checkpointed as
// `checkpoint_uuid` is restored onto under `map` (itself when the map does
// not name it); nullopt for the zero UUID (not recorded) or a GPU not here.
std::optional<int> OrdinalAfterMap(const Uuid& checkpoint_uuid, const GpuMap& map, std::span<const GpuInfo> here);

}  // namespace gpusnap::cuda
