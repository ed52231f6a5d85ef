#include "gpushare/shim/real_driver.h"

#include <dlfcn.h>

#include <fmt/format.h>

namespace gpusnap::gpushare::shim {

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

const RealDriver& Real() {
  static const RealDriver* driver = [] {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    auto* d = new RealDriver(ResolveRealDriver(lib, &RealDlsym));
    if (lib == nullptr) d->missing = std::string("libcuda.so.1 (") + dlerror() + ")";
    return d;
  }();
  return *driver;
}

}  // namespace gpusnap::gpushare::shim
