// The pinned chunk tier (docs/GPUSHARE.md, "The pinned tier"): gpushare
// chunks kept in page-locked host memory by a long-lived process (the
// agent), so that a wake or a restore it runs fills device memory straight
// from them with the copy engines instead of reading the chunk files.
//
// The tier is a fixed number of 64 MiB slots (its capacity over
// chunks::kChunkBytes), each pinned (cuMemHostAlloc, portable: any context
// copies from it) the first time it is used and kept until the tier goes:
// pinning is slow, a slot is pinned once and refilled as chunks come and go.
// Which chunk sits in which slot, what is held and what goes first is
// TierSlots' (tier_slots.h): content-addressed, least recently used first,
// never a chunk a fill is copying from.
//
// A chunk's bytes are checked against its digest as they enter (read through
// chunks::ChunkReader); a fill copies from a slot without checking again, as
// the bytes in pinned memory do not change until the slot is refilled, which
// a hold prevents.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chunks/chunk_store.h"
#include "cuda/gpu_session.h"
#include "gpushare/common/driver_table.h"
#include "gpushare/control/tier_slots.h"
#include "gpusnap/status.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::gpushare::control {

// What the tier holds and has done, for the agent's metrics.
struct PinnedTierGauges {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // slots taken: whole chunks and those being filled
  uint64_t chunks = 0;      // whole chunks
  uint64_t hits = 0;        // chunks fills found here (since the tier was made)
  uint64_t misses = 0;      // chunks fills read from the chunk store instead
  uint64_t evictions = 0;
  uint64_t admissions_pending = 0;  // AdmitLater's batches queued or under way
};

// What one admission did.
struct AdmitStats {
  uint64_t admitted = 0;  // chunks read in now
  uint64_t present = 0;   // chunks there already (or being read in by another admission)
  uint64_t left_out = 0;  // chunks for which no slot was free of holds
  uint64_t bytes = 0;     // bytes read in now
};

class PinnedTier : public std::enable_shared_from_this<PinnedTier> {
 public:
  // A tier of `capacity_bytes` rounded down to whole chunks; pins nothing
  // yet. Its pinned memory is allocated in GPU 0's primary context of
  // `session`. kNotSupported for a driver without the copy entry points.
  static Result<std::shared_ptr<PinnedTier>> Make(std::shared_ptr<cuda::GpuSession> session,
                                                  uint64_t capacity_bytes);
  PinnedTier(const PinnedTier&) = delete;
  PinnedTier& operator=(const PinnedTier&) = delete;
  // Waits for the background admissions, frees the pinned slots.
  ~PinnedTier() EXCLUDES(mu_);

  // Reads the stored chunks among `refs` (zero chunks are not stored, nor
  // kept) into the tier, in order, evicting idle chunks least recently used
  // first, until every slot is held; those for which no slot is free are
  // left out (a snapshot larger than the tier keeps its first chunks).
  // `progress(bytes_in_tier, bytes_total)` after each chunk found or read in. Errors: a chunk
  // missing or corrupt in the store (the chunks read before it stay), the
  // driver's pinning (kExternal).
  using AdmitProgress = std::function<void(uint64_t done, uint64_t total)>;
  Result<AdmitStats> Admit(const chunks::ChunkStore& store, const std::vector<chunks::ChunkRef>& refs,
                           const AdmitProgress& progress = {}) EXCLUDES(mu_);
  // Admit on the tier's own thread, in the order asked: the chunks a fill
  // just read from the store, kept as recently used without delaying it or
  // the next: they wait while any AdmissionHold lives, before each chunk.
  // Failures are dropped (the chunks stay in the store).
  void AdmitLater(std::string chunk_store, std::vector<chunks::ChunkRef> refs) EXCLUDES(mu_);

  // While one of these lives, AdmitLater's admissions wait: pinning slots
  // (cuMemHostAlloc) and reading chunks in competes with a preload's making
  // of device memory, its fill and the workload's load after it (measured on
  // an H200: a wake's load took 3.3 s with admissions beside it, 0.15 s
  // without), so a preload holds one from its start until the workload has
  // what it adopted. Admit (warm, a standby) does not wait.
  using AdmissionHold = std::shared_ptr<void>;
  AdmissionHold HoldAdmissions() EXCLUDES(mu_);

  // A fill's hold on the chunks it finds in the tier, for as long as the
  // Lease lives; what it did not find, it names for AdmitLater.
  class Lease {
   public:
    Lease(Lease&&) = default;
    ~Lease();
    // Where the bytes of `ref` lie pinned, or nullptr (a zero chunk, or one
    // not here). Thread-safe.
    const void* Find(const chunks::ChunkRef& ref) const;
    uint64_t hits() const { return hits_; }
    const std::vector<chunks::ChunkRef>& missed() const { return missed_; }

   private:
    friend class PinnedTier;
    Lease() = default;
    std::shared_ptr<PinnedTier> tier_;
    std::map<chunks::ChunkDigest, const void*> found_;
    std::vector<chunks::ChunkRef> missed_;
    uint64_t hits_ = 0;
  };
  // Holds every stored chunk of `refs` that is here, counting hits and misses.
  Lease Borrow(const std::vector<chunks::ChunkRef>& refs) EXCLUDES(mu_);

  PinnedTierGauges gauges() const EXCLUDES(mu_);

 private:
  PinnedTier(std::shared_ptr<cuda::GpuSession> session, RealDriver d, abi::CUcontext context, size_t slots);
  // The pinned memory of `slot`, allocated the first time.
  Result<void*> SlotMemory(size_t slot) EXCLUDES(mu_);
  void Return(const std::map<chunks::ChunkDigest, const void*>& held) EXCLUDES(mu_);
  void AdmitLoop() EXCLUDES(mu_);
  enum class Yield { kNever, kToHolds };
  Result<AdmitStats> Admit(const chunks::ChunkStore& store, const std::vector<chunks::ChunkRef>& refs,
                           const AdmitProgress& progress, Yield yield) EXCLUDES(mu_);

  std::shared_ptr<cuda::GpuSession> session_;
  RealDriver d_;
  abi::CUcontext context_ = nullptr;
  mutable Mutex mu_;
  TierSlots slots_ GUARDED_BY(mu_);
  std::vector<void*> memory_ GUARDED_BY(mu_);  // by slot; nullptr: not pinned yet
  uint64_t hits_ GUARDED_BY(mu_) = 0;
  uint64_t misses_ GUARDED_BY(mu_) = 0;
  std::deque<std::pair<std::string, std::vector<chunks::ChunkRef>>> queue_ GUARDED_BY(mu_);
  size_t admissions_pending_ GUARDED_BY(mu_) = 0;  // queue_ and the batch under way
  bool stopping_ GUARDED_BY(mu_) = false;
  size_t admission_holds_ GUARDED_BY(mu_) = 0;
  std::condition_variable changed_;
  std::thread admitter_;  // started by the first AdmitLater
};

// The stored chunks the preload fills (the shims' allocations) of the
// processes `ns_pids` whose manifests are in `gpu_dir`, in manifest order,
// each digest once. Errors: the manifests' (kIoError, kCorruption).
Result<std::vector<chunks::ChunkRef>> PreloadedChunks(const std::string& gpu_dir, const std::vector<int>& ns_pids);
// The same for manifests each in a directory of its own: (directory, ns pid).
Result<std::vector<chunks::ChunkRef>> PreloadedChunks(const std::vector<std::pair<std::string, int>>& manifests);

}  // namespace gpusnap::gpushare::control
