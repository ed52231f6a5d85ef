#include "gpushare/shim/stored_chunks.h"

namespace gpusnap::gpushare::shim {
namespace {

const ChunkFingerprint* FingerprintOf(const ChunkJob& job, const RangeFingerprints& now) {
  if (job.range >= now.size() || !now[job.range] || job.index >= now[job.range]->size()) return nullptr;
  return &(*now[job.range])[job.index];
}

}  // namespace

std::vector<std::optional<chunks::ChunkRef>> PlanUnchangedChunks(
    const std::vector<ChunkJob>& jobs, const std::vector<DeviceRange>& ranges, const RangeFingerprints& now,
    const StoredChunks& stored, const std::function<bool(const chunks::ChunkRef&)>& held) {
  std::vector<std::optional<chunks::ChunkRef>> plan(jobs.size());
  for (size_t j = 0; j < jobs.size(); ++j) {
    const ChunkJob& job = jobs[j];
    const ChunkFingerprint* f = FingerprintOf(job, now);
    if (f == nullptr) continue;
    auto it = stored.find({ranges[job.range].va, ranges[job.range].size, job.index});
    if (it == stored.end() || it->second.fingerprint != *f || it->second.ref.length != job.length ||
        it->second.ref.scratch || !held(it->second.ref))
      continue;
    plan[j] = it->second.ref;
  }
  return plan;
}

StoredChunks RecordStoredChunks(const std::vector<ChunkJob>& jobs, const std::vector<DeviceRange>& ranges,
                                const RangeFingerprints& now, const std::vector<chunks::ChunkRef>& refs) {
  StoredChunks out;
  for (size_t j = 0; j < jobs.size() && j < refs.size(); ++j) {
    const ChunkFingerprint* f = FingerprintOf(jobs[j], now);
    if (f == nullptr || refs[j].scratch) continue;
    out[{ranges[jobs[j].range].va, ranges[jobs[j].range].size, jobs[j].index}] = {*f, refs[j]};
  }
  return out;
}

StoredChunks ForgetOthers(const StoredChunks& stored, const chunks::ChunkManifest& manifest) {
  StoredChunks out = stored;
  for (const chunks::ChunkedAllocation& a : manifest.allocations) {
    for (size_t k = 0; k < a.chunks.size(); ++k) {
      auto it = out.find({a.va, a.size, k});
      if (it != out.end() && it->second.ref != a.chunks[k]) out.erase(it);
    }
  }
  return out;
}

}  // namespace gpusnap::gpushare::shim
