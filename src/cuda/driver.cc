#include "cuda/driver.h"

#include <dlfcn.h>
#include <link.h>

#include <utility>
#include <vector>

#include "cuda/names.h"

namespace gpusnap::cuda {

std::string VersionText(int version) {
  return fmt::format("{}.{} ({})", version / 1000, version % 1000 / 10, version);
}

namespace {

template <typename Fn>
bool Resolve(void* handle, const char* name, Fn& slot) {
  slot = reinterpret_cast<Fn>(::dlsym(handle, name));
  return slot != nullptr;
}

// The symbol table: what gpusnap needs from the driver, required or optional.
// Returns the names of the required symbols that are missing.
std::vector<std::string> ResolveTable(void* handle, DriverApi& api) {
  std::vector<std::string> missing;
  auto required = [&](const char* name, auto& slot) {
    if (!Resolve(handle, name, slot)) missing.emplace_back(name);
  };
  auto optional = [&](const char* name, auto& slot) { (void)Resolve(handle, name, slot); };
  required("cuInit", api.cuInit);
  required("cuDriverGetVersion", api.cuDriverGetVersion);
  optional("cuGetErrorName", api.cuGetErrorName);
  optional("cuGetErrorString", api.cuGetErrorString);
  required("cuDeviceGetCount", api.cuDeviceGetCount);
  required("cuDeviceGet", api.cuDeviceGet);
  required("cuDeviceGetName", api.cuDeviceGetName);
  optional("cuDeviceGetUuid_v2", api.cuDeviceGetUuid);
  if (api.cuDeviceGetUuid == nullptr) required("cuDeviceGetUuid", api.cuDeviceGetUuid);
  required("cuDeviceTotalMem_v2", api.cuDeviceTotalMem);
  required("cuDeviceGetAttribute", api.cuDeviceGetAttribute);
  required("cuCheckpointProcessGetState", api.cuCheckpointProcessGetState);
  required("cuCheckpointProcessGetRestoreThreadId", api.cuCheckpointProcessGetRestoreThreadId);
  required("cuCheckpointProcessLock", api.cuCheckpointProcessLock);
  required("cuCheckpointProcessCheckpoint", api.cuCheckpointProcessCheckpoint);
  required("cuCheckpointProcessRestore", api.cuCheckpointProcessRestore);
  required("cuCheckpointProcessUnlock", api.cuCheckpointProcessUnlock);
  optional("cuDevicePrimaryCtxRetain", api.cuDevicePrimaryCtxRetain);
  optional("cuDevicePrimaryCtxRelease_v2", api.cuDevicePrimaryCtxRelease);
  optional("cuCtxSetCurrent", api.cuCtxSetCurrent);
  optional("cuMemGetInfo_v2", api.cuMemGetInfo);
  return missing;
}

std::string LoadedPath(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && *map->l_name != 0)
    return map->l_name;
  return fallback;
}

}  // namespace

Result<Driver> Driver::Load(const LoadOptions& options) {
  // RTLD_NODELETE: libcuda starts threads in cuInit and is not safe to unmap;
  // dlclose only drops our reference.
  void* handle = ::dlopen(options.library.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    return Status::Error(Code::kNotFound, "cannot load the CUDA driver `{}`: {} (is the NVIDIA driver installed?)",
                         options.library, why != nullptr ? why : "unknown dlopen error");
  }
  Driver d;
  d.handle_ = handle;
  d.path_ = LoadedPath(handle, options.library);

  // The version first: an old driver lacks the checkpoint symbols, and saying
  // "too old" is more useful than naming the first symbol it lacks.
  if (!Resolve(handle, "cuDriverGetVersion", d.api_.cuDriverGetVersion))
    return Status::Error(Code::kNotSupported, "`{}` lacks cuDriverGetVersion (required): not a CUDA driver", d.path_);
  if (abi::CUresult rc = d.api_.cuDriverGetVersion(&d.version_); rc != abi::CUDA_SUCCESS)
    return Status::Error(Code::kExternal, "cuDriverGetVersion: {}", FormatResult(rc, nullptr));
  if (d.version_ < abi::kCheckpointApiVersion)
    return Status::Error(Code::kNotSupported,
                         "CUDA driver {} is too old: the checkpoint API needs {} (driver r570) or newer",
                         VersionText(d.version_), VersionText(abi::kCheckpointApiVersion));

  std::vector<std::string> missing = ResolveTable(handle, d.api_);
  if (!missing.empty())
    return Status::Error(Code::kNotSupported, "`{}` (CUDA driver {}) lacks {} (required)", d.path_,
                         VersionText(d.version_), fmt::join(missing, ", "));

  if (abi::CUresult rc = d.api_.cuInit(0); rc != abi::CUDA_SUCCESS)
    return Status::Error(Code::kExternal, "cuInit: {}", d.ErrorName(rc));
  return d;
}

Driver::Driver(Driver&& other) noexcept
    : handle_(std::exchange(other.handle_, nullptr)),
      api_(std::exchange(other.api_, {})),
      version_(other.version_),
      path_(std::move(other.path_)) {}

Driver& Driver::operator=(Driver&& other) noexcept {
  if (this != &other) {
    if (handle_ != nullptr) ::dlclose(handle_);
    handle_ = std::exchange(other.handle_, nullptr);
    api_ = std::exchange(other.api_, {});
    version_ = other.version_;
    path_ = std::move(other.path_);
  }
  return *this;
}

Driver::~Driver() {
  if (handle_ != nullptr) ::dlclose(handle_);
}

std::string Driver::ErrorName(abi::CUresult result) const {
  const char* name = nullptr;
  if (api_.cuGetErrorName != nullptr && api_.cuGetErrorName(result, &name) != abi::CUDA_SUCCESS) name = nullptr;
  return FormatResult(result, name);
}

}  // namespace gpusnap::cuda
