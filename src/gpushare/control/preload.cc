#include "gpushare/control/preload.h"

#include <dlfcn.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <thread>

#include "chunks/chunk_manifest.h"
#include "chunks/chunk_store.h"
#include "gpushare/common/chunk_copy.h"
#include "gpushare/control/tree.h"
#include "util/files.h"

namespace gpusnap::gpushare::control {
Result<PreloadedMemory> PreloadedMemory::Make(std::shared_ptr<cuda::GpuSession> session,
                                              const std::string& chunk_store,
                                              const std::vector<PreloadTarget>& targets,
                                              const PreloadDevice& device_for, unsigned threads,
                                              std::chrono::milliseconds arrival_wait,
                                              chunks::ChunkStore::Bringer bringer, PinnedTier* tier) {
  // The library the session loaded: the same handle, cuInit done.
  const std::string& libcuda = session->driver()->path();
  void* lib = ::dlopen(libcuda.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (lib == nullptr) return Status::Error(Code::kNotFound, "preload: loading `{}`: {}", libcuda, ::dlerror());
  PreloadedMemory out;
  // From the start, the making of device memory included: the tier's
  // pinning competes with it for the driver (pinned_tier.h).
  if (tier != nullptr) out.admissions_held_ = tier->HoldAdmissions();
  out.session_ = session;
  out.d_ = ResolveRealDriver(lib, &::dlsym);
  const RealDriver& d = out.d_;
  if (!d.missing.empty())
    return Status::Error(Code::kNotSupported, "preload: the driver `{}` has no {}", libcuda, d.missing);
  GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkStore opened, chunks::ChunkStore::Open(chunk_store));
  chunks::ChunkStore store = opened.WithArrivalWait(arrival_wait, std::move(bringer));

  std::vector<chunks::ChunkManifest> manifests;
  for (const PreloadTarget& t : targets) {
    GPUSNAP_ASSIGN_OR_RETURN(std::string bytes, ReadFile(t.manifest_path));
    GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkManifest m, chunks::DecodeChunkManifest(bytes, t.manifest_path));
    manifests.push_back(std::move(m));
  }
  auto since = [t = std::chrono::steady_clock::now()] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  std::map<int, abi::CUcontext> contexts;  // by this process's ordinal
  std::vector<DeviceRange> ranges;
  std::vector<const chunks::ChunkedAllocation*> sources;
  for (size_t t = 0; t < targets.size(); ++t) {
    for (const chunks::ChunkedAllocation& a : manifests[t].allocations) {
      if (a.origin != chunks::AllocationOrigin::kShim || a.size == 0) continue;
      std::optional<int> ordinal = device_for(a.device_uuid);
      if (!ordinal) continue;
      auto ctx = contexts.find(*ordinal);
      if (ctx == contexts.end()) {
        GPUSNAP_ASSIGN_OR_RETURN(abi::CUcontext c, session->Context(*ordinal));
        ctx = contexts.emplace(*ordinal, c).first;
      }
      GPUSNAP_RETURN_IF_CU_ERROR(d, d.ctx_set_current(ctx->second), "cuCtxSetCurrent");
      // As the shim makes it (device_memory.cc): exportable, so it can be
      // handed over, and exported again by the process for CUDA IPC.
      abi::CUmemAllocationProp prop{};
      prop.type = abi::CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.requestedHandleTypes = abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
      prop.location = {abi::CU_MEM_LOCATION_TYPE_DEVICE, *ordinal};
      Mapping m{0, a.size, 0};
      GPUSNAP_RETURN_IF_CU_ERROR(d, d.mem_create(&m.handle, a.size, &prop, 0), "cuMemCreate");
      if (abi::CUresult rc = d.address_reserve(&m.va, a.size, 0, 0, 0); rc != abi::CUDA_SUCCESS) {
        d.mem_release(m.handle);
        return d.Error("cuMemAddressReserve", rc);
      }
      abi::CUresult rc = d.mem_map(m.va, a.size, 0, m.handle, 0);
      abi::CUmemAccessDesc access{{abi::CU_MEM_LOCATION_TYPE_DEVICE, *ordinal}, abi::CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
      if (rc == abi::CUDA_SUCCESS) rc = d.mem_set_access(m.va, a.size, &access, 1);
      out.mappings_.push_back(m);  // from here the destructor undoes it
      if (rc != abi::CUDA_SUCCESS) return d.Error("cuMemMap", rc).Wrap(fmt::format("preload of {:#x}", a.va));
      int fd = -1;
      GPUSNAP_RETURN_IF_CU_ERROR(d, d.mem_export(&fd, m.handle, abi::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 "cuMemExportToShareableHandle");
      out.by_pid_[targets[t].ns_pid].push_back({a.va, a.size, UniqueFd(fd)});
      ranges.push_back({m.va, a.size, reinterpret_cast<uint64_t>(ctx->second)});
      sources.push_back(&a);
      out.bytes_ += a.size;
    }
  }
  out.map_seconds_ = since();
  std::optional<PinnedTier::Lease> lease;
  PinnedLookup pinned;
  if (tier != nullptr) {
    std::vector<chunks::ChunkRef> refs;
    for (const chunks::ChunkedAllocation* a : sources) refs.insert(refs.end(), a->chunks.begin(), a->chunks.end());
    lease.emplace(tier->Borrow(refs));
    pinned = [&lease](const chunks::ChunkRef& ref) { return lease->Find(ref); };
  }
  GPUSNAP_RETURN_IF_ERROR(FillFromChunks(d, store, ranges, sources, threads, pinned).Wrap("preload"));
  out.fill_seconds_ = since() - out.map_seconds_;
  if (lease) {
    out.pinned_hits_ = lease->hits();
    std::vector<chunks::ChunkRef> missed = lease->missed();
    out.pinned_misses_ = missed.size();
    lease.reset();  // the copies are done: the chunks it held may make room for these
    // Read from the store just now: recently used, kept for the next fill.
    tier->AdmitLater(chunk_store, std::move(missed));
  }
  return out;
}

PreloadedMemory::~PreloadedMemory() {
  for (const Mapping& m : mappings_) {
    d_.mem_unmap(m.va, m.size);
    d_.address_free(m.va, m.size);
    d_.mem_release(m.handle);
  }
}

unsigned PreloadThreadsAlone() { return std::max(kPreloadThreadsBesideCriu, std::thread::hardware_concurrency()); }

bool PreloadEnabled() {
  const char* enabled = std::getenv("GPUSNAP_GPUSHARE_PRELOAD");
  return enabled == nullptr || std::string_view(enabled) != "0";
}

PendingPreload StartPreload(std::shared_ptr<cuda::GpuSession> session, const std::string& chunk_store,
                            const std::string& manifest_dir, const std::vector<int>& ns_pids, PreloadDevice device_for,
                            std::chrono::milliseconds arrival_wait, chunks::ChunkStore::Bringer bringer,
                            unsigned default_threads, std::shared_ptr<PinnedTier> tier) {
  if (!PreloadEnabled()) return {};
  std::vector<PreloadTarget> targets;
  for (int ns_pid : ns_pids) targets.push_back({ns_pid, ManifestPath(manifest_dir, {0, ns_pid, ""})});
  unsigned threads = ThreadsFromEnv("GPUSNAP_GPUSHARE_PRELOAD_THREADS", default_threads);
  return Beside([session = std::move(session), chunk_store, targets, device_for = std::move(device_for), threads,
                 arrival_wait, bringer = std::move(bringer), tier = std::move(tier)] {
    return PreloadedMemory::Make(session, chunk_store, targets, device_for, threads, arrival_wait, bringer,
                                 tier.get());
  });
}

}  // namespace gpusnap::gpushare::control
