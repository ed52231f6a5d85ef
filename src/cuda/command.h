// `gpusnap cuda ...` as library calls: load the driver once, resolve --gpu-map
// against this machine's GPUs, run one action over the pids. The CLI parses
// flags into CommandOptions and calls RunCommand (or RunGpusCommand); the
// agent can call the same.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "cuda/checkpoint_api.h"
#include "cuda/gpus.h"
#include "gpusnap/status.h"

namespace gpusnap::cuda {

struct CommandOptions {
  Action action = Action::kState;
  std::vector<pid_t> pids;
  int lock_timeout_ms = kDefaultLockTimeoutMs;  // lock, suspend
  std::string gpu_map;                          // restore, resume; "" = no remapping
  LoadOptions load;                             // which libcuda
};

struct CommandResult {
  std::string driver;  // "13.0 (13000)"; empty when the driver did not load
  GpuMap gpu_map;      // what --gpu-map resolved to
  Report report;       // report.status also carries load and --gpu-map errors
};

// Loads the driver (one cuInit), translates options.gpu_map (old and new GPUs
// are both this machine's: an in-place restore), runs options.action.
CommandResult RunCommand(const CommandOptions& options);

struct GpusResult {
  std::string driver;
  std::vector<GpuInfo> gpus;
};
// Loads the driver and lists its GPUs.
Result<GpusResult> RunGpusCommand(const LoadOptions& load);

}  // namespace gpusnap::cuda
