// The steps a restore (restore.cc) and a standby's wake (wake.cc) share:
// the GPU step (restore's step 4) and letting the restored tree go (step 5's
// last act), told once so that both stories do them the same way.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "chunks/chunk_lock.h"
#include "cuda/driver.h"
#include "cuda/gpu_map.h"
#include "gpusnap/operations.h"
#include "gpushare/control/preload.h"
#include "gpushare/control/tree.h"
#include "snapshot/phases.h"

namespace gpusnap {

// What the GPU step acts on. The pointers are the story's, and outlive the call.
struct GpuStep {
  std::shared_ptr<cuda::Driver> driver;  // loaded (cuInit done)
  const SnapshotMeta* meta = nullptr;    // REQUIRES: meta->gpu
  std::vector<pid_t> gpu_pids;           // host pids, in meta->gpu->ns_pids order, in group-stop
  cuda::GpuMap gpu_map;
  std::string chunk_store;               // the store's root
  std::string gpu_dir;                   // the snapshot's gpu/ (gpushare manifests)
  std::chrono::seconds timeout{600};     // for the driver's restore
  gpushare::control::PendingPreload* preload = nullptr;  // gpushare: the preload started earlier (may be invalid)
  // gpushare: held shared until every chunk is loaded, then released (may be empty).
  std::optional<chunks::ChunkStoreLock>* chunk_lock = nullptr;
  // gpushare: called before the processes load what was not preloaded (a
  // restore of a reference waits for its chunks there); empty: nothing.
  std::function<Status()> before_load;
  ProgressFn progress;
  std::string failed;                    // the errors' context: "restore of `ID` failed"
};

// Restore every GPU process (onto the mapped GPUs), unlock all only then, and
// let their threads run; gpushare: the processes adopt the preloaded memory,
// load the rest, their work left held. Returns the processes whose work is
// held (none without gpushare), for LetTreeGo. Timings: those of
// gpu::ResumeWithin and the gpushare load. Fault points: gpu-restore,
// gpushare-load.
Result<std::vector<gpushare::control::ShimProcess>> RestoreGpuProcesses(const GpuStep& step, Phases& phases);

// The tasks of the tree under `reaper_pid` that CRIU left stopped go on, but
// the GPU processes, which the GPU step already let run; gpushare's held work
// goes.
Status LetTreeGo(pid_t reaper_pid, const std::vector<pid_t>& gpu_pids,
                 const std::vector<gpushare::control::ShimProcess>& held_shims);

}  // namespace gpusnap
