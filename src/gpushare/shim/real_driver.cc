#include "gpushare/shim/real_driver.h"

#include <dlfcn.h>

#include <fmt/format.h>

namespace gpusnap::gpushare {

void* RealDlsym(void* handle, const char* name) {
  using DlsymFn = void* (*)(void*, const char*);
  // dlvsym is not hooked; asking for dlsym by version skips our own definition.
  static DlsymFn real = [] {
    void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    return reinterpret_cast<DlsymFn>(p);
  }();
  return real ? real(handle, name) : nullptr;
}

namespace {

template <typename Fn>
void Resolve(void* lib, const char* name, Fn& out, std::string& missing) {
  out = reinterpret_cast<Fn>(lib ? RealDlsym(lib, name) : nullptr);
  if (out == nullptr && missing.empty()) missing = name;
}

}  // namespace

const RealDriver& Real() {
  static const RealDriver* driver = [] {
    auto* d = new RealDriver();
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    Resolve(lib, "cuGetErrorName", d->get_error_name, d->missing);
    Resolve(lib, "cuCtxGetCurrent", d->ctx_get_current, d->missing);
    Resolve(lib, "cuCtxSetCurrent", d->ctx_set_current, d->missing);
    Resolve(lib, "cuCtxGetDevice", d->ctx_get_device, d->missing);
    Resolve(lib, "cuCtxSynchronize", d->ctx_synchronize, d->missing);
    Resolve(lib, "cuMemAlloc_v2", d->mem_alloc, d->missing);
    Resolve(lib, "cuMemFree_v2", d->mem_free, d->missing);
    Resolve(lib, "cuMemAddressReserve", d->address_reserve, d->missing);
    Resolve(lib, "cuMemAddressFree", d->address_free, d->missing);
    Resolve(lib, "cuMemCreate", d->mem_create, d->missing);
    Resolve(lib, "cuMemRelease", d->mem_release, d->missing);
    Resolve(lib, "cuMemMap", d->mem_map, d->missing);
    Resolve(lib, "cuMemUnmap", d->mem_unmap, d->missing);
    Resolve(lib, "cuMemSetAccess", d->mem_set_access, d->missing);
    Resolve(lib, "cuMemGetAllocationGranularity", d->granularity, d->missing);
    Resolve(lib, "cuMemcpyDtoHAsync_v2", d->copy_dtoh_async, d->missing);
    Resolve(lib, "cuMemcpyHtoDAsync_v2", d->copy_htod_async, d->missing);
    Resolve(lib, "cuMemsetD8Async", d->memset_d8_async, d->missing);
    Resolve(lib, "cuStreamCreate", d->stream_create, d->missing);
    Resolve(lib, "cuStreamDestroy_v2", d->stream_destroy, d->missing);
    Resolve(lib, "cuStreamSynchronize", d->stream_synchronize, d->missing);
    Resolve(lib, "cuMemHostAlloc", d->host_alloc, d->missing);
    Resolve(lib, "cuMemFreeHost", d->free_host, d->missing);
    Resolve(lib, "cuMemExportToShareableHandle", d->mem_export, d->missing);
    Resolve(lib, "cuMemImportFromShareableHandle", d->mem_import, d->missing);
    Resolve(lib, "cuMemRetainAllocationHandle", d->mem_retain, d->missing);
    Resolve(lib, "cuMemGetAllocationPropertiesFromHandle", d->mem_properties, d->missing);
    if (lib == nullptr) d->missing = std::string("libcuda.so.1 (") + dlerror() + ")";
    return d;
  }();
  return *driver;
}

Status DriverError(const char* fn, abi::CUresult rc) {
  return Status::Error(Code::kExternal, "{}", Real().Describe(fn, rc));
}

std::string RealDriver::Describe(const char* fn, abi::CUresult rc) const {
  const char* name = nullptr;
  if (get_error_name == nullptr || get_error_name(rc, &name) != abi::CUDA_SUCCESS || name == nullptr)
    name = "CUDA_ERROR";
  return fmt::format("{}: {} ({})", fn, name, rc);
}

}  // namespace gpusnap::gpushare
