#include "gpushare/common/driver_table.h"

#include <fmt/format.h>

namespace gpusnap::gpushare {
namespace {

template <typename Fn>
void Resolve(void* lib, void* (*lookup)(void*, const char*), const char* name, Fn& out, std::string& missing) {
  out = reinterpret_cast<Fn>(lib ? lookup(lib, name) : nullptr);
  if (out == nullptr && missing.empty()) missing = name;
}

}  // namespace

RealDriver ResolveRealDriver(void* lib, void* (*lookup)(void*, const char*)) {
  RealDriver d;
  std::string& m = d.missing;
  Resolve(lib, lookup, "cuGetErrorName", d.get_error_name, m);
  Resolve(lib, lookup, "cuDeviceGet", d.device_get, m);
  Resolve(lib, lookup, "cuDeviceGetUuid_v2", d.device_get_uuid, m);
  Resolve(lib, lookup, "cuDevicePrimaryCtxRetain", d.primary_ctx_retain, m);
  Resolve(lib, lookup, "cuDevicePrimaryCtxRelease_v2", d.primary_ctx_release, m);
  Resolve(lib, lookup, "cuCtxGetCurrent", d.ctx_get_current, m);
  Resolve(lib, lookup, "cuCtxSetCurrent", d.ctx_set_current, m);
  Resolve(lib, lookup, "cuCtxGetDevice", d.ctx_get_device, m);
  Resolve(lib, lookup, "cuCtxSynchronize", d.ctx_synchronize, m);
  Resolve(lib, lookup, "cuMemAlloc_v2", d.mem_alloc, m);
  Resolve(lib, lookup, "cuMemFree_v2", d.mem_free, m);
  Resolve(lib, lookup, "cuMemAddressReserve", d.address_reserve, m);
  Resolve(lib, lookup, "cuMemAddressFree", d.address_free, m);
  Resolve(lib, lookup, "cuMemCreate", d.mem_create, m);
  Resolve(lib, lookup, "cuMemRelease", d.mem_release, m);
  Resolve(lib, lookup, "cuMemMap", d.mem_map, m);
  Resolve(lib, lookup, "cuMemUnmap", d.mem_unmap, m);
  Resolve(lib, lookup, "cuMemSetAccess", d.mem_set_access, m);
  Resolve(lib, lookup, "cuMemGetAllocationGranularity", d.granularity, m);
  Resolve(lib, lookup, "cuMemcpyDtoHAsync_v2", d.copy_dtoh_async, m);
  Resolve(lib, lookup, "cuMemcpyHtoDAsync_v2", d.copy_htod_async, m);
  Resolve(lib, lookup, "cuMemsetD8Async", d.memset_d8_async, m);
  Resolve(lib, lookup, "cuStreamCreate", d.stream_create, m);
  Resolve(lib, lookup, "cuStreamDestroy_v2", d.stream_destroy, m);
  Resolve(lib, lookup, "cuStreamSynchronize", d.stream_synchronize, m);
  Resolve(lib, lookup, "cuMemHostAlloc", d.host_alloc, m);
  Resolve(lib, lookup, "cuMemFreeHost", d.free_host, m);
  Resolve(lib, lookup, "cuMemExportToShareableHandle", d.mem_export, m);
  Resolve(lib, lookup, "cuMemImportFromShareableHandle", d.mem_import, m);
  Resolve(lib, lookup, "cuMemRetainAllocationHandle", d.mem_retain, m);
  Resolve(lib, lookup, "cuMemGetAllocationPropertiesFromHandle", d.mem_properties, m);
  Resolve(lib, lookup, "cuModuleLoadData", d.module_load_data, m);
  Resolve(lib, lookup, "cuModuleGetFunction", d.module_get_function, m);
  Resolve(lib, lookup, "cuModuleUnload", d.module_unload, m);
  Resolve(lib, lookup, "cuLaunchKernel", d.launch_kernel, m);
  return d;
}

std::string RealDriver::Describe(const char* fn, abi::CUresult rc) const {
  const char* name = nullptr;
  if (get_error_name == nullptr || get_error_name(rc, &name) != abi::CUDA_SUCCESS || name == nullptr)
    name = "CUDA_ERROR";
  return fmt::format("{}: {} ({})", fn, name, rc);
}

Status RealDriver::Error(const char* fn, abi::CUresult rc) const {
  return Status::Error(Code::kExternal, "{}", Describe(fn, rc));
}

}  // namespace gpusnap::gpushare
