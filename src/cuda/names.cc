#include "cuda/names.h"

#include <fmt/format.h>

#include <utility>

namespace gpusnap::cuda {

std::string StateName(ProcessState state) {
  switch (state) {
    case ProcessState::kRunning: return "RUNNING";
    case ProcessState::kLocked: return "LOCKED";
    case ProcessState::kCheckpointed: return "CHECKPOINTED";
    case ProcessState::kFailed: return "FAILED";
  }
  return fmt::format("UNKNOWN({})", static_cast<int>(state));
}

namespace {

// Values from cuda.h's enum cudaError_enum: the codes that initialisation,
// device queries and the checkpoint API return, and the usual suspects.
constexpr std::pair<abi::CUresult, const char*> kErrorNames[] = {
    {0, "CUDA_SUCCESS"},
    {1, "CUDA_ERROR_INVALID_VALUE"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {4, "CUDA_ERROR_DEINITIALIZED"},
    {34, "CUDA_ERROR_STUB_LIBRARY"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {101, "CUDA_ERROR_INVALID_DEVICE"},
    {102, "CUDA_ERROR_DEVICE_NOT_LICENSED"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE"},
    {217, "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED"},
    {220, "CUDA_ERROR_NVLINK_UNCORRECTABLE"},
    {304, "CUDA_ERROR_OPERATING_SYSTEM"},
    {400, "CUDA_ERROR_INVALID_HANDLE"},
    {401, "CUDA_ERROR_ILLEGAL_STATE"},
    {500, "CUDA_ERROR_NOT_FOUND"},
    {600, "CUDA_ERROR_NOT_READY"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {719, "CUDA_ERROR_LAUNCH_FAILED"},
    {800, "CUDA_ERROR_NOT_PERMITTED"},
    {801, "CUDA_ERROR_NOT_SUPPORTED"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {805, "CUDA_ERROR_MPS_CONNECTION_FAILED"},
    {909, "CUDA_ERROR_TIMEOUT"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

}  // namespace

const char* BuiltinErrorName(abi::CUresult result) {
  for (const auto& [code, name] : kErrorNames)
    if (code == result) return name;
  return nullptr;
}

std::string FormatResult(abi::CUresult result, const char* driver_name) {
  const char* name = driver_name != nullptr && *driver_name != 0 ? driver_name : BuiltinErrorName(result);
  if (name == nullptr) return fmt::format("unknown CUDA error ({})", result);
  return fmt::format("{} ({})", name, result);
}

}  // namespace gpusnap::cuda
