// The steps a restore (restore.cc) and a standby's wake (wake.cc) share:
// the GPU plan (checked before anything is touched), the gpushare preload,
// the GPU step (restore's step 4) and letting the restored tree go (step 5's
// last act), told once so that both stories do them the same way.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "chunks/chunk_lock.h"
#include "cuda/driver.h"
#include "cuda/gpu_session.h"
#include "cuda/gpu_map.h"
#include "gpusnap/operations.h"
#include "gpushare/control/preload.h"
#include "gpushare/control/tree.h"
#include "snapshot/phases.h"

namespace gpusnap {

// A GPU snapshot's restore onto this machine, planned: what restore and
// wake decide before they touch anything, and hold until the GPU step.
struct GpuRestore {
  std::shared_ptr<cuda::GpuSession> session;  // the driver (cuInit done) and the GPUs' contexts
  std::shared_ptr<cuda::Driver> driver;  // the session's; shared: a call that never returns keeps it alive
  std::shared_ptr<gpushare::control::PinnedTier> pinned_tier;  // gpushare: where the preload looks first; may be null
  std::vector<cuda::GpuInfo> here;       // this machine's GPUs
  cuda::GpuMap gpu_map;                  // the snapshot's GPUs onto these
  std::string chunk_store;               // the store's root
  std::string gpu_dir;                   // the snapshot's gpu/ (gpushare manifests)
  // gpushare: held shared from the plan until every chunk is loaded.
  std::optional<chunks::ChunkStoreLock> chunk_lock;
  gpushare::control::PendingPreload preload;  // gpushare: once started (StartGpusharePreload)

  // The device ordinal here of the GPU checkpointed as `uuid`, after the map.
  std::optional<int> OrdinalOf(const cuda::Uuid& uuid) const { return cuda::OrdinalAfterMap(uuid, gpu_map, here); }
};

// Takes the driver of `resources` (else loads it), lists this machine's
// GPUs, plans `spec` onto them and
// checks that the snapshot fits them (gpu::CheckCompatible); gpushare: takes
// the chunk store's lock shared and checks that every chunk the manifests
// name is in the store or among `arriving` (a pull's). Touches no process.
// REQUIRES: meta.gpu. Errors as those steps' (kFailedPrecondition for a GPU
// or driver that does not fit, kInvalidArgument for a map that does not
// apply, kNotFound for a missing chunk), wrapped "refusing to <verb>".
Result<GpuRestore> PlanGpuRestore(const SnapshotMeta& meta, const std::string& chunk_store,
                                  const std::string& snapshot_dir, const cuda::GpuMapSpec& spec,
                                  const std::set<std::string>& arriving, std::string_view verb,
                                  const GpuResources& resources);

// gpushare: starts making and filling the device memory the shims will adopt
// (gpushare/control/preload.h), on the mapped GPUs, from the pinned tier
// where it has the chunks. `arrival_wait` and
// `bringer` as StartPreload takes them (a restore that pulls as it goes).
// Hands what a preload made to the processes (`adopt`) and records its map
// and fill times. Only an optimisation: a failure is said through `progress`,
// and the processes load that memory themselves. The memory returned is to be
// kept until their load is over.
std::optional<gpushare::control::PreloadedMemory> AdoptOrSay(
    const std::vector<gpushare::control::ShimProcess>& procs, Result<gpushare::control::PreloadedMemory> made,
    std::map<std::string, double>& timings, const ProgressFn& progress);

void StartGpusharePreload(GpuRestore& gpu, const SnapshotMeta& meta, std::chrono::milliseconds arrival_wait,
                          chunks::ChunkStore::Bringer bringer, unsigned threads);

// What the GPU step acts on. The pointers are the story's, and outlive the call.
struct GpuStep {
  GpuRestore* gpu = nullptr;             // planned; its preload consumed, its chunk lock released
  const SnapshotMeta* meta = nullptr;    // REQUIRES: meta->gpu
  std::vector<pid_t> gpu_pids;           // host pids, in meta->gpu->ns_pids order, in group-stop
  std::chrono::seconds timeout{600};     // for the driver's restore
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

// How long LetTreeGo waits to see every task of the tree out of a stop. A
// SIGCONT wakes a stopped task before kill() returns: the wait is for what
// else may hold a task, never needed by a tree that was let go.
inline constexpr std::chrono::milliseconds kLetGoWait{2000};

// The tasks of the tree under `reaper_pid` that CRIU left stopped go on, but
// the GPU processes, which the GPU step already let run; gpushare's held work
// goes. Then, within `wait`, every thread of every task of the tree (the GPU
// processes' too; not the reaper) must be seen neither stopped nor with a
// SIGSTOP pending (proc::HeldThreads): a restore or a wake returns only once
// its tree runs. kFailedPrecondition, naming the tasks still held, when some
// stay so (the caller's undo then ends the tree).
// Fault point: GPUSNAP_TEST_STOP_AFTER_LET_GO=1 stops (SIGSTOP) the tree's
// first task once it has been let go, as a stop that came after the SIGCONT
// would leave it (util/test_hooks.h).
Status LetTreeGo(pid_t reaper_pid, const std::vector<pid_t>& gpu_pids,
                 const std::vector<gpushare::control::ShimProcess>& held_shims,
                 std::chrono::milliseconds wait = kLetGoWait);

}  // namespace gpusnap
