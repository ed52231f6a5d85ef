// Names for what the CUDA driver returns: CUresult codes and process states.
// Pure functions; thread-safe.
#pragma once

#include <string>

#include "cuda/driver_abi.h"

namespace gpusnap::cuda {

// The state of a CUDA process as the checkpoint API sees it
// (cuCheckpointProcessGetState). Values mirror CUprocessState; a value the
// driver adds later is kept as is and named "UNKNOWN(<n>)".
enum class ProcessState : int {
  kRunning = abi::CU_PROCESS_STATE_RUNNING,
  kLocked = abi::CU_PROCESS_STATE_LOCKED,
  kCheckpointed = abi::CU_PROCESS_STATE_CHECKPOINTED,
  kFailed = abi::CU_PROCESS_STATE_FAILED,
};

// "RUNNING", "LOCKED", "CHECKPOINTED", "FAILED", or "UNKNOWN(<n>)".
std::string StateName(ProcessState state);

// The enum name of a CUresult from gpusnap's own table of the codes the
// checkpoint path meets ("CUDA_ERROR_NOT_SUPPORTED"), or nullptr when the code
// is not in the table.
const char* BuiltinErrorName(abi::CUresult result);

// "CUDA_ERROR_NOT_SUPPORTED (801)". `driver_name` (what cuGetErrorName said,
// may be null) wins over the built-in table; a code neither knows reads
// "unknown CUDA error (<n>)".
std::string FormatResult(abi::CUresult result, const char* driver_name);

}  // namespace gpusnap::cuda
