// Interposition: where the application, cudart, NCCL or PyTorch obtain a
// driver entry point (an exported symbol, dlsym on libcuda, cuGetProcAddress),
// the shim hands out its own function for the ones it hooks and the driver's
// for the rest.
//
// Hooked: cuInit (starts the control thread), cuGetProcAddress (so later
// lookups pass here too), cuMemAlloc/cuMemFree (device memory on the VMM path,
// see device_memory.h), the application's own VMM calls and CUDA IPC
// (shared_memory.cc), and every call that submits GPU work (below), which
// passes the work gate. The same name may resolve to several driver functions
// (per-thread default stream variants, ABI versions), so each distinct driver
// function gets its own wrapper from a pool per signature.
//
// Exported for the workload itself: gpusnap_gpushare_mark_scratch,
// _unmark_scratch and _loads (gpusnap/gpushare_scratch.h).
#include <dlfcn.h>
#include <string.h>

#include <array>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include "gpushare/shim/control_server.h"
#include "gpushare/shim/device_memory.h"
#include "gpushare/shim/real_driver.h"
#include "gpusnap/gpushare_scratch.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::gpushare::shim {
namespace {

using abi::CUdeviceptr;
using abi::CUresult;
using abi::CUstream;
using cuuint32 = unsigned int;
using cuuint64 = unsigned long long;
struct CUctx;

// --- gated wrappers -----------------------------------------------------------

constexpr int kSlotsPerSignature = 8;

template <typename Sig, int Slot>
struct GatedCall;
template <typename... Args, int Slot>
struct GatedCall<CUresult(Args...), Slot> {
  static inline CUresult (*real)(Args...) = nullptr;
  static CUresult Call(Args... args) {
    WorkGate::Scope scope(DeviceMemory::Get().gate());
    return real(args...);
  }
};

struct SlotPool {
  std::array<void**, kSlotsPerSignature> reals{};
  std::array<void*, kSlotsPerSignature> wrappers{};
  int used = 0;
};

template <typename Sig, int... I>
SlotPool MakePool(std::integer_sequence<int, I...>) {
  return SlotPool{{reinterpret_cast<void**>(&GatedCall<Sig, I>::real)...},
                  {reinterpret_cast<void*>(&GatedCall<Sig, I>::Call)...},
                  0};
}

Mutex g_wrap_mu;  // and each WrapGated's pool
// Driver function -> its wrapper.
std::map<void*, void*>& Wrapped() REQUIRES(g_wrap_mu) {
  static auto* m = new std::map<void*, void*>();
  return *m;
}

template <typename Sig>
void* WrapGated(void* real) {
  static SlotPool pool = MakePool<Sig>(std::make_integer_sequence<int, kSlotsPerSignature>());
  MutexLock lock(g_wrap_mu);
  auto& wrapped = Wrapped();
  if (auto it = wrapped.find(real); it != wrapped.end()) return it->second;
  if (pool.used == kSlotsPerSignature) {
    std::fprintf(stderr, "gpusnap-gpushare: no wrapper slot left for a driver function; it runs ungated\n");
    return real;
  }
  *pool.reals[pool.used] = real;
  void* wrapper = pool.wrappers[pool.used++];
  wrapped[real] = wrapper;
  return wrapper;
}

using LaunchKernel = CUresult(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                              void**, void**);
using LaunchKernelEx = CUresult(const void*, void*, void**, void**);
using LaunchCooperative = CUresult(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                   CUstream, void**);
using GraphLaunch = CUresult(void*, CUstream);
using CopyDD = CUresult(CUdeviceptr, CUdeviceptr, size_t);
using CopyDDAsync = CUresult(CUdeviceptr, CUdeviceptr, size_t, CUstream);
using CopyHD = CUresult(CUdeviceptr, const void*, size_t);
using CopyHDAsync = CUresult(CUdeviceptr, const void*, size_t, CUstream);
using CopyDH = CUresult(void*, CUdeviceptr, size_t);
using CopyDHAsync = CUresult(void*, CUdeviceptr, size_t, CUstream);
using CopyDesc = CUresult(const void*);
using CopyDescAsync = CUresult(const void*, CUstream);
using CopyPeer = CUresult(CUdeviceptr, CUctx*, CUdeviceptr, CUctx*, size_t);
using CopyPeerAsync = CUresult(CUdeviceptr, CUctx*, CUdeviceptr, CUctx*, size_t, CUstream);
using Set8 = CUresult(CUdeviceptr, unsigned char, size_t);
using Set8Async = CUresult(CUdeviceptr, unsigned char, size_t, CUstream);
using Set16 = CUresult(CUdeviceptr, unsigned short, size_t);
using Set16Async = CUresult(CUdeviceptr, unsigned short, size_t, CUstream);
using Set32 = CUresult(CUdeviceptr, unsigned int, size_t);
using Set32Async = CUresult(CUdeviceptr, unsigned int, size_t, CUstream);
using StreamValue32 = CUresult(CUstream, CUdeviceptr, cuuint32, unsigned);
using StreamValue64 = CUresult(CUstream, CUdeviceptr, cuuint64, unsigned);

// --- the hooks with behaviour of their own ------------------------------------

CUresult (*g_real_init)(unsigned) = nullptr;
abi::PFN_cuGetProcAddress_v2 g_real_get_proc_v2 = nullptr;
abi::PFN_cuGetProcAddress_v1 g_real_get_proc_v1 = nullptr;

CUresult HookInit(unsigned flags) {
  CUresult rc = g_real_init(flags);
  if (rc == abi::CUDA_SUCCESS) StartControlServer();
  return rc;
}
CUresult HookMemAlloc(CUdeviceptr* ptr, size_t bytes) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  return DeviceMemory::Get().Allocate(ptr, bytes);
}
CUresult HookMemFree(CUdeviceptr ptr) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  return DeviceMemory::Get().Free(ptr);
}
// The driver's VMM calls: objects behind the shim's ids (shared_memory.cc).
using abi::CUmemGenericAllocationHandle;
CUresult HookMemCreate(CUmemGenericAllocationHandle* handle, size_t size, const abi::CUmemAllocationProp* prop,
                       unsigned long long flags) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  return DeviceMemory::Get().Create(handle, size, prop, flags);
}
CUresult HookMemRelease(CUmemGenericAllocationHandle handle) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  return DeviceMemory::Get().ReleaseHandle(handle);
}
CUresult HookMemMap(CUdeviceptr va, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                    unsigned long long flags) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  return DeviceMemory::Get().Map(va, size, offset, handle, flags);
}
CUresult HookMemUnmap(CUdeviceptr va, size_t size) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  return DeviceMemory::Get().Unmap(va, size);
}
CUresult HookMemSetAccess(CUdeviceptr va, size_t size, const abi::CUmemAccessDesc* desc, size_t count) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  return DeviceMemory::Get().SetAccess(va, size, desc, count);
}
CUresult HookMemExport(void* shareable, CUmemGenericAllocationHandle handle, abi::CUmemAllocationHandleType type,
                       unsigned long long flags) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  return DeviceMemory::Get().Export(shareable, handle, type, flags);
}
CUresult HookMemImport(CUmemGenericAllocationHandle* handle, void* os_handle, abi::CUmemAllocationHandleType type) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  return DeviceMemory::Get().Import(handle, os_handle, type);
}
CUresult HookMemRetain(CUmemGenericAllocationHandle* handle, void* addr) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  return DeviceMemory::Get().Retain(handle, addr);
}
CUresult HookMemProperties(abi::CUmemAllocationProp* prop, CUmemGenericAllocationHandle handle) {
  return DeviceMemory::Get().PropertiesOf(prop, handle);
}

// CUDA IPC: gpushare memory gets handles of the shim's; the rest the driver's.
CUresult (*g_real_ipc_get)(abi::CUipcMemHandle*, CUdeviceptr) = nullptr;
CUresult (*g_real_ipc_open)(CUdeviceptr*, abi::CUipcMemHandle, unsigned) = nullptr;
CUresult (*g_real_ipc_close)(CUdeviceptr) = nullptr;
CUresult HookIpcGet(abi::CUipcMemHandle* out, CUdeviceptr ptr) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  if (auto rc = DeviceMemory::Get().IpcGet(out, ptr)) return *rc;
  return g_real_ipc_get(out, ptr);
}
CUresult HookIpcOpen(CUdeviceptr* ptr, abi::CUipcMemHandle handle, unsigned flags) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  if (auto rc = DeviceMemory::Get().IpcOpen(ptr, handle)) return *rc;
  return g_real_ipc_open(ptr, handle, flags);
}
CUresult HookIpcClose(CUdeviceptr ptr) {
  WorkGate::Scope scope(DeviceMemory::Get().gate());
  if (auto rc = DeviceMemory::Get().IpcClose(ptr)) return *rc;
  return g_real_ipc_close(ptr);
}

void* LibcudaSymbol(const char* name) {
  static void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  return lib ? RealDlsym(lib, name) : nullptr;
}

void* HookFor(const char* name, void* real);
CUresult HookGetProcAddressV2(const char* symbol, void** pfn, int version, cuuint64 flags,
                              abi::CUdriverProcAddressQueryResult* status) {
  CUresult rc = g_real_get_proc_v2(symbol, pfn, version, flags, status);
  if (rc == abi::CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) *pfn = HookFor(symbol, *pfn);
  return rc;
}
CUresult HookGetProcAddressV1(const char* symbol, void** pfn, int version, cuuint64 flags) {
  CUresult rc = g_real_get_proc_v1(symbol, pfn, version, flags);
  if (rc == abi::CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) *pfn = HookFor(symbol, *pfn);
  return rc;
}

// "cuMemcpyHtoDAsync_v2_ptsz" -> "cuMemcpyHtoDAsync"
std::string_view BaseName(std::string_view name) {
  for (std::string_view suffix : {"_ptsz", "_ptds"}) {
    if (name.ends_with(suffix)) name.remove_suffix(suffix.size());
  }
  for (std::string_view suffix : {"_v2", "_v3"}) {
    if (name.ends_with(suffix)) name.remove_suffix(suffix.size());
  }
  return name;
}

template <typename Fn>
void* Special(Fn& slot, void* real, void* hook) {
  // The first driver function seen for the name is the one the hooks call.
  if (slot == nullptr) slot = reinterpret_cast<Fn>(real);
  return hook;
}

struct GatedName {
  const char* name;
  void* (*wrap)(void*);
};
constexpr GatedName kGated[] = {
    {"cuLaunchKernel", &WrapGated<LaunchKernel>},
    {"cuLaunchKernelEx", &WrapGated<LaunchKernelEx>},
    {"cuLaunchCooperativeKernel", &WrapGated<LaunchCooperative>},
    {"cuGraphLaunch", &WrapGated<GraphLaunch>},
    {"cuMemcpy", &WrapGated<CopyDD>},
    {"cuMemcpyAsync", &WrapGated<CopyDDAsync>},
    {"cuMemcpyDtoD", &WrapGated<CopyDD>},
    {"cuMemcpyDtoDAsync", &WrapGated<CopyDDAsync>},
    {"cuMemcpyHtoD", &WrapGated<CopyHD>},
    {"cuMemcpyHtoDAsync", &WrapGated<CopyHDAsync>},
    {"cuMemcpyDtoH", &WrapGated<CopyDH>},
    {"cuMemcpyDtoHAsync", &WrapGated<CopyDHAsync>},
    {"cuMemcpy2D", &WrapGated<CopyDesc>},
    {"cuMemcpy2DUnaligned", &WrapGated<CopyDesc>},
    {"cuMemcpy2DAsync", &WrapGated<CopyDescAsync>},
    {"cuMemcpy3D", &WrapGated<CopyDesc>},
    {"cuMemcpy3DAsync", &WrapGated<CopyDescAsync>},
    {"cuMemcpyPeer", &WrapGated<CopyPeer>},
    {"cuMemcpyPeerAsync", &WrapGated<CopyPeerAsync>},
    {"cuMemsetD8", &WrapGated<Set8>},
    {"cuMemsetD8Async", &WrapGated<Set8Async>},
    {"cuMemsetD16", &WrapGated<Set16>},
    {"cuMemsetD16Async", &WrapGated<Set16Async>},
    {"cuMemsetD32", &WrapGated<Set32>},
    {"cuMemsetD32Async", &WrapGated<Set32Async>},
    {"cuStreamWaitValue32", &WrapGated<StreamValue32>},
    {"cuStreamWriteValue32", &WrapGated<StreamValue32>},
    {"cuStreamWaitValue64", &WrapGated<StreamValue64>},
    {"cuStreamWriteValue64", &WrapGated<StreamValue64>},
};

// Whether `p` is in this library: a driver whose own symbol references are
// interposable hands our exported functions back as "the driver's".
bool IsInShim(void* p) {
  Dl_info mine{}, theirs{};
  static int anchor;
  return dladdr(&anchor, &mine) != 0 && dladdr(p, &theirs) != 0 && mine.dli_fbase == theirs.dli_fbase;
}

void* HookFor(const char* name, void* real) {
  if (name == nullptr || real == nullptr || name[0] != 'c' || name[1] != 'u') return real;
  if (IsInShim(real)) {
    // One of our exports: the driver's function of the same symbol.
    Dl_info info{};
    const char* symbol = dladdr(real, &info) != 0 && info.dli_sname != nullptr ? info.dli_sname : name;
    real = LibcudaSymbol(symbol);
    if (real == nullptr || IsInShim(real)) return nullptr;
  }
  std::string_view full(name);
  std::string_view base = BaseName(full);
  if (full == "cuInit") return Special(g_real_init, real, reinterpret_cast<void*>(&HookInit));
  if (full == "cuGetProcAddress_v2" || (full == "cuGetProcAddress" && g_real_get_proc_v2 != nullptr &&
                                        real == reinterpret_cast<void*>(g_real_get_proc_v2)))
    return Special(g_real_get_proc_v2, real, reinterpret_cast<void*>(&HookGetProcAddressV2));
  if (full == "cuGetProcAddress") return Special(g_real_get_proc_v1, real, reinterpret_cast<void*>(&HookGetProcAddressV1));
  // Only the 64-bit ABI (_v2) of the memory calls; a v1 caller gets the driver's.
  if (full == "cuMemAlloc_v2" || (full == "cuMemAlloc" && real == LibcudaSymbol("cuMemAlloc_v2")))
    return reinterpret_cast<void*>(&HookMemAlloc);
  if (full == "cuMemFree_v2" || (full == "cuMemFree" && real == LibcudaSymbol("cuMemFree_v2")))
    return reinterpret_cast<void*>(&HookMemFree);
  struct Behaviour {
    const char* name;
    void* hook;
  };
  static const Behaviour kVmm[] = {
      {"cuMemCreate", reinterpret_cast<void*>(&HookMemCreate)},
      {"cuMemRelease", reinterpret_cast<void*>(&HookMemRelease)},
      {"cuMemMap", reinterpret_cast<void*>(&HookMemMap)},
      {"cuMemUnmap", reinterpret_cast<void*>(&HookMemUnmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&HookMemSetAccess)},
      {"cuMemExportToShareableHandle", reinterpret_cast<void*>(&HookMemExport)},
      {"cuMemImportFromShareableHandle", reinterpret_cast<void*>(&HookMemImport)},
      {"cuMemRetainAllocationHandle", reinterpret_cast<void*>(&HookMemRetain)},
      {"cuMemGetAllocationPropertiesFromHandle", reinterpret_cast<void*>(&HookMemProperties)},
  };
  for (const Behaviour& b : kVmm) {
    if (full == b.name) return b.hook;
  }
  if (base == "cuIpcGetMemHandle") return Special(g_real_ipc_get, real, reinterpret_cast<void*>(&HookIpcGet));
  if (base == "cuIpcOpenMemHandle") return Special(g_real_ipc_open, real, reinterpret_cast<void*>(&HookIpcOpen));
  if (base == "cuIpcCloseMemHandle") return Special(g_real_ipc_close, real, reinterpret_cast<void*>(&HookIpcClose));
  for (const GatedName& g : kGated) {
    if (base == g.name) return g.wrap(real);
  }
  return real;
}

}  // namespace
}  // namespace gpusnap::gpushare::shim

using gpusnap::gpushare::shim::HookFor;
using gpusnap::gpushare::shim::LibcudaSymbol;
using gpusnap::gpushare::shim::RealDlsym;
namespace abi = gpusnap::cuda::abi;

#define SHIM_EXPORT extern "C" __attribute__((visibility("default")))

// cudart and NCCL find the driver with dlopen + dlsym: hand them the hooks.
SHIM_EXPORT void* dlsym(void* handle, const char* name) { return HookFor(name, RealDlsym(handle, name)); }

// Programs linked against libcuda itself resolve these here first.
SHIM_EXPORT abi::CUresult cuInit(unsigned flags) {
  auto fn = reinterpret_cast<abi::CUresult (*)(unsigned)>(HookFor("cuInit", LibcudaSymbol("cuInit")));
  return fn ? fn(flags) : abi::CUDA_ERROR_NOT_INITIALIZED;
}
SHIM_EXPORT abi::CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, unsigned long long flags,
                                              abi::CUdriverProcAddressQueryResult* status) {
  auto fn = reinterpret_cast<abi::PFN_cuGetProcAddress_v2>(
      HookFor("cuGetProcAddress_v2", LibcudaSymbol("cuGetProcAddress_v2")));
  return fn ? fn(symbol, pfn, version, flags, status) : abi::CUDA_ERROR_NOT_INITIALIZED;
}
SHIM_EXPORT abi::CUresult cuMemAlloc_v2(abi::CUdeviceptr* ptr, size_t bytes) {
  auto fn = reinterpret_cast<abi::PFN_cuMemAlloc>(HookFor("cuMemAlloc_v2", LibcudaSymbol("cuMemAlloc_v2")));
  return fn ? fn(ptr, bytes) : abi::CUDA_ERROR_NOT_INITIALIZED;
}
SHIM_EXPORT abi::CUresult cuMemFree_v2(abi::CUdeviceptr ptr) {
  auto fn = reinterpret_cast<abi::PFN_cuMemFree>(HookFor("cuMemFree_v2", LibcudaSymbol("cuMemFree_v2")));
  return fn ? fn(ptr) : abi::CUDA_ERROR_NOT_INITIALIZED;
}

// The workload's own calls into the shim (gpusnap/gpushare_scratch.h).
SHIM_EXPORT int gpusnap_gpushare_mark_scratch(unsigned long long ptr, size_t bytes) {
  return gpusnap::gpushare::shim::DeviceMemory::Get().MarkScratch(ptr, bytes);
}
SHIM_EXPORT int gpusnap_gpushare_unmark_scratch(unsigned long long ptr, size_t bytes) {
  return gpusnap::gpushare::shim::DeviceMemory::Get().UnmarkScratch(ptr, bytes);
}
SHIM_EXPORT unsigned long long gpusnap_gpushare_loads(void) {
  return gpusnap::gpushare::shim::DeviceMemory::Get().Loads();
}
