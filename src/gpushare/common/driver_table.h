// The driver entry points that move device memory to and from the chunk
// store, as one table: the shim resolves it past its own hooks (the real
// dlsym), gpusnap from the libcuda it loaded, and the chunk copies
// (chunk_copy.h) run the same on either.
#pragma once

#include <string>

#include "cuda/driver_abi.h"
#include "gpusnap/status.h"

namespace gpusnap::gpushare {

namespace abi = gpusnap::cuda::abi;

struct RealDriver {
  abi::PFN_cuGetErrorName get_error_name = nullptr;
  abi::PFN_cuDeviceGet device_get = nullptr;
  abi::PFN_cuDeviceGetUuid device_get_uuid = nullptr;  // _v2
  abi::PFN_cuDevicePrimaryCtxRetain primary_ctx_retain = nullptr;
  abi::PFN_cuDevicePrimaryCtxRelease primary_ctx_release = nullptr;  // _v2
  abi::PFN_cuCtxGetCurrent ctx_get_current = nullptr;
  abi::PFN_cuCtxSetCurrent ctx_set_current = nullptr;
  abi::PFN_cuCtxGetDevice ctx_get_device = nullptr;
  abi::PFN_cuCtxSynchronize ctx_synchronize = nullptr;
  abi::PFN_cuMemAlloc mem_alloc = nullptr;
  abi::PFN_cuMemFree mem_free = nullptr;
  abi::PFN_cuMemAddressReserve address_reserve = nullptr;
  abi::PFN_cuMemAddressFree address_free = nullptr;
  abi::PFN_cuMemCreate mem_create = nullptr;
  abi::PFN_cuMemRelease mem_release = nullptr;
  abi::PFN_cuMemMap mem_map = nullptr;
  abi::PFN_cuMemUnmap mem_unmap = nullptr;
  abi::PFN_cuMemSetAccess mem_set_access = nullptr;
  abi::PFN_cuMemGetAllocationGranularity granularity = nullptr;
  abi::PFN_cuMemcpyDtoHAsync copy_dtoh_async = nullptr;
  abi::PFN_cuMemcpyHtoDAsync copy_htod_async = nullptr;
  abi::PFN_cuMemsetD8Async memset_d8_async = nullptr;
  abi::PFN_cuStreamCreate stream_create = nullptr;
  abi::PFN_cuStreamDestroy stream_destroy = nullptr;
  abi::PFN_cuStreamSynchronize stream_synchronize = nullptr;
  abi::PFN_cuMemHostAlloc host_alloc = nullptr;
  abi::PFN_cuMemFreeHost free_host = nullptr;
  abi::PFN_cuMemExportToShareableHandle mem_export = nullptr;
  abi::PFN_cuMemImportFromShareableHandle mem_import = nullptr;
  abi::PFN_cuMemRetainAllocationHandle mem_retain = nullptr;
  abi::PFN_cuMemGetAllocationPropertiesFromHandle mem_properties = nullptr;
  // The shim's own kernel (fingerprint_kernel.h).
  abi::PFN_cuModuleLoadData module_load_data = nullptr;
  abi::PFN_cuModuleGetFunction module_get_function = nullptr;
  abi::PFN_cuModuleUnload module_unload = nullptr;
  abi::PFN_cuLaunchKernel launch_kernel = nullptr;
  std::string missing;  // the first entry point not found, empty when all were

  // "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)"
  std::string Describe(const char* fn, abi::CUresult rc) const;
  // kExternal, with Describe's text.
  Status Error(const char* fn, abi::CUresult rc) const;
};

// In a function returning Status or Result: returns `d`'s error naming `name`
// when the driver call `call` fails.
#define GPUSNAP_RETURN_IF_CU_ERROR(d, call, name)          \
  do {                                                     \
    ::gpusnap::cuda::abi::CUresult _rc = (call);           \
    if (_rc != ::gpusnap::cuda::abi::CUDA_SUCCESS) return (d).Error(name, _rc); \
  } while (0)

// Every entry point of the table from `lib` (a dlopen handle of libcuda),
// looked up with `lookup`; `missing` names the first absent one.
RealDriver ResolveRealDriver(void* lib, void* (*lookup)(void*, const char*));

}  // namespace gpusnap::gpushare
