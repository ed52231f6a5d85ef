#include "cuda/gpus.h"

#include <fmt/format.h>

namespace gpusnap::cuda {

std::string FormatUuid(const Uuid& u) {
  std::string out = "GPU-";
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += fmt::format("{:02x}", u[i]);
  }
  return out;
}

static int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<Uuid> ParseUuid(std::string_view text) {
  auto bad = [&] {
    return Status::Error(Code::kInvalidArgument, "`{}` is not a GPU UUID (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
                         text);
  };
  constexpr std::string_view kPrefix = "GPU-";
  if (text.size() != kPrefix.size() + 36 || text.substr(0, kPrefix.size()) != kPrefix) return bad();
  std::string_view rest = text.substr(kPrefix.size());
  Uuid u{};
  size_t byte = 0;
  for (size_t i = 0; i < rest.size();) {
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (rest[i] != '-') return bad();
      ++i;
      continue;
    }
    int hi = HexDigit(rest[i]), lo = HexDigit(rest[i + 1]);
    if (hi < 0 || lo < 0) return bad();
    u[byte++] = static_cast<std::uint8_t>(hi * 16 + lo);
    i += 2;
  }
  return u;
}

Result<std::vector<GpuInfo>> ListGpus(const Driver& driver) {
  const DriverApi& api = driver.api();
  int count = 0;
  if (abi::CUresult rc = api.cuDeviceGetCount(&count); rc != abi::CUDA_SUCCESS)
    return Status::Error(Code::kExternal, "cuDeviceGetCount: {}", driver.ErrorName(rc));
  std::vector<GpuInfo> gpus;
  for (int i = 0; i < count; ++i) {
    auto failed = [&](const char* call, abi::CUresult rc) {
      return Status::Error(Code::kExternal, "{} (GPU {}): {}", call, i, driver.ErrorName(rc));
    };
    abi::CUdevice dev = 0;
    if (abi::CUresult rc = api.cuDeviceGet(&dev, i); rc != abi::CUDA_SUCCESS) return failed("cuDeviceGet", rc);
    GpuInfo g;
    g.index = i;
    char name[256] = {};
    if (abi::CUresult rc = api.cuDeviceGetName(name, sizeof name - 1, dev); rc != abi::CUDA_SUCCESS)
      return failed("cuDeviceGetName", rc);
    g.name = name;
    abi::CUuuid uuid{};
    if (abi::CUresult rc = api.cuDeviceGetUuid(&uuid, dev); rc != abi::CUDA_SUCCESS)
      return failed("cuDeviceGetUuid", rc);
    for (size_t b = 0; b < g.uuid.size(); ++b) g.uuid[b] = static_cast<std::uint8_t>(uuid.bytes[b]);
    std::size_t bytes = 0;
    if (abi::CUresult rc = api.cuDeviceTotalMem(&bytes, dev); rc != abi::CUDA_SUCCESS)
      return failed("cuDeviceTotalMem", rc);
    g.total_bytes = bytes;
    if (abi::CUresult rc = api.cuDeviceGetAttribute(&g.cc_major, abi::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
        rc != abi::CUDA_SUCCESS)
      return failed("cuDeviceGetAttribute(COMPUTE_CAPABILITY_MAJOR)", rc);
    if (abi::CUresult rc = api.cuDeviceGetAttribute(&g.cc_minor, abi::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
        rc != abi::CUDA_SUCCESS)
      return failed("cuDeviceGetAttribute(COMPUTE_CAPABILITY_MINOR)", rc);
    gpus.push_back(std::move(g));
  }
  return gpus;
}

}  // namespace gpusnap::cuda
