// The CUDA driver, loaded at run time with dlopen("libcuda.so.1") and never
// linked, so gpusnap runs and tests on machines without a GPU.
//
// One Driver per gpusnap process: create it once (Driver::Load) where the
// operation starts and pass it by reference to everything that talks to the
// GPU. Load calls cuInit(0) exactly once; nothing else does.
//
// Thread-safety: after Load a Driver is immutable; its entry points may be
// called from many threads at once (the driver API is thread-safe).
#pragma once

#include <string>

#include "cuda/driver_abi.h"
#include "gpusnap/status.h"

namespace gpusnap::cuda {

// The resolved entry points. Required ones are never null after Load;
// optional ones (marked) may be.
struct DriverApi {
  abi::PFN_cuInit cuInit = nullptr;
  abi::PFN_cuDriverGetVersion cuDriverGetVersion = nullptr;
  abi::PFN_cuGetErrorName cuGetErrorName = nullptr;      // optional
  abi::PFN_cuGetErrorString cuGetErrorString = nullptr;  // optional
  abi::PFN_cuDeviceGetCount cuDeviceGetCount = nullptr;
  abi::PFN_cuDeviceGet cuDeviceGet = nullptr;
  abi::PFN_cuDeviceGetName cuDeviceGetName = nullptr;
  abi::PFN_cuDeviceGetUuid cuDeviceGetUuid = nullptr;  // cuDeviceGetUuid_v2, else cuDeviceGetUuid
  abi::PFN_cuDeviceTotalMem cuDeviceTotalMem = nullptr;  // cuDeviceTotalMem_v2
  abi::PFN_cuDeviceGetAttribute cuDeviceGetAttribute = nullptr;
  abi::PFN_cuCheckpointProcessGetState cuCheckpointProcessGetState = nullptr;
  abi::PFN_cuCheckpointProcessGetRestoreThreadId cuCheckpointProcessGetRestoreThreadId = nullptr;
  abi::PFN_cuCheckpointProcessLock cuCheckpointProcessLock = nullptr;
  abi::PFN_cuCheckpointProcessCheckpoint cuCheckpointProcessCheckpoint = nullptr;
  abi::PFN_cuCheckpointProcessRestore cuCheckpointProcessRestore = nullptr;
  abi::PFN_cuCheckpointProcessUnlock cuCheckpointProcessUnlock = nullptr;
  // Optional: a GPU's free memory, measured in its primary context (gpus.h).
  abi::PFN_cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRetain = nullptr;
  abi::PFN_cuDevicePrimaryCtxRelease cuDevicePrimaryCtxRelease = nullptr;  // _v2
  abi::PFN_cuCtxSetCurrent cuCtxSetCurrent = nullptr;
  abi::PFN_cuMemGetInfo cuMemGetInfo = nullptr;  // _v2
};

struct LoadOptions {
  // What dlopen is given. The default finds the driver the way every CUDA
  // program does (ld.so cache, LD_LIBRARY_PATH); tests give a path.
  std::string library = "libcuda.so.1";
};

class Driver {
 public:
  // Loads the driver: dlopen, then cuDriverGetVersion (refused below
  // abi::kCheckpointApiVersion), then every symbol of the table, then cuInit(0).
  // Errors:
  //   kNotFound      the library cannot be loaded (dlerror() quoted)
  //   kNotSupported  the driver is too old (both versions named), or it lacks a
  //                  required symbol (every missing one named)
  //   kExternal      cuInit or cuDriverGetVersion failed (the CUresult named)
  static Result<Driver> Load(const LoadOptions& options = {});

  Driver(Driver&& other) noexcept;
  Driver& operator=(Driver&& other) noexcept;
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
  ~Driver();

  const DriverApi& api() const { return api_; }
  // cuDriverGetVersion's value, e.g. 13000.
  int version() const { return version_; }
  // GPU remapping on restore (CUcheckpointRestoreArgs::gpuPairs) needs r580.
  bool SupportsGpuRemap() const { return version_ >= abi::kGpuRemapVersion; }
  // The file dlopen loaded, e.g. "/usr/lib/x86_64-linux-gnu/libcuda.so.1".
  const std::string& path() const { return path_; }

  // "CUDA_ERROR_NOT_SUPPORTED (801)", using cuGetErrorName when it knows the
  // code and gpusnap's own table otherwise.
  std::string ErrorName(abi::CUresult result) const;

 private:
  Driver() = default;
  void* handle_ = nullptr;
  DriverApi api_;
  int version_ = 0;
  std::string path_;
};

// "13.0 (13000)" for cuDriverGetVersion's 13000.
std::string VersionText(int version);

}  // namespace gpusnap::cuda
