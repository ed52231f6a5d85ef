#include "gpushare/shim/device_memory.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <functional>
#include <map>
#include <thread>
#include <vector>

#include "gpushare/chunk_store.h"
#include "util/files.h"

namespace gpusnap::gpushare {
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

#define SHIM_CU(call, name)                                     \
  do {                                                          \
    abi::CUresult _rc = (call);                                 \
    if (_rc != abi::CUDA_SUCCESS) return DriverError(name, _rc); \
  } while (0)

unsigned ThreadsFromEnv(const char* name, unsigned fallback) {
  const char* v = std::getenv(name);
  int n = v ? std::atoi(v) : 0;
  return n >= 1 && n <= 64 ? static_cast<unsigned>(n) : fallback;
}

// Loads stage pieces of chunks: small pinned buffers are quick to pin, and a
// piece's copy runs while the next piece is read.
constexpr uint64_t kStagingPieceBytes = 16ull << 20;

// One chunk of one allocation.
struct ChunkJob {
  size_t alloc = 0;
  size_t index = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

std::vector<ChunkJob> ChunkJobs(const std::vector<TrackedAllocation>& allocs) {
  std::vector<ChunkJob> jobs;
  for (size_t a = 0; a < allocs.size(); ++a) {
    size_t i = 0;
    for (uint64_t off = 0; off < allocs[a].size; off += kChunkBytes, ++i)
      jobs.push_back({a, i, off, std::min(kChunkBytes, allocs[a].size - off)});
  }
  return jobs;
}

// A worker's pinned buffers and, per context, its streams. Pinned memory is
// allocated portable, so any context may copy through it.
class Staging {
 public:
  Staging() = default;
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    const RealDriver& d = Real();
    for (auto& [ctx, streams] : streams_) {
      d.ctx_set_current(reinterpret_cast<abi::CUcontext>(ctx));
      for (abi::CUstream s : streams) d.stream_destroy(s);
    }
    for (void* b : buffers_) d.free_host(b);
  }
  Status Init(int buffers, uint64_t bytes) {
    for (int i = 0; i < buffers; ++i) {
      void* p = nullptr;
      SHIM_CU(Real().host_alloc(&p, bytes, abi::kMemHostAllocPortable), "cuMemHostAlloc");
      buffers_.push_back(p);
    }
    return Status::Ok();
  }
  void* buffer(size_t i) { return buffers_[i]; }
  // A worker's own bookkeeping of its buffers: the stream whose copy last read
  // each one, and whose turn is next.
  std::vector<abi::CUstream> pending;
  size_t turn = 0;
  // Makes `ctx` current on this thread and returns its stream number `i`.
  Result<abi::CUstream> Stream(uint64_t ctx, size_t i) {
    const RealDriver& d = Real();
    SHIM_CU(d.ctx_set_current(reinterpret_cast<abi::CUcontext>(ctx)), "cuCtxSetCurrent");
    auto& streams = streams_[ctx];
    while (streams.size() <= i) {
      abi::CUstream s = nullptr;
      SHIM_CU(d.stream_create(&s, abi::kStreamNonBlocking), "cuStreamCreate");
      streams.push_back(s);
    }
    return streams[i];
  }

 private:
  std::vector<void*> buffers_;
  std::map<uint64_t, std::vector<abi::CUstream>> streams_;
};

// Runs `work(worker, job)` for every job on `threads` threads, each with its
// own Staging of `buffers` pinned buffers. The first failure stops the rest
// and is returned.
Status RunChunkJobs(size_t jobs, unsigned threads, int buffers, uint64_t buffer_bytes, uint64_t context,
                    const std::function<Status(Staging&, size_t job, size_t nth_of_worker)>& work) {
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  Status failure;
  auto fail = [&](const Status& st) {
    std::lock_guard lock(mu);
    if (failure.ok()) failure = st;
    failed = true;
  };
  auto run = [&] {
    // Pinned host memory is allocated in a context, though usable from all.
    if (abi::CUresult rc = Real().ctx_set_current(reinterpret_cast<abi::CUcontext>(context)); rc != abi::CUDA_SUCCESS)
      return fail(DriverError("cuCtxSetCurrent", rc));
    Staging staging;
    if (Status st = staging.Init(buffers, buffer_bytes); !st.ok()) return fail(st);
    size_t nth = 0;
    for (size_t j; !failed && (j = next.fetch_add(1)) < jobs; ++nth) {
      if (Status st = work(staging, j, nth); !st.ok()) return fail(st);
    }
    if (Status st = work(staging, SIZE_MAX, nth); !st.ok()) fail(st);  // the worker's end: drain
  };
  threads = static_cast<unsigned>(std::clamp<size_t>(jobs, 1, threads));
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) pool.emplace_back(run);
  for (auto& t : pool) t.join();
  return failure;
}

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
    std::lock_guard lock(mu_);
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
    std::lock_guard lock(mu_);
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
  std::lock_guard lock(mu_);
  registry_.Add(a);
  *ptr = va;
  return abi::CUDA_SUCCESS;
}

abi::CUresult DeviceMemory::Free(abi::CUdeviceptr ptr) {
  const RealDriver& d = Real();
  std::optional<TrackedAllocation> a;
  {
    std::lock_guard lock(mu_);
    a = registry_.FindStart(ptr);
    if (a) registry_.Remove(ptr);
  }
  if (!a) return d.mem_free(ptr);
  // cuMemFree waits for the device; unmapping does not, so wait here as the
  // application expects.
  d.ctx_synchronize();
  abi::CUresult rc = a->released ? abi::CUDA_SUCCESS : d.mem_unmap(a->va, a->size);
  if (!a->released && rc == abi::CUDA_SUCCESS) rc = d.mem_release(a->handle);
  abi::CUresult rc_free = d.address_free(a->va, a->size);
  return rc != abi::CUDA_SUCCESS ? rc : rc_free;
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
    std::lock_guard lock(mu_);
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
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    abi::CUresult rc = abi::CUDA_SUCCESS;
  };
  auto drain = std::make_shared<Drain>();
  std::thread([drain, contexts] {
    abi::CUresult rc = abi::CUDA_SUCCESS;
    for (uint64_t ctx : contexts) {
      rc = Real().ctx_set_current(reinterpret_cast<abi::CUcontext>(ctx));
      if (rc == abi::CUDA_SUCCESS) rc = Real().ctx_synchronize();
      if (rc != abi::CUDA_SUCCESS) break;
    }
    std::lock_guard lock(drain->mu);
    drain->rc = rc;
    drain->done = true;
    drain->cv.notify_all();
  }).detach();
  std::unique_lock lock(drain->mu);
  if (!drain->cv.wait_until(lock, deadline, [&] { return drain->done; })) {
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
  GPUSNAP_ASSIGN_OR_RETURN(ChunkStore store, ChunkStore::Open(chunk_store));
  std::vector<TrackedAllocation> allocs;
  {
    std::lock_guard lock(mu_);
    allocs = registry_.All();
  }
  // What is saved: the cuMemAlloc allocations, then the application's own VMM objects.
  GPUSNAP_ASSIGN_OR_RETURN(std::vector<TrackedAllocation> saved, ObjectRanges(/*released=*/false));
  saved.insert(saved.begin(), allocs.begin(), allocs.end());
  std::vector<ChunkJob> jobs = ChunkJobs(saved);
  ChunkManifest manifest;
  for (const TrackedAllocation& a : saved) {
    manifest.allocations.push_back({a.va, a.size, a.device, {}});
    manifest.allocations.back().chunks.resize((a.size + kChunkBytes - 1) / kChunkBytes);
  }
  std::mutex stats_mu;
  SaveStats stats;
  // Saving changes nothing in the process: a failure here leaves it as it was.
  // (A process that only maps other processes' memory has nothing to save.)
  Status st = jobs.empty() ? Status::Ok() : RunChunkJobs(jobs.size(), ThreadsFromEnv("GPUSNAP_GPUSHARE_SAVE_THREADS", 4), 1, kChunkBytes,
                           saved.empty() ? 0 : saved.front().context,
                           [&](Staging& staging, size_t j, size_t) -> Status {
                             if (j == SIZE_MAX) return Status::Ok();
                             const ChunkJob& job = jobs[j];
                             const TrackedAllocation& a = saved[job.alloc];
                             GPUSNAP_ASSIGN_OR_RETURN(abi::CUstream stream, staging.Stream(a.context, 0));
                             SHIM_CU(Real().copy_dtoh_async(staging.buffer(0), a.va + job.offset, job.length, stream),
                                     "cuMemcpyDtoHAsync");
                             SHIM_CU(Real().stream_synchronize(stream), "cuStreamSynchronize");
                             SaveStats local;
                             auto ref = store.SaveChunk(staging.buffer(0), job.length, &local);
                             if (!ref.ok()) return ref.status();
                             manifest.allocations[job.alloc].chunks[job.index] = *ref;
                             std::lock_guard lock(stats_mu);
                             stats.chunks_written += local.chunks_written;
                             stats.chunks_present += local.chunks_present;
                             stats.chunks_zero += local.chunks_zero;
                             stats.bytes_written += local.bytes_written;
                             return Status::Ok();
                           });
  if (!st.ok()) return st.Wrap("release: saving device memory");
  GPUSNAP_RETURN_IF_ERROR(WriteFileAtomic(manifest_path, EncodeChunkManifest(manifest)).Wrap("release"));
  double save_s = SecondsSince(t0);

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
    std::lock_guard lock(mu_);
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
  last_ = {{"release_s", SecondsSince(t0)},        {"save_s", save_s},
           {"bytes", released_bytes},              {"chunks_written", stats.chunks_written},
           {"chunks_present", stats.chunks_present}, {"chunks_zero", stats.chunks_zero},
           {"bytes_written", stats.bytes_written}};
  return Status::Ok();
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
    if (rc != abi::CUDA_SUCCESS) return DriverError("cuMemCreate", rc).Wrap(fmt::format("{:#x}", a.va));
    rc = MapAt(a.va, a.size, 0, handle);
    abi::CUmemAccessDesc access{{abi::CU_MEM_LOCATION_TYPE_DEVICE, a.device}, abi::CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (rc == abi::CUDA_SUCCESS) rc = d.mem_set_access(a.va, a.size, &access, 1);
    if (rc != abi::CUDA_SUCCESS) {
      d.mem_release(handle);
      return DriverError("cuMemMap", rc).Wrap(fmt::format("mapping {:#x} ({} bytes) again", a.va, a.size));
    }
    a.handle = handle;
    a.released = false;
    std::lock_guard lock(mu_);
    registry_.Update(a);
  }
  return Status::Ok();
}

Status DeviceMemory::Fill(const std::string& chunk_store, const std::vector<TrackedAllocation>& allocs,
                          const ChunkManifest& manifest) {
  GPUSNAP_ASSIGN_OR_RETURN(ChunkStore store, ChunkStore::Open(chunk_store));
  std::map<uint64_t, const ChunkedAllocation*> by_va;
  for (const ChunkedAllocation& c : manifest.allocations) by_va[c.va] = &c;
  std::vector<const ChunkedAllocation*> sources;
  for (const TrackedAllocation& a : allocs) {
    auto it = by_va.find(a.va);
    if (it == by_va.end() || it->second->size != a.size)
      return Status::Error(Code::kCorruption, "load: the manifest has no allocation {:#x} of {} bytes", a.va, a.size);
    sources.push_back(it->second);
  }
  std::vector<ChunkJob> jobs = ChunkJobs(allocs);
  if (jobs.empty()) return Status::Ok();
  // Each worker reads a chunk in pieces into its pinned buffers, in turn, and
  // copies each piece on while reading the next; the chunk's digest is
  // checked when its last piece is read. A bad chunk fails the load, and the
  // caller tears the process down: nothing runs on what was copied.
  constexpr int kBuffers = 2;
  return RunChunkJobs(jobs.size(), ThreadsFromEnv("GPUSNAP_GPUSHARE_LOAD_THREADS", 12), kBuffers, kStagingPieceBytes,
                      allocs.empty() ? 0 : allocs.front().context,
                      [&](Staging& staging, size_t j, size_t) -> Status {
                        auto& pending = staging.pending;
                        pending.resize(kBuffers, nullptr);
                        if (j == SIZE_MAX) {
                          for (abi::CUstream& s : pending) {
                            if (s) SHIM_CU(Real().stream_synchronize(s), "cuStreamSynchronize");
                            s = nullptr;
                          }
                          return Status::Ok();
                        }
                        const ChunkJob& job = jobs[j];
                        const TrackedAllocation& a = allocs[job.alloc];
                        const ChunkRef& ref = sources[job.alloc]->chunks[job.index];
                        if (ref.length != job.length)
                          return Status::Error(Code::kCorruption, "load: chunk {} of {:#x} has {} bytes, expected {}",
                                               job.index, a.va, ref.length, job.length);
                        if (ref.zero) {
                          GPUSNAP_ASSIGN_OR_RETURN(abi::CUstream stream, staging.Stream(a.context, 0));
                          SHIM_CU(Real().memset_d8_async(a.va + job.offset, 0, job.length, stream), "cuMemsetD8Async");
                          pending[0] = stream;
                          return Status::Ok();
                        }
                        GPUSNAP_ASSIGN_OR_RETURN(ChunkReader reader, ChunkReader::Open(store, ref));
                        for (uint64_t off = 0; reader.remaining() > 0;) {
                          size_t slot = staging.turn++ % kBuffers;
                          GPUSNAP_ASSIGN_OR_RETURN(abi::CUstream stream, staging.Stream(a.context, slot));
                          // The buffer's previous copy must be done before it is refilled.
                          if (pending[slot]) SHIM_CU(Real().stream_synchronize(pending[slot]), "cuStreamSynchronize");
                          pending[slot] = stream;
                          uint64_t n = std::min(kStagingPieceBytes, reader.remaining());
                          GPUSNAP_RETURN_IF_ERROR(reader.Read(staging.buffer(slot), n));
                          SHIM_CU(Real().copy_htod_async(a.va + job.offset + off, staging.buffer(slot), n, stream),
                                  "cuMemcpyHtoDAsync");
                          off += n;
                        }
                        return reader.Finish();
                      });
}

Status DeviceMemory::Load(const std::string& chunk_store, const std::string& manifest_path) {
  if (state_ != ShimState::kReleased)
    return Status::Error(Code::kFailedPrecondition, "load: the process is {}, not released", StateName(state_));
  auto t0 = Clock::now();
  GPUSNAP_ASSIGN_OR_RETURN(std::string bytes, ReadFile(manifest_path));
  GPUSNAP_ASSIGN_OR_RETURN(ChunkManifest manifest, DecodeChunkManifest(bytes, manifest_path));
  std::vector<TrackedAllocation> allocs;
  {
    std::lock_guard lock(mu_);
    allocs = registry_.All();
  }
  std::vector<TrackedAllocation> released;
  for (const TrackedAllocation& a : allocs)
    if (a.released) released.push_back(a);
  GPUSNAP_ASSIGN_OR_RETURN(std::vector<TrackedAllocation> objects, ObjectRanges(/*released=*/true));
  GPUSNAP_RETURN_IF_ERROR(MapAll(released).Wrap("load"));
  GPUSNAP_RETURN_IF_ERROR(MakeObjects().Wrap("load"));
  released.insert(released.end(), objects.begin(), objects.end());
  double map_s = SecondsSince(t0);
  GPUSNAP_RETURN_IF_ERROR(Fill(chunk_store, released, manifest).Wrap("load"));
  state_ = ShimState::kQuiesced;
  uint64_t total = 0;
  for (const TrackedAllocation& a : released) total += a.size;
  double s = SecondsSince(t0);
  last_ = {{"load_s", s}, {"map_s", map_s}, {"bytes", total}, {"gb_per_s", s > 0 ? total / s / 1e9 : 0}};
  return Status::Ok();
}

Status DeviceMemory::Resume() {
  if (state_ == ShimState::kReleased)
    return Status::Error(Code::kFailedPrecondition, "resume: the device memory is released; load it first");
  {
    std::lock_guard lock(mu_);
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
  {
    std::lock_guard lock(mu_);
    t = registry_.Totals();
  }
  nlohmann::json j{{"state", StateName(state_)},
                   {"allocations", t.allocations},
                   {"bytes", t.bytes},
                   {"released_bytes", t.released_bytes},
                   {"held_calls", gate_.held()},
                   {"last", last_}};
  // The application's own VMM objects count as allocations too.
  nlohmann::json sharing = DescribeSharing();
  j["allocations"] = t.allocations + sharing["objects"].get<uint64_t>();
  j["bytes"] = t.bytes + sharing["object_bytes"].get<uint64_t>();
  j["released_bytes"] = t.released_bytes + sharing["object_released_bytes"].get<uint64_t>();
  j.update(sharing);
  return j;
}

}  // namespace gpusnap::gpushare
