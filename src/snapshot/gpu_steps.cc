#include "snapshot/gpu_steps.h"

#include <signal.h>

#include <algorithm>

#include "gpu/processes.h"
#include "proc/proc.h"
#include "util/test_hooks.h"

namespace gpusnap {

namespace control = gpushare::control;

Result<std::vector<control::ShimProcess>> RestoreGpuProcesses(const GpuStep& step, Phases& phases) {
  const SnapshotMeta& meta = *step.meta;
  std::vector<pid_t> tids(meta.gpu->restore_tids.begin(), meta.gpu->restore_tids.end());
  GPUSNAP_RETURN_IF_ERROR(
      gpu::ResumeWithin(step.driver, step.gpu_pids, tids, step.gpu_map, step.timeout, phases.timings())
          .Wrap(step.failed));
  if (step.progress)
    step.progress({"gpu-restore", phases.timings()["gpu-restore"] + phases.timings()["gpu-unlock"], 0, true});
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("gpu-restore"));
  if (!meta.gpu->gpushare) return std::vector<control::ShimProcess>();
  // The driver restored the contexts with the device memory left out; the
  // shims now load it from the chunk store, then hold their work.
  phases.Start("gpushare-load");
  std::vector<control::ShimProcess> procs;
  for (size_t i = 0; i < step.gpu_pids.size(); ++i)
    procs.push_back({step.gpu_pids[i], meta.gpu->ns_pids[i], meta.gpu->control_sockets[i]});
  std::optional<control::PreloadedMemory> preloaded;
  if (step.preload != nullptr && step.preload->valid()) {
    Timed<Result<control::PreloadedMemory>> made = step.preload->get();
    phases.timings()["gpushare-preload"] = made.seconds;
    if (made.value.ok()) {
      phases.timings()["gpushare-preload-map"] = made.value->map_seconds();
      phases.timings()["gpushare-preload-fill"] = made.value->fill_seconds();
    }
    Status adopted = made.value.ok()
                         ? control::AdoptPreloaded(procs, *(preloaded = std::move(*made.value)), phases.timings())
                         : made.value.status();
    // Only an optimisation: what was not adopted, the processes load.
    if (!adopted.ok() && step.progress)
      step.progress({"gpushare-preload: " + adopted.message() + "; the processes load that memory themselves",
                     0, 0, false});
  }
  PauseIfRequested("gpushare-load");
  if (step.before_load) GPUSNAP_RETURN_IF_ERROR(step.before_load().Wrap(step.failed));
  Status loaded =
      control::LoadAll(procs, step.chunk_store, step.gpu_dir, control::AfterLoad::kHold, phases.timings());
  preloaded.reset();  // what the processes adopted is theirs now
  if (step.chunk_lock != nullptr) step.chunk_lock->reset();
  GPUSNAP_RETURN_IF_ERROR(loaded.Wrap(step.failed));
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("gpushare-load"));
  phases.Done();
  return procs;
}

Status LetTreeGo(pid_t reaper_pid, const std::vector<pid_t>& gpu_pids,
                 const std::vector<control::ShimProcess>& held_shims) {
  for (pid_t p : proc::Tree(reaper_pid))
    if (p != reaper_pid && std::find(gpu_pids.begin(), gpu_pids.end(), p) == gpu_pids.end() &&
        ::kill(p, SIGCONT) != 0 && errno != ESRCH)
      return Status::Errno(errno, "continuing restored pid {}", p);
  return held_shims.empty() ? Status::Ok() : control::ResumeAll(held_shims);
}

}  // namespace gpusnap
