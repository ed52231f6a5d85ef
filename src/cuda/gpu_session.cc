#include "cuda/gpu_session.h"

namespace gpusnap::cuda {

Result<std::shared_ptr<GpuSession>> GpuSession::Open(const LoadOptions& options) {
  GPUSNAP_ASSIGN_OR_RETURN(Driver loaded, Driver::Load(options));
  return std::make_shared<GpuSession>(std::make_shared<Driver>(std::move(loaded)));
}

Result<std::shared_ptr<GpuSession>> GpuSession::KeptOrOpen(std::shared_ptr<GpuSession> kept) {
  if (kept) return kept;
  return Open();
}

GpuSession::~GpuSession() {
  MutexLock lock(mu_);
  for (const auto& [ordinal, retained] : contexts_) driver_->api().cuDevicePrimaryCtxRelease(retained.first);
}

Result<abi::CUcontext> GpuSession::Context(int ordinal) {
  const DriverApi& api = driver_->api();
  if (!api.cuDevicePrimaryCtxRetain || !api.cuDevicePrimaryCtxRelease || !api.cuCtxSetCurrent)
    return Status::Error(Code::kNotSupported, "the driver `{}` has no primary context calls", driver_->path());
  MutexLock lock(mu_);
  if (auto it = contexts_.find(ordinal); it != contexts_.end()) return it->second.second;
  auto failed = [&](const char* call, abi::CUresult rc) {
    return Status::Error(Code::kExternal, "{} (GPU {}): {}", call, ordinal, driver_->ErrorName(rc));
  };
  abi::CUdevice dev = 0;
  if (abi::CUresult rc = api.cuDeviceGet(&dev, ordinal); rc != abi::CUDA_SUCCESS) return failed("cuDeviceGet", rc);
  abi::CUcontext ctx = nullptr;
  if (abi::CUresult rc = api.cuDevicePrimaryCtxRetain(&ctx, dev); rc != abi::CUDA_SUCCESS)
    return failed("cuDevicePrimaryCtxRetain", rc);
  contexts_.emplace(ordinal, std::make_pair(dev, ctx));
  return ctx;
}

Result<int> GpuSession::RetainAll() {
  int count = 0;
  if (abi::CUresult rc = driver_->api().cuDeviceGetCount(&count); rc != abi::CUDA_SUCCESS)
    return Status::Error(Code::kExternal, "cuDeviceGetCount: {}", driver_->ErrorName(rc));
  for (int i = 0; i < count; ++i) GPUSNAP_RETURN_IF_ERROR(Context(i).status());
  return count;
}

Result<std::uint64_t> GpuSession::FreeBytes(int ordinal) {
  const DriverApi& api = driver_->api();
  if (!api.cuMemGetInfo)
    return Status::Error(Code::kNotSupported, "the driver `{}` cannot tell a GPU's free memory (no cuMemGetInfo_v2)",
                         driver_->path());
  GPUSNAP_ASSIGN_OR_RETURN(abi::CUcontext ctx, Context(ordinal));
  auto failed = [&](const char* call, abi::CUresult rc) {
    return Status::Error(Code::kExternal, "{} (GPU {}): {}", call, ordinal, driver_->ErrorName(rc));
  };
  if (abi::CUresult rc = api.cuCtxSetCurrent(ctx); rc != abi::CUDA_SUCCESS) return failed("cuCtxSetCurrent", rc);
  std::size_t free_bytes = 0, total_bytes = 0;
  if (abi::CUresult rc = api.cuMemGetInfo(&free_bytes, &total_bytes); rc != abi::CUDA_SUCCESS)
    return failed("cuMemGetInfo", rc);
  return static_cast<std::uint64_t>(free_bytes);
}

}  // namespace gpusnap::cuda
