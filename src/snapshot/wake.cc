// The wake of a standby (docs/STANDBY.md): the GPU step a standby restore
// (restore.cc, options.standby) left out, taken now, onto the GPUs chosen now.
//
// 0. Claim the wake (one at a time per standby), then find the standby: its
//    record says standby and its tree is there, every task stopped.
// 1. Check, touching nothing: the snapshot's metadata, read again from the
//    store (it may have been removed since), gpushare's manifests and every
//    chunk they name, this machine's driver and GPUs, the GPU map, and that
//    the device memory the wake needs fits each target GPU's free memory
//    (gpushare: the manifests' allocations, summed per GPU; measured in each
//    GPU's primary context). Nothing is verified again that the standby's
//    restore verified: the wake must be fast. Nor is privilege: a standby
//    is only ever restored into a fresh namespace, never a placeholder's
//    (whose privilege a restore holds its tree to: privilege.h), and a wake
//    changes no credential of its tasks.
// 2. GPU: restore's step 4 (gpu_steps.h): gpushare preloads beside the
//    driver's restore of every process, the processes adopt it and load the
//    rest, their work held.
// 3. Let the tree go, as a restore does (gpu_steps.h: every thread seen out
//    of a stop, else the wake fails), and record the workload running: the
//    point of no return.
//
// One exit: a refusal in steps 0-1 returns before anything is touched, and
// the standby waits on, still wakeable. From step 2 on the undo tears the
// tree down and removes its record (a tree whose GPU state was touched half
// way cannot wait again), and the error says so.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>

#include "chunks/chunk_lock.h"
#include "cuda/gpu_map.h"
#include "cuda/gpus.h"
#include "gpu/processes.h"
#include "gpu/wake_fit.h"
#include "gpusnap/operations.h"
#include "gpushare/control/preload.h"
#include "gpushare/control/tree.h"
#include "proc/proc.h"
#include "snapshot/gpu_steps.h"
#include "snapshot/phases.h"
#include "store/layout.h"
#include "store/store.h"
#include "util/test_hooks.h"
#include "util/undo.h"

namespace gpusnap {

namespace {

namespace control = gpushare::control;

// What the steps find and leave for the steps after them and for the undo.
struct WakeRun {
  std::optional<LockFile> claim;
  Workload standby;
  std::optional<Store> store;
  SnapshotMeta meta;
  std::optional<GpuRestore> gpu;  // planned: the driver, the map, the chunk lock, the preload
  bool touched = false;  // the GPU step began: a failure from here ends the standby

  // The standby's tree and its record go: its reaper ends what its namespace holds.
  Status TearDown() const {
    Status st;
    if (::kill(standby.reaper_pid, SIGTERM) != 0 && errno != ESRCH)
      st = Status::Errno(errno, "ending the standby's reaper (pid {})", standby.reaper_pid);
    Status removed = RemoveWorkloadRecord(standby.name);
    return st.ok() ? removed : st;
  }
};

Result<WakeResult> TakeWake(const WakeOptions& options, Phases& phases, WakeRun& run, UndoStack& undo) {
  // 0. The standby, claimed.
  GPUSNAP_ASSIGN_OR_RETURN(run.claim, ClaimWake(options.name));
  GPUSNAP_ASSIGN_OR_RETURN(run.standby, FindWorkload(options.name));
  const Workload& w = run.standby;
  if (!w.running)
    return Status::Error(Code::kFailedPrecondition, "workload `{}` has exited: there is no standby to wake", w.name);
  if (!w.standby)
    return Status::Error(Code::kFailedPrecondition, "workload `{}` is running, not a standby: only a standby "
                         "(`gpusnap restore --standby`) is woken", w.name);
  auto refused = [&](const Status& st) { return st.Wrap(fmt::format("refusing to wake `{}`", w.name)); };

  // 1. Check, touching nothing.
  phases.Start("check");
  std::string store_root = StoreOrDefault(w.store);
  auto store = Store::Open(store_root, false);
  if (!store.ok()) return refused(store.status());
  run.store = std::move(store).value();
  auto meta = run.store->Load(w.restored_from);
  if (!meta.ok() && meta.status().code() == Code::kNotFound)
    return Status::Error(Code::kNotFound, "refusing to wake `{}`: its snapshot `{}` is no longer in the store `{}`",
                         w.name, w.restored_from, store_root);
  if (!meta.ok()) return refused(meta.status());
  run.meta = std::move(meta).value();
  const SnapshotMeta& m = run.meta;
  if (!m.gpu) return Status::Error(Code::kInternal, "standby `{}`: snapshot `{}` holds no GPU state", w.name, m.id);
  auto planned = PlanGpuRestore(m, store_root, run.store->SnapshotDir(m.id), options.gpus, {},
                                fmt::format("wake `{}`", w.name), options.gpu_resources);
  if (!planned.ok()) return planned.status();
  run.gpu = std::move(planned).value();
  if (m.gpu->gpushare) {
    // The device memory the shims will make, per GPU it goes to, against what is free there.
    auto by_uuid = control::DeviceBytesByGpu(run.gpu->gpu_dir, m.gpu->ns_pids);
    if (!by_uuid.ok()) return refused(by_uuid.status());
    std::map<int, uint64_t> need, free_bytes;
    for (const auto& [uuid, bytes] : *by_uuid)
      if (std::optional<int> ordinal = run.gpu->OrdinalOf(uuid)) need[*ordinal] += bytes;
    for (const auto& [ordinal, bytes] : need) {
      // Measured in the context the preload then uses: the session keeps it made.
      auto free_now = run.gpu->session->FreeBytes(ordinal);
      if (!free_now.ok()) return refused(free_now.status());
      free_bytes[ordinal] = *free_now;
    }
    GPUSNAP_RETURN_IF_ERROR(refused(gpu::PlanWakeFit(need, free_bytes)));
  }
  std::vector<pid_t> gpu_pids;
  for (int ns_pid : m.gpu->ns_pids) {
    auto p = proc::WaitForNsPid(w.reaper_pid, ns_pid);
    if (!p.ok()) return refused(p.status());
    gpu_pids.push_back(*p);
  }
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("wake-check"));
  PauseIfRequested("wake-check");
  phases.Done();

  // 2. GPU: from here a failure ends the standby.
  run.touched = true;
  undo.Push(fmt::format("tearing down the standby `{}`", w.name), [&run] { return run.TearDown(); });
  if (m.gpu->gpushare)
    StartGpusharePreload(*run.gpu, m, std::chrono::milliseconds(0), {}, control::PreloadThreadsAlone());
  GpuStep step{.gpu = &*run.gpu,
               .meta = &m,
               .gpu_pids = gpu_pids,
               .timeout = std::chrono::seconds(options.timeout_s),
               .before_load = nullptr,
               .progress = options.progress,
               .failed = fmt::format("wake of `{}` failed", w.name)};
  GPUSNAP_ASSIGN_OR_RETURN(auto held_shims, RestoreGpuProcesses(step, phases));

  // 3. Let it go and record it running: the point of no return.
  PauseIfRequested("wake-record");
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("wake-record"));
  phases.Start(m.gpu->gpushare ? "gpushare-resume" : "let-go");
  GPUSNAP_RETURN_IF_ERROR(LetTreeGo(w.reaper_pid, gpu_pids, held_shims).Wrap(step.failed));
  phases.Done();
  WakeResult result;
  result.workload = w;
  result.workload.standby = false;
  result.workload.store.clear();
  GPUSNAP_RETURN_IF_ERROR(UpdateWorkload(result.workload));
  undo.Disarm();
  phases.Total();
  result.timings_s = phases.timings();
  return result;
}

}  // namespace

Result<WakeResult> Wake(const WakeOptions& options) {
  Phases phases(options.progress);
  WakeRun run;  // before the undo, whose steps refer to it
  auto woken = WithUndo([&](UndoStack& undo) { return TakeWake(options, phases, run, undo); });
  if (!woken.ok() && run.touched)
    return Status::Error(woken.status().code(), "{}; the standby was torn down and its record removed",
                         woken.status().message());
  return woken;
}

}  // namespace gpusnap
