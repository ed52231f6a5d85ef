// Workloads: process trees that gpusnap started in a namespace of their own
// (`gpusnap run`) or restored (`gpusnap restore`), recorded by name so they can
// be listed and checkpointed by name.
//
// The records live in the run directory ($GPUSNAP_RUN_DIR, default
// /run/gpusnap), one JSON file per name, each written atomically.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap {

struct Workload {
  std::string name;
  pid_t pid = 0;                 // the tree's root, host pid
  uint64_t start_time = 0;       // with pid: guards against pid reuse
  pid_t reaper_pid = 0;          // pid 1 of its namespace, host pid
  std::vector<std::string> cmdline;
  std::string log;
  std::string started;           // RFC 3339
  std::string restored_from;     // snapshot id, if restored
  bool running = false;          // computed when listed, not stored
};

struct RunOptions {
  std::string name;              // REQUIRES: [A-Za-z0-9._-]{1,40}, not starting with '.'
  std::vector<std::string> argv; // REQUIRES: non-empty
  std::string log;               // default: <run dir>/logs/<name>.log
  bool gpushare = false;         // preload the gpushare shim (GpushareShimPath) into the workload
};

// The gpushare shim library: $GPUSNAP_GPUSHARE_LIB, else libgpusnap_gpushare.so
// beside the gpusnap binary, in ../lib/gpusnap or in ../lib from it. kNotFound
// naming the places looked at.
Result<std::string> GpushareShimPath();

std::string RunDir();

// Starts argv in a new pid + mount namespace, detached. kAlreadyExists if a
// running workload already has the name.
Result<Workload> RunWorkload(const RunOptions& options);

// All recorded workloads with `running` filled in; records of workloads that
// have exited are kept until their name is reused.
Result<std::vector<Workload>> ListWorkloads();

// kNotFound if no workload has that name.
Result<Workload> FindWorkload(const std::string& name);

// Records a workload (used by restore). Replaces an exited one of that name;
// kAlreadyExists if a running one has it.
Status RecordWorkload(const Workload& workload);

bool IsValidWorkloadName(std::string_view name);

// Now, as RFC 3339 UTC.
std::string NowRfc3339();

}  // namespace gpusnap
