// The part of the CUDA driver ABI that gpusnap uses, declared here so that
// gpusnap builds (and its tests run) on machines without CUDA.
//
// Every type below mirrors the driver ABI of cuda.h (CUDA 13.0 headers, checked
// against driver r580): same names, same member names, same sizes, offsets and
// enum values. tests/fakes/libcuda/abi_check.cc static_asserts that when the
// real cuda.h is found at build time. Never add a field: the driver reads these
// structs by layout.
//
// Rules: every reserved byte must be zero (the driver refuses non-zero ones);
// the function pointer types take the arguments exactly as the driver does.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gpusnap::cuda::abi {

using CUresult = int;  // enum cudaError_enum; an int-sized enum in the driver ABI
using CUdevice = int;  // CUdevice_v1
using cuuint64_t = std::uint64_t;

inline constexpr CUresult CUDA_SUCCESS = 0;
inline constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
inline constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
inline constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
inline constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
inline constexpr CUresult CUDA_ERROR_INVALID_HANDLE = 400;
inline constexpr CUresult CUDA_ERROR_OPERATING_SYSTEM = 304;
inline constexpr CUresult CUDA_ERROR_ILLEGAL_STATE = 401;
inline constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
inline constexpr CUresult CUDA_ERROR_NOT_READY = 600;
inline constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;
inline constexpr CUresult CUDA_ERROR_TIMEOUT = 909;
inline constexpr CUresult CUDA_ERROR_UNKNOWN = 999;

// cuDeviceGetAttribute: CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}.
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
inline constexpr int CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;

struct CUuuid {
  char bytes[16];
};

enum CUprocessState : int {
  CU_PROCESS_STATE_RUNNING = 0,
  CU_PROCESS_STATE_LOCKED = 1,
  CU_PROCESS_STATE_CHECKPOINTED = 2,
  CU_PROCESS_STATE_FAILED = 3,
};

struct CUcheckpointLockArgs {
  unsigned int timeoutMs;  // 0: no timeout
  unsigned int reserved0;
  cuuint64_t reserved1[7];
};

struct CUcheckpointCheckpointArgs {
  cuuint64_t reserved[8];
};

struct CUcheckpointGpuPair {
  CUuuid oldUuid;  // the GPU the process was checkpointed on
  CUuuid newUuid;  // the GPU to restore it onto
};

// 64 bytes in every header since CUDA 12.8: r570/r575 have only reserved words;
// CUDA 13.0 gives the first 12 bytes to gpuPairs and gpuPairsCount and keeps
// the rest reserved (later headers split the reserved tail differently, at the
// same size). We keep the tail as one zeroed block.
struct CUcheckpointRestoreArgs {
  CUcheckpointGpuPair* gpuPairs;
  unsigned int gpuPairsCount;
  char reserved[52 - sizeof(CUcheckpointGpuPair*)];
  cuuint64_t reserved1;
};

struct CUcheckpointUnlockArgs {
  cuuint64_t reserved[8];
};

static_assert(sizeof(CUuuid) == 16);
static_assert(sizeof(CUprocessState) == 4);
static_assert(sizeof(CUcheckpointLockArgs) == 64);
static_assert(sizeof(CUcheckpointCheckpointArgs) == 64);
static_assert(sizeof(CUcheckpointGpuPair) == 32);
static_assert(sizeof(CUcheckpointRestoreArgs) == 64);
static_assert(offsetof(CUcheckpointRestoreArgs, gpuPairsCount) == 8);
static_assert(sizeof(CUcheckpointUnlockArgs) == 64);

// Function pointer types, one per driver entry point we resolve.
extern "C" {
using PFN_cuInit = CUresult (*)(unsigned int flags);
using PFN_cuDriverGetVersion = CUresult (*)(int* version);
using PFN_cuGetErrorName = CUresult (*)(CUresult error, const char** name);
using PFN_cuGetErrorString = CUresult (*)(CUresult error, const char** text);
using PFN_cuDeviceGetCount = CUresult (*)(int* count);
using PFN_cuDeviceGet = CUresult (*)(CUdevice* device, int ordinal);
using PFN_cuDeviceGetName = CUresult (*)(char* name, int len, CUdevice device);
using PFN_cuDeviceGetUuid = CUresult (*)(CUuuid* uuid, CUdevice device);  // also _v2
using PFN_cuDeviceTotalMem = CUresult (*)(std::size_t* bytes, CUdevice device);  // _v2
using PFN_cuDeviceGetAttribute = CUresult (*)(int* value, int attribute, CUdevice device);
using PFN_cuCheckpointProcessGetState = CUresult (*)(int pid, CUprocessState* state);
using PFN_cuCheckpointProcessGetRestoreThreadId = CUresult (*)(int pid, int* tid);
using PFN_cuCheckpointProcessLock = CUresult (*)(int pid, CUcheckpointLockArgs* args);
using PFN_cuCheckpointProcessCheckpoint = CUresult (*)(int pid, CUcheckpointCheckpointArgs* args);
using PFN_cuCheckpointProcessRestore = CUresult (*)(int pid, CUcheckpointRestoreArgs* args);
using PFN_cuCheckpointProcessUnlock = CUresult (*)(int pid, CUcheckpointUnlockArgs* args);
}

// --- Device memory, streams and launches: what the gpushare shim hooks or
// calls, and what the fake driver implements for the CI tests.

using CUdeviceptr = unsigned long long;                   // CUdeviceptr_v2
using CUmemGenericAllocationHandle = unsigned long long;  // _v1
struct CUctx_st;
struct CUstream_st;
struct CUfunc_st;
struct CUmod_st;
struct CUgraphExec_st;
using CUcontext = CUctx_st*;
using CUstream = CUstream_st*;
using CUfunction = CUfunc_st*;
using CUmodule = CUmod_st*;
using CUgraphExec = CUgraphExec_st*;

inline constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;

enum CUmemAllocationType : int {
  CU_MEM_ALLOCATION_TYPE_INVALID = 0,
  CU_MEM_ALLOCATION_TYPE_PINNED = 1,
};

enum CUmemAllocationHandleType : int {
  CU_MEM_HANDLE_TYPE_NONE = 0,
  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1,
};

enum CUmemLocationType : int {
  CU_MEM_LOCATION_TYPE_INVALID = 0,
  CU_MEM_LOCATION_TYPE_DEVICE = 1,
};

enum CUmemAccess_flags : int {
  CU_MEM_ACCESS_FLAGS_PROT_NONE = 0,
  CU_MEM_ACCESS_FLAGS_PROT_READ = 1,
  CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3,
};

enum CUmemAllocationGranularity_flags : int {
  CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0,
  CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
};

struct CUmemLocation {
  CUmemLocationType type;
  int id;
};

struct CUmemAllocationProp {
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};

struct CUmemAccessDesc {
  CUmemLocation location;
  CUmemAccess_flags flags;
};

static_assert(sizeof(CUmemLocation) == 8);
static_assert(sizeof(CUmemAllocationProp) == 32);
static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16);
static_assert(sizeof(CUmemAccessDesc) == 12);

// cuGetProcAddress flags and its status out-parameter (CUDA 12.0+ _v2).
inline constexpr cuuint64_t CU_GET_PROC_ADDRESS_DEFAULT = 0;
enum CUdriverProcAddressQueryResult : int {
  CU_GET_PROC_ADDRESS_SUCCESS = 0,
  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
  CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
};

extern "C" {
using PFN_cuGetProcAddress_v2 = CUresult (*)(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                                             CUdriverProcAddressQueryResult* status);
using PFN_cuGetProcAddress_v1 = CUresult (*)(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags);
using PFN_cuCtxGetCurrent = CUresult (*)(CUcontext* ctx);
using PFN_cuCtxSetCurrent = CUresult (*)(CUcontext ctx);
using PFN_cuCtxGetDevice = CUresult (*)(CUdevice* device);
using PFN_cuCtxSynchronize = CUresult (*)();
using PFN_cuDevicePrimaryCtxRetain = CUresult (*)(CUcontext* ctx, CUdevice device);
using PFN_cuDevicePrimaryCtxRelease = CUresult (*)(CUdevice device);  // _v2
using PFN_cuMemAlloc = CUresult (*)(CUdeviceptr* dptr, std::size_t bytes);  // _v2
using PFN_cuMemGetInfo = CUresult (*)(std::size_t* free_bytes, std::size_t* total_bytes);  // _v2
using PFN_cuMemFree = CUresult (*)(CUdeviceptr dptr);                        // _v2
using PFN_cuMemAddressReserve = CUresult (*)(CUdeviceptr* ptr, std::size_t size, std::size_t alignment,
                                             CUdeviceptr addr, unsigned long long flags);
using PFN_cuMemAddressFree = CUresult (*)(CUdeviceptr ptr, std::size_t size);
using PFN_cuMemCreate = CUresult (*)(CUmemGenericAllocationHandle* handle, std::size_t size,
                                     const CUmemAllocationProp* prop, unsigned long long flags);
using PFN_cuMemRelease = CUresult (*)(CUmemGenericAllocationHandle handle);
using PFN_cuMemMap = CUresult (*)(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                                  CUmemGenericAllocationHandle handle, unsigned long long flags);
using PFN_cuMemUnmap = CUresult (*)(CUdeviceptr ptr, std::size_t size);
using PFN_cuMemSetAccess = CUresult (*)(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                                        std::size_t count);
using PFN_cuMemGetAllocationGranularity = CUresult (*)(std::size_t* granularity, const CUmemAllocationProp* prop,
                                                       CUmemAllocationGranularity_flags option);
using PFN_cuMemcpyDtoHAsync = CUresult (*)(void* dst, CUdeviceptr src, std::size_t bytes, CUstream stream);  // _v2
using PFN_cuMemcpyHtoDAsync = CUresult (*)(CUdeviceptr dst, const void* src, std::size_t bytes,
                                           CUstream stream);  // _v2
using PFN_cuMemsetD8Async = CUresult (*)(CUdeviceptr dst, unsigned char value, std::size_t count, CUstream stream);
using PFN_cuStreamCreate = CUresult (*)(CUstream* stream, unsigned int flags);
using PFN_cuStreamDestroy = CUresult (*)(CUstream stream);  // _v2
using PFN_cuStreamSynchronize = CUresult (*)(CUstream stream);
using PFN_cuMemHostAlloc = CUresult (*)(void** ptr, std::size_t bytes, unsigned int flags);
using PFN_cuMemFreeHost = CUresult (*)(void* ptr);
using PFN_cuMemExportToShareableHandle = CUresult (*)(void* shareable, CUmemGenericAllocationHandle handle,
                                                      CUmemAllocationHandleType type, unsigned long long flags);
using PFN_cuMemImportFromShareableHandle = CUresult (*)(CUmemGenericAllocationHandle* handle, void* os_handle,
                                                        CUmemAllocationHandleType type);
using PFN_cuMemRetainAllocationHandle = CUresult (*)(CUmemGenericAllocationHandle* handle, void* addr);
using PFN_cuMemGetAllocationPropertiesFromHandle = CUresult (*)(CUmemAllocationProp* prop,
                                                                CUmemGenericAllocationHandle handle);
using PFN_cuModuleLoadData = CUresult (*)(CUmodule* module, const void* image);
using PFN_cuModuleGetFunction = CUresult (*)(CUfunction* function, CUmodule module, const char* name);
using PFN_cuModuleUnload = CUresult (*)(CUmodule module);
using PFN_cuLaunchKernel = CUresult (*)(CUfunction f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z,
                                        unsigned int block_x, unsigned int block_y, unsigned int block_z,
                                        unsigned int shared_mem_bytes, CUstream stream, void** kernel_params,
                                        void** extra);
}

// CUipcMemHandle: 64 opaque bytes, passed by value to cuIpcOpenMemHandle.
struct CUipcMemHandle {
  char reserved[64];
};

// cuda.h has these as macros, hence other names.
inline constexpr unsigned int kStreamNonBlocking = 1;     // CU_STREAM_NON_BLOCKING
inline constexpr unsigned int kMemHostAllocPortable = 1;  // CU_MEMHOSTALLOC_PORTABLE

// cuDriverGetVersion values (1000 * major + 10 * minor).
inline constexpr int kCheckpointApiVersion = 12080;  // CUDA 12.8, driver r570
inline constexpr int kGpuRemapVersion = 13000;       // CUDA 13.0, driver r580

}  // namespace gpusnap::cuda::abi
