// The driver's own entry points, for the shim's own calls: resolved from
// libcuda.so.1 with the real dlsym, so they never pass through the hooks.
#pragma once

#include <string>

#include "gpushare/common/driver_table.h"
#include "gpusnap/status.h"

namespace gpusnap::gpushare::shim {

// Resolved once, on first use. REQUIRES: libcuda.so.1 loadable.
const RealDriver& Real();

// kExternal: "cuMemMap: CUDA_ERROR_INVALID_VALUE (1)".
Status DriverError(const char* fn, abi::CUresult rc);

// The libc dlsym, not ours.
void* RealDlsym(void* handle, const char* name);

}  // namespace gpusnap::gpushare::shim
