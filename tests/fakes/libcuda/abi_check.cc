// Compile-time proof that src/cuda/driver_abi.h mirrors the real driver ABI:
// built into the fake libcuda when CMake finds the CUDA toolkit's cuda.h.
// Sizes, member offsets and enum values must match exactly.
#include <cuda.h>

#include <cstddef>
#include <type_traits>

#include "cuda/driver_abi.h"

namespace abi = gpusnap::cuda::abi;

#define SAME_SIZE(ours, theirs) static_assert(sizeof(abi::ours) == sizeof(theirs), #ours " size differs from cuda.h")
#define SAME_OFFSET(ours, theirs, member) \
  static_assert(offsetof(abi::ours, member) == offsetof(theirs, member), #ours "::" #member " offset differs")
#define SAME_VALUE(name) static_assert(static_cast<int>(abi::name) == static_cast<int>(::name), #name " differs")

SAME_SIZE(CUresult, CUresult);
SAME_SIZE(CUdevice, CUdevice);
SAME_SIZE(CUuuid, CUuuid);
SAME_SIZE(CUprocessState, CUprocessState);
SAME_SIZE(CUcheckpointLockArgs, CUcheckpointLockArgs);
SAME_OFFSET(CUcheckpointLockArgs, CUcheckpointLockArgs, timeoutMs);
SAME_OFFSET(CUcheckpointLockArgs, CUcheckpointLockArgs, reserved0);
SAME_OFFSET(CUcheckpointLockArgs, CUcheckpointLockArgs, reserved1);
SAME_SIZE(CUcheckpointCheckpointArgs, CUcheckpointCheckpointArgs);
SAME_SIZE(CUcheckpointGpuPair, CUcheckpointGpuPair);
SAME_OFFSET(CUcheckpointGpuPair, CUcheckpointGpuPair, oldUuid);
SAME_OFFSET(CUcheckpointGpuPair, CUcheckpointGpuPair, newUuid);
SAME_SIZE(CUcheckpointRestoreArgs, CUcheckpointRestoreArgs);
SAME_OFFSET(CUcheckpointRestoreArgs, CUcheckpointRestoreArgs, gpuPairs);
SAME_OFFSET(CUcheckpointRestoreArgs, CUcheckpointRestoreArgs, gpuPairsCount);
SAME_SIZE(CUcheckpointUnlockArgs, CUcheckpointUnlockArgs);

SAME_VALUE(CU_PROCESS_STATE_RUNNING);
SAME_VALUE(CU_PROCESS_STATE_LOCKED);
SAME_VALUE(CU_PROCESS_STATE_CHECKPOINTED);
SAME_VALUE(CU_PROCESS_STATE_FAILED);
SAME_VALUE(CUDA_SUCCESS);
SAME_VALUE(CUDA_ERROR_INVALID_VALUE);
SAME_VALUE(CUDA_ERROR_NOT_INITIALIZED);
SAME_VALUE(CUDA_ERROR_INVALID_DEVICE);
SAME_VALUE(CUDA_ERROR_OPERATING_SYSTEM);
SAME_VALUE(CUDA_ERROR_ILLEGAL_STATE);
SAME_VALUE(CUDA_ERROR_NOT_FOUND);
SAME_VALUE(CUDA_ERROR_NOT_READY);
SAME_VALUE(CUDA_ERROR_NOT_SUPPORTED);
SAME_VALUE(CUDA_ERROR_TIMEOUT);
SAME_VALUE(CUDA_ERROR_UNKNOWN);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
SAME_VALUE(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);

// Each function pointer type takes what the driver's declaration takes.
template <typename Ours, typename Theirs>
constexpr bool kSameArity = false;
template <typename R1, typename... A1, typename R2, typename... A2>
constexpr bool kSameArity<R1 (*)(A1...), R2 (*)(A2...)> =
    sizeof(R1) == sizeof(R2) && sizeof...(A1) == sizeof...(A2) && ((sizeof(A1) == sizeof(A2)) && ...);
#define SAME_SIGNATURE(fn) static_assert(kSameArity<abi::PFN_##fn, decltype(&::fn)>, #fn " signature differs")
SAME_SIGNATURE(cuInit);
SAME_SIGNATURE(cuDriverGetVersion);
SAME_SIGNATURE(cuGetErrorName);
SAME_SIGNATURE(cuGetErrorString);
SAME_SIGNATURE(cuDeviceGetCount);
SAME_SIGNATURE(cuDeviceGet);
SAME_SIGNATURE(cuDeviceGetName);
SAME_SIGNATURE(cuDeviceGetAttribute);
SAME_SIGNATURE(cuCheckpointProcessGetState);
SAME_SIGNATURE(cuCheckpointProcessGetRestoreThreadId);
SAME_SIGNATURE(cuCheckpointProcessLock);
SAME_SIGNATURE(cuCheckpointProcessCheckpoint);
SAME_SIGNATURE(cuCheckpointProcessRestore);
SAME_SIGNATURE(cuCheckpointProcessUnlock);
SAME_SIGNATURE(cuModuleLoadData);
SAME_SIGNATURE(cuModuleGetFunction);
SAME_SIGNATURE(cuModuleUnload);
SAME_SIGNATURE(cuLaunchKernel);
// cuda.h maps these names to the _v2 entry points, which gpusnap resolves by name.
static_assert(kSameArity<abi::PFN_cuDeviceGetUuid, decltype(&::cuDeviceGetUuid_v2)>);
static_assert(kSameArity<abi::PFN_cuDeviceTotalMem, decltype(&::cuDeviceTotalMem_v2)>);

SAME_SIZE(CUdeviceptr, CUdeviceptr);
SAME_SIZE(CUmemGenericAllocationHandle, CUmemGenericAllocationHandle);
SAME_SIZE(CUmemLocation, CUmemLocation);
SAME_OFFSET(CUmemLocation, CUmemLocation, id);
SAME_SIZE(CUmemAllocationProp, CUmemAllocationProp);
SAME_OFFSET(CUmemAllocationProp, CUmemAllocationProp, requestedHandleTypes);
SAME_OFFSET(CUmemAllocationProp, CUmemAllocationProp, location);
SAME_OFFSET(CUmemAllocationProp, CUmemAllocationProp, win32HandleMetaData);
SAME_OFFSET(CUmemAllocationProp, CUmemAllocationProp, allocFlags);
SAME_SIZE(CUmemAccessDesc, CUmemAccessDesc);
SAME_OFFSET(CUmemAccessDesc, CUmemAccessDesc, flags);
SAME_VALUE(CU_MEM_ALLOCATION_TYPE_PINNED);
SAME_VALUE(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
SAME_VALUE(CU_MEM_LOCATION_TYPE_DEVICE);
SAME_VALUE(CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
SAME_VALUE(CU_MEM_ALLOC_GRANULARITY_MINIMUM);
SAME_VALUE(CU_GET_PROC_ADDRESS_SUCCESS);
SAME_VALUE(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
SAME_VALUE(CUDA_ERROR_OUT_OF_MEMORY);
static_assert(abi::kStreamNonBlocking == CU_STREAM_NON_BLOCKING);
static_assert(abi::kMemHostAllocPortable == CU_MEMHOSTALLOC_PORTABLE);
