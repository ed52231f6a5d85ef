#include "gpushare/control/pinned_tier.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <set>

#include "gpushare/control/tree.h"
#include "util/first_failure.h"

namespace gpusnap::gpushare::control {
namespace {

// Admissions read chunks from the page cache (or the disk) on a few threads:
// one thread reads and hashes well below what the memory allows.
constexpr unsigned kAdmitThreads = 4;

}  // namespace

Result<std::shared_ptr<PinnedTier>> PinnedTier::Make(std::shared_ptr<cuda::GpuSession> session,
                                                     uint64_t capacity_bytes) {
  const std::string& libcuda = session->driver()->path();
  // The library the session loaded: the same handle, cuInit done.
  void* lib = ::dlopen(libcuda.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (lib == nullptr) return Status::Error(Code::kNotFound, "pinned tier: loading `{}`: {}", libcuda, ::dlerror());
  RealDriver d = ResolveRealDriver(lib, &::dlsym);
  if (!d.missing.empty())
    return Status::Error(Code::kNotSupported, "pinned tier: the driver `{}` has no {}", libcuda, d.missing);
  GPUSNAP_ASSIGN_OR_RETURN(abi::CUcontext context, session->Context(0));
  return std::shared_ptr<PinnedTier>(
      new PinnedTier(std::move(session), std::move(d), context, capacity_bytes / chunks::kChunkBytes));
}

PinnedTier::PinnedTier(std::shared_ptr<cuda::GpuSession> session, RealDriver d, abi::CUcontext context, size_t slots)
    : session_(std::move(session)), d_(std::move(d)), context_(context), slots_(slots), memory_(slots, nullptr) {}

PinnedTier::~PinnedTier() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (admitter_.joinable()) admitter_.join();
  MutexLock lock(mu_);
  for (void* p : memory_)
    if (p != nullptr) d_.free_host(p);
}

Result<void*> PinnedTier::SlotMemory(size_t slot) {
  {
    MutexLock lock(mu_);
    if (memory_[slot] != nullptr) return memory_[slot];
  }
  // Pinned outside the lock: it takes milliseconds, and only the admission
  // that placed a chunk in the slot asks for it.
  GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.ctx_set_current(context_), "cuCtxSetCurrent");
  void* p = nullptr;
  GPUSNAP_RETURN_IF_CU_ERROR(d_, d_.host_alloc(&p, chunks::kChunkBytes, abi::kMemHostAllocPortable), "cuMemHostAlloc");
  MutexLock lock(mu_);
  memory_[slot] = p;
  return p;
}

Result<AdmitStats> PinnedTier::Admit(const chunks::ChunkStore& store, const std::vector<chunks::ChunkRef>& refs,
                                     const AdmitProgress& progress) {
  return Admit(store, refs, progress, Yield::kNever);
}

Result<AdmitStats> PinnedTier::Admit(const chunks::ChunkStore& store, const std::vector<chunks::ChunkRef>& refs,
                                     const AdmitProgress& progress, Yield yield) {
  std::vector<chunks::ChunkRef> stored;
  std::set<chunks::ChunkDigest> seen;
  uint64_t total = 0;
  for (const chunks::ChunkRef& r : refs)
    if (!r.zero && seen.insert(r.digest).second) {
      stored.push_back(r);
      total += r.length;
    }
  AdmitStats stats;
  std::vector<chunks::ChunkDigest> held;  // let go once the whole admission is done
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> done{0};
  FirstFailure failure;
  std::atomic<bool> failed{false};
  Mutex stats_mu;
  auto work = [&] {
    for (size_t i; !failed && (i = next.fetch_add(1)) < stored.size();) {
      const chunks::ChunkRef& ref = stored[i];
      TierSlots::Placement p;
      {
        MutexLock lock(mu_);
        // Before each chunk, not only the first: a fill that starts while
        // this admission runs waits for one chunk per thread at most.
        if (yield == Yield::kToHolds) {
          while (admission_holds_ > 0 && !stopping_) lock.Wait(changed_);
          if (stopping_) return;
        }
        p = slots_.Place(ref.digest);
      }
      {
        MutexLock lock(stats_mu);
        if (p.placed == TierSlots::Placed::kFull) ++stats.left_out;
        if (p.placed == TierSlots::Placed::kHeld || p.placed == TierSlots::Placed::kBusy) ++stats.present;
        if (p.placed == TierSlots::Placed::kHeld) held.push_back(ref.digest);
      }
      if (p.placed == TierSlots::Placed::kFill) {
        Status st = [&]() -> Status {
          GPUSNAP_ASSIGN_OR_RETURN(void* slot, SlotMemory(p.slot));
          GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkReader reader, chunks::ChunkReader::Open(store, ref));
          GPUSNAP_RETURN_IF_ERROR(reader.Read(slot, ref.length));
          return reader.Finish();
        }();
        MutexLock lock(mu_);
        if (!st.ok()) {
          slots_.Abandon(ref.digest);
          failure.Record(st);
          failed = true;
          continue;
        }
        slots_.Filled(ref.digest);
        MutexLock counted(stats_mu);
        held.push_back(ref.digest);
        ++stats.admitted;
        stats.bytes += ref.length;
      }
      if (p.placed == TierSlots::Placed::kFull) continue;
      uint64_t now = done.fetch_add(ref.length) + ref.length;
      if (progress) progress(now, total);
    }
  };
  unsigned threads = static_cast<unsigned>(std::clamp<size_t>(stored.size(), 1, kAdmitThreads));
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back(work);
  for (std::thread& t : pool) t.join();
  {
    MutexLock lock(mu_);
    for (const chunks::ChunkDigest& d : held) slots_.Release(d);
  }
  GPUSNAP_RETURN_IF_ERROR(failure.Get().Wrap("pinning chunks"));
  return stats;
}

void PinnedTier::AdmitLater(std::string chunk_store, std::vector<chunks::ChunkRef> refs) {
  MutexLock lock(mu_);
  if (stopping_ || refs.empty()) return;
  queue_.emplace_back(std::move(chunk_store), std::move(refs));
  ++admissions_pending_;
  if (!admitter_.joinable()) admitter_ = std::thread([this] { AdmitLoop(); });
  changed_.notify_all();
}

void PinnedTier::AdmitLoop() {
  for (;;) {
    std::pair<std::string, std::vector<chunks::ChunkRef>> next;
    {
      MutexLock lock(mu_);
      while (queue_.empty() && !stopping_) lock.Wait(changed_);
      if (stopping_) return;
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    if (auto store = chunks::ChunkStore::Open(next.first); store.ok())
      (void)Admit(*store, next.second, {}, Yield::kToHolds);
    MutexLock lock(mu_);
    --admissions_pending_;
  }
}

PinnedTier::AdmissionHold PinnedTier::HoldAdmissions() {
  MutexLock lock(mu_);
  ++admission_holds_;
  // The tier outlives the hold: the deleter keeps it.
  return AdmissionHold(static_cast<void*>(this), [tier = shared_from_this()](void*) {
    MutexLock released(tier->mu_);
    --tier->admission_holds_;
    tier->changed_.notify_all();
  });
}

PinnedTier::Lease PinnedTier::Borrow(const std::vector<chunks::ChunkRef>& refs) {
  Lease lease;
  lease.tier_ = shared_from_this();
  MutexLock lock(mu_);
  for (const chunks::ChunkRef& r : refs) {
    if (r.zero) continue;
    if (lease.found_.contains(r.digest)) {
      ++lease.hits_;
      continue;
    }
    if (std::optional<size_t> slot = slots_.Hold(r.digest)) {
      lease.found_.emplace(r.digest, memory_[*slot]);
      ++lease.hits_;
    } else {
      lease.missed_.push_back(r);
    }
  }
  hits_ += lease.hits_;
  misses_ += lease.missed_.size();
  return lease;
}

PinnedTier::Lease::~Lease() {
  if (tier_) tier_->Return(found_);
}

const void* PinnedTier::Lease::Find(const chunks::ChunkRef& ref) const {
  if (ref.zero) return nullptr;
  auto it = found_.find(ref.digest);
  return it == found_.end() ? nullptr : it->second;
}

void PinnedTier::Return(const std::map<chunks::ChunkDigest, const void*>& held) {
  MutexLock lock(mu_);
  for (const auto& [digest, memory] : held) slots_.Release(digest);
}

PinnedTierGauges PinnedTier::gauges() const {
  MutexLock lock(mu_);
  PinnedTierGauges g;
  g.capacity_bytes = slots_.capacity() * chunks::kChunkBytes;
  g.used_bytes = slots_.used() * chunks::kChunkBytes;
  g.chunks = slots_.whole();
  g.hits = hits_;
  g.misses = misses_;
  g.evictions = slots_.evictions();
  g.admissions_pending = admissions_pending_;
  return g;
}

Result<std::vector<chunks::ChunkRef>> PreloadedChunks(const std::vector<std::pair<std::string, int>>& manifests) {
  std::vector<chunks::ChunkRef> out;
  std::set<chunks::ChunkDigest> seen;
  for (const auto& [dir, ns_pid] : manifests) {
    GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkManifest manifest, ReadManifestOf(dir, ns_pid));
    for (const chunks::ChunkedAllocation& a : manifest.allocations) {
      if (a.origin != chunks::AllocationOrigin::kShim) continue;
      for (const chunks::ChunkRef& r : a.chunks)
        if (!r.zero && seen.insert(r.digest).second) out.push_back(r);
    }
  }
  return out;
}

Result<std::vector<chunks::ChunkRef>> PreloadedChunks(const std::string& gpu_dir, const std::vector<int>& ns_pids) {
  std::vector<std::pair<std::string, int>> manifests;
  for (int ns_pid : ns_pids) manifests.emplace_back(gpu_dir, ns_pid);
  return PreloadedChunks(manifests);
}

}  // namespace gpusnap::gpushare::control
