// The GPUs the driver sees, and their UUIDs in the "GPU-xxxxxxxx-xxxx-xxxx-
// xxxx-xxxxxxxxxxxx" form nvidia-smi prints.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/driver.h"
#include "gpusnap/status.h"

namespace gpusnap::cuda {

using Uuid = std::array<std::uint8_t, 16>;

// "GPU-" + 8-4-4-4-12 lower-case hex digits. Pure.
std::string FormatUuid(const Uuid& uuid);
// Accepts FormatUuid's form, any case. kInvalidArgument quotes the text.
Result<Uuid> ParseUuid(std::string_view text);

struct GpuInfo {
  int index = 0;              // CUDA device ordinal (CUDA_VISIBLE_DEVICES applies)
  Uuid uuid{};
  std::string name;           // "NVIDIA H200"
  std::uint64_t total_bytes = 0;
  int cc_major = 0;           // compute capability
  int cc_minor = 0;
};

// Every device the driver reports, in ordinal order. Errors: kExternal naming
// the failed call, the device and the CUresult.
Result<std::vector<GpuInfo>> ListGpus(const Driver& driver);

}  // namespace gpusnap::cuda
