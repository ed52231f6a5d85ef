#include "gpushare/shim/device_memory.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <memory>
#include <functional>
#include <map>
#include <string_view>
#include <thread>
#include <vector>

#include "chunks/chunk_store.h"
#include "gpushare/common/chunk_copy.h"
#include "util/files.h"

namespace gpusnap::gpushare::shim {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

const char* StateName(ShimState s) {
  switch (s) {
    case ShimState::kRunning: return "running";
    case ShimState::kQuiesced: return "quiesced";
    case ShimState::kReleased: return "released";
  }
  return "?";
}

#define SHIM_CU(call, name) GPUSNAP_RETURN_IF_CU_ERROR(Real(), call, name)

// Tests on a real driver cannot make it fail on cue: with
// GPUSNAP_GPUSHARE_TEST_FAIL naming a file that holds the line
// "<step> <pid>" (the pid as this process sees itself), that step fails here
// after the memory was freed, so its undoing runs as after a driver error.
Status InjectedFailure(const char* step) {
  const char* path = std::getenv("GPUSNAP_GPUSHARE_TEST_FAIL");
  if (path == nullptr || *path == 0) return Status::Ok();
  auto text = ReadFile(path);
  if (!text.ok()) return Status::Ok();
  std::string want = fmt::format("{} {}", step, ::getpid());
  for (size_t at = 0; (at = text->find(want, at)) != std::string::npos; at += want.size()) {
    size_t end = at + want.size();
    if ((at == 0 || (*text)[at - 1] == '\n') && (end == text->size() || (*text)[end] == '\n'))
      return Status::Error(Code::kInternal, "{}: failure injected for pid {} (GPUSNAP_GPUSHARE_TEST_FAIL)", step,
                           ::getpid());
  }
  return Status::Ok();
}

}  // namespace

abi::CUresult MapAt(uint64_t va, uint64_t size, uint64_t offset, abi::CUmemGenericAllocationHandle handle) {
  const RealDriver& d = Real();
  abi::CUresult rc = d.mem_map(va, size, offset, handle, 0);
  if (rc == abi::CUDA_SUCCESS) return rc;
  // The reservation did not come back with the process: take the same range again.
  abi::CUdeviceptr got = 0;
  if (d.address_reserve(&got, size, 0, va, 0) != abi::CUDA_SUCCESS) return rc;
  if (got != va) {
    d.address_free(got, size);
    return rc;
  }
  return d.mem_map(va, size, offset, handle, 0);
}

DeviceMemory& DeviceMemory::Get() {
  static DeviceMemory* memory = new DeviceMemory();  // never destroyed: hooks may run during exit
  return *memory;
}

abi::CUresult DeviceMemory::Allocate(abi::CUdeviceptr* ptr, size_t bytes) {
  const RealDriver& d = Real();
  if (!d.missing.empty()) return d.mem_alloc ? d.mem_alloc(ptr, bytes) : abi::CUDA_ERROR_NOT_INITIALIZED;
  {
    MutexLock lock(mu_);
    if (ptr == nullptr || bytes < kVmmMinBytes || vmm_disabled_) return d.mem_alloc(ptr, bytes);
  }
  abi::CUcontext ctx = nullptr;
  abi::CUdevice dev = 0;
  if (d.ctx_get_current(&ctx) != abi::CUDA_SUCCESS || ctx == nullptr || d.ctx_get_device(&dev) != abi::CUDA_SUCCESS)
    return d.mem_alloc(ptr, bytes);

  abi::CUmemAllocationProp prop{};
  prop.type = abi::CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;  // CUDA IPC of it stays possible
  prop.location = {abi::CU_MEM_LOCATION_TYPE_DEVICE, dev};
  size_t granularity = 0;
  if (d.granularity(&granularity, &prop, abi::CU_MEM_ALLOC_GRANULARITY_MINIMUM) != abi::CUDA_SUCCESS ||
      granularity == 0 || (granularity & (granularity - 1)) != 0) {
    MutexLock lock(mu_);
    vmm_disabled_ = true;
    return d.mem_alloc(ptr, bytes);
  }
  uint64_t size = RoundUpToGranularity(bytes, granularity);
  abi::CUdeviceptr va = 0;
  abi::CUresult rc = d.address_reserve(&va, size, 0, 0, 0);
  if (rc != abi::CUDA_SUCCESS) return rc;
  abi::CUmemGenericAllocationHandle handle = 0;
  rc = d.mem_create(&handle, size, &prop, 0);
  if (rc == abi::CUDA_ERROR_NOT_SUPPORTED || rc == abi::CUDA_ERROR_INVALID_VALUE) {
    prop.requestedHandleTypes = abi::CU_MEM_HANDLE_TYPE_NONE;
    rc = d.mem_create(&handle, size, &prop, 0);
  }
  if (rc != abi::CUDA_SUCCESS) {
    d.address_free(va, size);
    return rc;
  }
  rc = d.mem_map(va, size, 0, handle, 0);
  if (rc == abi::CUDA_SUCCESS) {
    abi::CUmemAccessDesc access{{abi::CU_MEM_LOCATION_TYPE_DEVICE, dev}, abi::CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    rc = d.mem_set_access(va, size, &access, 1);
    if (rc != abi::CUDA_SUCCESS) d.mem_unmap(va, size);
  }
  if (rc != abi::CUDA_SUCCESS) {
    d.mem_release(handle);
    d.address_free(va, size);
    return rc;
  }
  TrackedAllocation a;
  a.va = va;
  a.size = size;
  a.requested = bytes;
  a.device = dev;
  a.handle = handle;
  a.context = reinterpret_cast<uint64_t>(ctx);
  MutexLock lock(mu_);
  registry_.Add(a);
  *ptr = va;
  return abi::CUDA_SUCCESS;
}

abi::CUresult DeviceMemory::Free(abi::CUdeviceptr ptr) {
  const RealDriver& d = Real();
  std::optional<TrackedAllocation> a;
  {
    MutexLock lock(mu_);
    a = registry_.FindStart(ptr);
    if (a) registry_.Remove(ptr);
  }
  if (!a) return d.mem_free(ptr);
  ForgetAdoptedFd(a->va);
  // cuMemFree waits for the device; unmapping does not, so wait here as the
  // application expects.
  d.ctx_synchronize();
  abi::CUresult rc = a->released ? abi::CUDA_SUCCESS : d.mem_unmap(a->va, a->size);
  if (!a->released && rc == abi::CUDA_SUCCESS) rc = d.mem_release(a->handle);
  abi::CUresult rc_free = d.address_free(a->va, a->size);
  return rc != abi::CUDA_SUCCESS ? rc : rc_free;
}

int DeviceMemory::MarkScratch(uint64_t ptr, uint64_t bytes) {
  MutexLock lock(mu_);
  return registry_.MarkScratch(ptr, bytes);
}

int DeviceMemory::UnmarkScratch(uint64_t ptr, uint64_t bytes) {
  MutexLock lock(mu_);
  return registry_.UnmarkScratch(ptr, bytes);
}

Status DeviceMemory::Quiesce(int timeout_ms) {
  if (state_ != ShimState::kRunning) return Status::Ok();
  auto t0 = Clock::now();
  auto deadline = t0 + std::chrono::milliseconds(timeout_ms);
  if (!gate_.Close(std::chrono::milliseconds(timeout_ms)))
    return Status::Error(Code::kTimeout, "quiesce: {} call(s) still inside the driver after {} ms", gate_.inside(),
                         timeout_ms);
  std::vector<uint64_t> contexts;
  {
    MutexLock lock(mu_);
    contexts = registry_.Contexts();
    for (VmmObject* o : objects_.Objects()) {
      for (const VmmMapping& m : objects_.MappingsOf(o->id)) {
        if (m.context != 0 && std::find(contexts.begin(), contexts.end(), m.context) == contexts.end())
          contexts.push_back(m.context);
      }
    }
  }
  // The work already on the GPU may wait for another process whose next
  // launch is held at its own gate (a collective half entered): wait for it
  // on a thread of its own, and give up at the deadline; gpusnap then resumes
  // every process and tries again.
  struct Drain {
    Mutex mu;
    std::condition_variable cv;
    bool done GUARDED_BY(mu) = false;
    abi::CUresult rc GUARDED_BY(mu) = abi::CUDA_SUCCESS;
  };
  auto drain = std::make_shared<Drain>();
  std::thread([drain, contexts] {
    abi::CUresult rc = abi::CUDA_SUCCESS;
    for (uint64_t ctx : contexts) {
      rc = Real().ctx_set_current(reinterpret_cast<abi::CUcontext>(ctx));
      if (rc == abi::CUDA_SUCCESS) rc = Real().ctx_synchronize();
      if (rc != abi::CUDA_SUCCESS) break;
    }
    MutexLock lock(drain->mu);
    drain->rc = rc;
    drain->done = true;
    drain->cv.notify_all();
  }).detach();
  MutexLock lock(drain->mu);
  while (!drain->done && lock.WaitUntil(drain->cv, deadline)) {
  }
  if (!drain->done) {
    gate_.Open();
    return Status::Error(Code::kTimeout,
                         "quiesce: the GPU work already submitted did not finish within {} ms (is it waiting for "
                         "another process, as a collective does?)",
                         timeout_ms);
  }
  if (drain->rc != abi::CUDA_SUCCESS) {
    gate_.Open();
    return Status::Error(Code::kExternal, "quiesce: {}", Real().Describe("cuCtxSynchronize", drain->rc));
  }
  state_ = ShimState::kQuiesced;
  last_ = {{"quiesce_s", SecondsSince(t0)}};
  return Status::Ok();
}

Status DeviceMemory::Release(const std::string& chunk_store, const std::string& manifest_path) {
  if (state_ != ShimState::kQuiesced)
    return Status::Error(Code::kFailedPrecondition, "release: the process is {}, not quiesced", StateName(state_));
  auto t0 = Clock::now();
  GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkStore store, chunks::ChunkStore::Open(chunk_store));
  std::vector<TrackedAllocation> allocs;
  std::vector<std::vector<bool>> scratch;  // per allocation, its chunks the workload marked scratch
  {
    MutexLock lock(mu_);
    allocs = registry_.All();
    for (const TrackedAllocation& a : allocs) scratch.push_back(registry_.ScratchChunks(a.va, chunks::kChunkBytes));
  }
  // What is saved: the cuMemAlloc allocations, then the application's own VMM objects.
  GPUSNAP_ASSIGN_OR_RETURN(std::vector<TrackedAllocation> saved, ObjectRanges(/*released=*/false));
  saved.insert(saved.begin(), allocs.begin(), allocs.end());
  std::vector<DeviceRange> ranges;
  for (const TrackedAllocation& a : saved) ranges.push_back({a.va, a.size, a.context});
  // Scratch chunks are neither read nor stored: the manifest says so, and a
  // load zeroes them.
  std::vector<ChunkJob> jobs;
  uint64_t chunks_scratch = 0, scratch_bytes = 0;
  for (const ChunkJob& job : ChunkJobs(ranges)) {
    if (job.range < scratch.size() && job.index < scratch[job.range].size() && scratch[job.range][job.index]) {
      ++chunks_scratch;
      scratch_bytes += job.length;
    } else {
      jobs.push_back(job);
    }
  }
  // Chunks unchanged since they were stored are written to the manifest as
  // they were, and only the others are copied off the GPU.
  nlohmann::json figures;
  auto t_fingerprint = Clock::now();
  // Ranges wholly scratch (a KV-cache pool) are not read at all.
  std::vector<DeviceRange> to_fingerprint = ranges;
  std::vector<bool> has_job(ranges.size(), false);
  for (const ChunkJob& job : jobs) has_job[job.range] = true;
  for (size_t r = 0; r < ranges.size(); ++r)
    if (!has_job[r]) to_fingerprint[r].size = 0;
  RangeFingerprints fingerprints = FingerprintNow(to_fingerprint, figures);
  std::vector<std::optional<chunks::ChunkRef>> unchanged = PlanUnchangedChunks(
      jobs, ranges, fingerprints, stored_chunks_, [&store](const chunks::ChunkRef& ref) { return store.Holds(ref); });
  figures["fingerprint_s"] = SecondsSince(t_fingerprint);
  std::vector<size_t> to_copy;  // indices into jobs
  uint64_t chunks_unchanged = 0, unchanged_bytes = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (unchanged[j]) {
      ++chunks_unchanged;
      unchanged_bytes += jobs[j].length;
    } else {
      to_copy.push_back(j);
    }
  }
  chunks::ChunkManifest manifest;
  for (size_t i = 0; i < saved.size(); ++i) {
    const TrackedAllocation& a = saved[i];
    chunks::ChunkedAllocation& c = manifest.allocations.emplace_back();
    c.va = a.va;
    c.size = a.size;
    c.device = a.device;
    c.origin = i < allocs.size() ? chunks::AllocationOrigin::kShim : chunks::AllocationOrigin::kApplication;
    // The GPU by UUID too: gpusnap makes the memory of a restore itself, on
    // the GPU the device is mapped to then (preload.h).
    abi::CUdevice dev = 0;
    abi::CUuuid uuid{};
    if (Real().device_get(&dev, a.device) == abi::CUDA_SUCCESS &&
        Real().device_get_uuid(&uuid, dev) == abi::CUDA_SUCCESS)
      std::memcpy(c.device_uuid.data(), &uuid, sizeof(uuid));
    c.chunks.resize((a.size + chunks::kChunkBytes - 1) / chunks::kChunkBytes);
    for (size_t k = 0; i < scratch.size() && k < scratch[i].size() && k < c.chunks.size(); ++k) {
      if (!scratch[i][k]) continue;
      chunks::ChunkRef& ref = c.chunks[k];
      ref.zero = ref.scratch = true;
      ref.length = std::min(chunks::kChunkBytes, a.size - k * chunks::kChunkBytes);
    }
  }
  for (size_t j = 0; j < jobs.size(); ++j)
    if (unchanged[j]) manifest.allocations[jobs[j].range].chunks[jobs[j].index] = *unchanged[j];
  struct {
    Mutex mu;
    chunks::SaveStats sum GUARDED_BY(mu);
  } stats;
  // Saving changes nothing in the process: a failure here leaves it as it was.
  // (A process that only maps other processes' memory has nothing to save.)
  Status st = to_copy.empty() ? Status::Ok() : RunChunkJobs(Real(), to_copy.size(), ThreadsFromEnv("GPUSNAP_GPUSHARE_SAVE_THREADS", 4), 1, chunks::kChunkBytes,
                           saved.empty() ? 0 : saved.front().context,
                           [&](Staging& staging, size_t j) -> Status {
                             if (j == SIZE_MAX) return Status::Ok();
                             const ChunkJob& job = jobs[to_copy[j]];
                             const TrackedAllocation& a = saved[job.range];
                             GPUSNAP_ASSIGN_OR_RETURN(abi::CUstream stream, staging.Stream(a.context, 0));
                             GPUSNAP_ASSIGN_OR_RETURN(void* buffer, staging.buffer(0));
                             SHIM_CU(Real().copy_dtoh_async(buffer, a.va + job.offset, job.length, stream),
                                     "cuMemcpyDtoHAsync");
                             SHIM_CU(Real().stream_synchronize(stream), "cuStreamSynchronize");
                             chunks::SaveStats local;
                             auto ref = store.SaveChunk(buffer, job.length, &local);
                             if (!ref.ok()) return ref.status();
                             manifest.allocations[job.range].chunks[job.index] = *ref;
                             MutexLock lock(stats.mu);
                             stats.sum.chunks_written += local.chunks_written;
                             stats.sum.chunks_present += local.chunks_present;
                             stats.sum.chunks_zero += local.chunks_zero;
                             stats.sum.bytes_written += local.bytes_written;
                             return Status::Ok();
                           });
  if (!st.ok()) return st.Wrap("release: saving device memory");
  GPUSNAP_RETURN_IF_ERROR(WriteFileAtomic(manifest_path, chunks::EncodeChunkManifest(manifest)).Wrap("release"));
  double save_s = SecondsSince(t0);
  {
    std::vector<chunks::ChunkRef> refs;
    for (const ChunkJob& job : jobs) refs.push_back(manifest.allocations[job.range].chunks[job.index]);
    stored_chunks_ = RecordStoredChunks(jobs, ranges, fingerprints, refs);
  }

  // Now free the physical memory; the reservations keep the addresses.
  const RealDriver& d = Real();
  for (TrackedAllocation& a : allocs) {
    abi::CUresult rc = d.mem_unmap(a.va, a.size);
    if (rc == abi::CUDA_SUCCESS) rc = d.mem_release(a.handle);
    if (rc != abi::CUDA_SUCCESS) {
      st = Status::Error(Code::kExternal, "release: {} for {:#x} ({} bytes)", d.Describe("cuMemUnmap/cuMemRelease", rc),
                         a.va, a.size);
      break;
    }
    a.released = true;
    a.handle = 0;
    ForgetAdoptedFd(a.va);
    MutexLock lock(mu_);
    registry_.Update(a);
  }
  if (st.ok()) st = FreeObjects();
  if (st.ok()) st = InjectedFailure("release");
  if (!st.ok()) {
    // Put back what was already freed, from the chunks just written.
    state_ = ShimState::kReleased;
    Status back = Load(chunk_store, manifest_path);
    if (!back.ok()) return st.Wrap(fmt::format("and the rollback failed too ({})", back.message()));
    return st;
  }
  state_ = ShimState::kReleased;
  uint64_t released_bytes = 0;
  for (const TrackedAllocation& a : saved) released_bytes += a.size;
  MutexLock lock(stats.mu);
  last_ = {{"release_s", SecondsSince(t0)},            {"save_s", save_s},
           {"bytes", released_bytes},                  {"chunks_written", stats.sum.chunks_written},
           {"chunks_present", stats.sum.chunks_present}, {"chunks_zero", stats.sum.chunks_zero},
           {"bytes_written", stats.sum.bytes_written}, {"chunks_scratch", chunks_scratch},
           {"scratch_bytes", scratch_bytes},           {"chunks_copied", to_copy.size()},
           {"chunks_unchanged", chunks_unchanged},     {"unchanged_bytes", unchanged_bytes}};
  last_.update(figures);
  return Status::Ok();
}

RangeFingerprints DeviceMemory::FingerprintNow(const std::vector<DeviceRange>& ranges, nlohmann::json& figures) {
  // GPUSNAP_GPUSHARE_FINGERPRINT=0: copy every chunk at every release, as
  // before fingerprints (for measuring, and a way out should a driver refuse
  // the kernel in a way that is not an error).
  const char* env = std::getenv("GPUSNAP_GPUSHARE_FINGERPRINT");
  if (env != nullptr && std::string_view(env) == "0") {
    figures["fingerprint"] = "off (GPUSNAP_GPUSHARE_FINGERPRINT=0)";
    return {};
  }
  if (!fingerprint_kernel_) fingerprint_kernel_.emplace(Real());
  auto got = fingerprint_kernel_->Ranges(ranges);
  if (!got.ok()) {
    // Not a failure of the release: it copies what it cannot tell unchanged.
    figures["fingerprint"] = "failed: " + got.status().message();
    return {};
  }
  figures["fingerprint"] = "on";
  return std::move(got).value();
}

Status DeviceMemory::MapAll(std::vector<TrackedAllocation>& allocs) {
  const RealDriver& d = Real();
  for (TrackedAllocation& a : allocs) {
    if (!a.released) continue;
    SHIM_CU(d.ctx_set_current(reinterpret_cast<abi::CUcontext>(a.context)), "cuCtxSetCurrent");
    abi::CUmemAllocationProp prop{};
    prop.type = abi::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location = {abi::CU_MEM_LOCATION_TYPE_DEVICE, a.device};
    abi::CUmemGenericAllocationHandle handle = 0;
    abi::CUresult rc = d.mem_create(&handle, a.size, &prop, 0);
    if (rc == abi::CUDA_ERROR_NOT_SUPPORTED || rc == abi::CUDA_ERROR_INVALID_VALUE) {
      prop.requestedHandleTypes = abi::CU_MEM_HANDLE_TYPE_NONE;
      rc = d.mem_create(&handle, a.size, &prop, 0);
    }
    if (rc != abi::CUDA_SUCCESS) return Real().Error("cuMemCreate", rc).Wrap(fmt::format("{:#x}", a.va));
    GPUSNAP_RETURN_IF_ERROR(MapBack(a, handle));
  }
  return Status::Ok();
}

Status DeviceMemory::MapBack(TrackedAllocation& a, abi::CUmemGenericAllocationHandle handle) {
  const RealDriver& d = Real();
  abi::CUresult rc = MapAt(a.va, a.size, 0, handle);
  if (rc == abi::CUDA_SUCCESS) {
    abi::CUmemAccessDesc access{{abi::CU_MEM_LOCATION_TYPE_DEVICE, a.device}, abi::CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    rc = d.mem_set_access(a.va, a.size, &access, 1);
    if (rc != abi::CUDA_SUCCESS) d.mem_unmap(a.va, a.size);
  }
  if (rc != abi::CUDA_SUCCESS) {
    d.mem_release(handle);
    return Real().Error("cuMemMap", rc).Wrap(fmt::format("mapping {:#x} ({} bytes)", a.va, a.size));
  }
  a.handle = handle;
  a.released = false;
  MutexLock lock(mu_);
  registry_.Update(a);
  return Status::Ok();
}

Status DeviceMemory::Fill(const std::string& chunk_store, const std::vector<TrackedAllocation>& allocs,
                          const chunks::ChunkManifest& manifest) {
  GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkStore store, chunks::ChunkStore::Open(chunk_store));
  std::map<uint64_t, const chunks::ChunkedAllocation*> by_va;
  for (const chunks::ChunkedAllocation& c : manifest.allocations) by_va[c.va] = &c;
  std::vector<const chunks::ChunkedAllocation*> sources;
  for (const TrackedAllocation& a : allocs) {
    auto it = by_va.find(a.va);
    if (it == by_va.end() || it->second->size != a.size)
      return Status::Error(Code::kCorruption, "load: the manifest has no allocation {:#x} of {} bytes", a.va, a.size);
    sources.push_back(it->second);
  }
  std::vector<DeviceRange> ranges;
  for (const TrackedAllocation& a : allocs) ranges.push_back({a.va, a.size, a.context});
  // A bad chunk fails the load, and the caller tears the process down: nothing
  // runs on what was copied.
  return FillFromChunks(Real(), store, ranges, sources, ThreadsFromEnv("GPUSNAP_GPUSHARE_LOAD_THREADS", 12));
}

void DeviceMemory::ForgetAdoptedFd(uint64_t va) {
  MutexLock lock(mu_);
  if (auto it = adopted_fds_.find(va); it != adopted_fds_.end()) {
    ::close(it->second);
    adopted_fds_.erase(it);
  }
}

Status DeviceMemory::Adopt(uint64_t va, UniqueFd fd) {
  if (state_ != ShimState::kReleased)
    return Status::Error(Code::kFailedPrecondition, "adopt: the process is {}, not released", StateName(state_));
  std::optional<TrackedAllocation> a;
  {
    MutexLock lock(mu_);
    a = registry_.FindStart(va);
  }
  if (!a || !a->released)
    return Status::Error(Code::kNotFound, "adopt: no released allocation at {:#x} in this process", va);
  const RealDriver& d = Real();
  SHIM_CU(d.ctx_set_current(reinterpret_cast<abi::CUcontext>(a->context)), "cuCtxSetCurrent");
  abi::CUmemGenericAllocationHandle handle = 0;
  abi::CUresult rc = d.mem_import(&handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd.get())),
                                  abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (rc != abi::CUDA_SUCCESS) return Real().Error("cuMemImportFromShareableHandle", rc).Wrap("adopt");
  GPUSNAP_RETURN_IF_ERROR(MapBack(*a, handle).Wrap("adopt"));
  MutexLock lock(mu_);
  adopted_fds_[a->va] = fd.Release();
  ++adopted_;
  adopted_bytes_ += a->size;
  return Status::Ok();
}

Status DeviceMemory::Load(const std::string& chunk_store, const std::string& manifest_path) {
  if (state_ != ShimState::kReleased)
    return Status::Error(Code::kFailedPrecondition, "load: the process is {}, not released", StateName(state_));
  auto t0 = Clock::now();
  GPUSNAP_ASSIGN_OR_RETURN(std::string bytes, ReadFile(manifest_path));
  GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkManifest manifest, chunks::DecodeChunkManifest(bytes, manifest_path));
  stored_chunks_ = ForgetOthers(stored_chunks_, manifest);
  std::vector<TrackedAllocation> allocs;
  {
    MutexLock lock(mu_);
    allocs = registry_.All();
  }
  std::vector<TrackedAllocation> released;
  for (const TrackedAllocation& a : allocs)
    if (a.released) released.push_back(a);
  GPUSNAP_ASSIGN_OR_RETURN(std::vector<TrackedAllocation> objects, ObjectRanges(/*released=*/true));
  Status st = MapAll(released).Wrap("load");
  if (st.ok()) st = MakeObjects().Wrap("load");
  released.insert(released.end(), objects.begin(), objects.end());
  double map_s = SecondsSince(t0);
  if (st.ok()) st = Fill(chunk_store, released, manifest).Wrap("load");
  if (!st.ok()) {
    // Nothing may run on half-loaded memory, nor hold it: what this load (or
    // an adopt before it) mapped is freed again, and the process stays
    // released, whole, for a later load to start over.
    if (Status dropped = DropLoaded(); !dropped.ok())
      return st.Wrap(fmt::format("and freeing what it had loaded failed too ({})", dropped.message()));
    return st;
  }
  state_ = ShimState::kQuiesced;
  uint64_t total = 0;
  for (const TrackedAllocation& a : released) total += a.size;
  double s = SecondsSince(t0);
  last_ = {{"load_s", s},
           {"map_s", map_s},
           {"bytes", total},
           {"gb_per_s", s > 0 ? total / s / 1e9 : 0},
           {"adopted", adopted_},
           {"adopted_bytes", adopted_bytes_}};
  adopted_ = adopted_bytes_ = 0;
  loads_.fetch_add(1, std::memory_order_release);
  return Status::Ok();
}

Status DeviceMemory::DropLoaded() {
  const RealDriver& d = Real();
  std::vector<TrackedAllocation> allocs;
  {
    MutexLock lock(mu_);
    allocs = registry_.All();
  }
  for (TrackedAllocation& a : allocs) {
    if (a.released) continue;
    abi::CUresult rc = d.mem_unmap(a.va, a.size);
    if (rc == abi::CUDA_SUCCESS) rc = d.mem_release(a.handle);
    if (rc != abi::CUDA_SUCCESS)
      return Real().Error("cuMemUnmap/cuMemRelease", rc).Wrap(fmt::format("{:#x} ({} bytes)", a.va, a.size));
    a.released = true;
    a.handle = 0;
    ForgetAdoptedFd(a.va);
    MutexLock lock(mu_);
    registry_.Update(a);
  }
  return FreeObjects();
}

Status DeviceMemory::Resume() {
  if (state_ == ShimState::kReleased)
    return Status::Error(Code::kFailedPrecondition, "resume: the device memory is released; load it first");
  {
    MutexLock lock(mu_);
    for (VmmObject* o : objects_.Objects()) {
      if (o->imported && o->real == 0 && !objects_.MappingsOf(o->id).empty())
        return Status::Error(Code::kFailedPrecondition,
                             "resume: imported device memory {:#x} is not mapped again yet (remap it first)", o->id);
    }
  }
  state_ = ShimState::kRunning;
  gate_.Open();
  return Status::Ok();
}

nlohmann::json DeviceMemory::Describe() {
  RegistryTotals t;
  // The shim's allocations whose memory is mapped: what gpusnap may hold
  // through a release (`export` each). Not one with memory marked scratch:
  // a release zeroes that, held or not (docs/GPUSHARE.md).
  nlohmann::json mapped = nlohmann::json::array();
  {
    MutexLock lock(mu_);
    t = registry_.Totals();
    for (const TrackedAllocation& a : registry_.All()) {
      std::vector<bool> scratch = registry_.ScratchChunks(a.va, chunks::kChunkBytes);
      if (!a.released && std::ranges::none_of(scratch, [](bool s) { return s; }))
        mapped.push_back({{"va", a.va}, {"size", a.size}});
    }
  }
  nlohmann::json j{{"state", StateName(state_)},
                   {"allocations", t.allocations},
                   {"bytes", t.bytes},
                   {"released_bytes", t.released_bytes},
                   {"scratch_bytes", t.scratch_bytes},
                   {"held_calls", gate_.held()},
                   {"shim_allocations", mapped},
                   {"last", last_}};
  // The application's own VMM objects count as allocations too.
  nlohmann::json sharing = DescribeSharing();
  j["allocations"] = t.allocations + sharing["objects"].get<uint64_t>();
  j["bytes"] = t.bytes + sharing["object_bytes"].get<uint64_t>();
  j["released_bytes"] = t.released_bytes + sharing["object_released_bytes"].get<uint64_t>();
  j.update(sharing);
  return j;
}

}  // namespace gpusnap::gpushare::shim
