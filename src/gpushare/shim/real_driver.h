// The driver's own entry points, for the shim's own calls: resolved from
// libcuda.so.1 with the real dlsym, so they never pass through the hooks.
#pragma once

#include <string>

#include "gpushare/common/driver_table.h"

namespace gpusnap::gpushare::shim {

// Resolved once, on first use. REQUIRES: libcuda.so.1 loadable.
const RealDriver& Real();

// The libc dlsym, not ours.
void* RealDlsym(void* handle, const char* name);

}  // namespace gpusnap::gpushare::shim
