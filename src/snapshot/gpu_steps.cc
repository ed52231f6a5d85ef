#include "snapshot/gpu_steps.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "gpu/processes.h"
#include "proc/proc.h"
#include "store/layout.h"
#include "util/test_hooks.h"

namespace gpusnap {

namespace control = gpushare::control;

Result<GpuRestore> PlanGpuRestore(const SnapshotMeta& meta, const std::string& chunk_store,
                                  const std::string& snapshot_dir, const cuda::GpuMapSpec& spec,
                                  const std::set<std::string>& arriving, std::string_view verb,
                                  const GpuResources& resources) {
  std::string refusing = fmt::format("refusing to {}", verb);
  GpuRestore gpu;
  gpu.chunk_store = chunk_store;
  gpu.gpu_dir = snapshot_dir + "/" + SnapshotFiles::kGpuDir;
  if (meta.gpu->gpushare) {
    auto lock = chunks::ChunkStoreLock::Acquire(chunk_store, chunks::ChunkStoreLock::Mode::kShared,
                                                chunks::kChunkWriterWaitMs);
    if (!lock.ok()) return lock.status().Wrap(refusing);
    gpu.chunk_lock = std::move(lock).value();
    GPUSNAP_RETURN_IF_ERROR(
        control::CheckManifests(chunk_store, gpu.gpu_dir, meta.gpu->ns_pids, arriving).Wrap(refusing));
  }
  GPUSNAP_ASSIGN_OR_RETURN(gpu.session, cuda::GpuSession::KeptOrOpen(resources.session));
  gpu.driver = gpu.session->driver();
  gpu.pinned_tier = resources.pinned_tier;
  GPUSNAP_ASSIGN_OR_RETURN(gpu.here, cuda::ListGpus(*gpu.driver));
  GPUSNAP_ASSIGN_OR_RETURN(auto kernel_driver, gpu::KernelDriverVersion());
  auto map = gpu::PlanGpuMap(*meta.gpu, gpu.here, spec);
  if (!map.ok()) return map.status().Wrap(refusing);
  gpu.gpu_map = std::move(map).value();
  GPUSNAP_RETURN_IF_ERROR(gpu::CheckCompatible(*meta.gpu, gpu.here, kernel_driver, gpu.gpu_map).Wrap(refusing));
  return gpu;
}

std::optional<control::PreloadedMemory> AdoptOrSay(const std::vector<control::ShimProcess>& procs,
                                                   Result<control::PreloadedMemory> made,
                                                   std::map<std::string, double>& timings, const ProgressFn& progress) {
  std::optional<control::PreloadedMemory> preloaded;
  Status adopted = made.status();
  if (made.ok()) {
    timings["gpushare-preload-map"] = made->map_seconds();
    timings["gpushare-preload-fill"] = made->fill_seconds();
    adopted = control::AdoptPreloaded(procs, *(preloaded = std::move(*made)), timings);
  }
  if (!adopted.ok() && progress)
    progress({"gpushare-preload: " + adopted.message() + "; the processes load that memory themselves", 0, 0, false});
  return preloaded;
}

void StartGpusharePreload(GpuRestore& gpu, const SnapshotMeta& meta, std::chrono::milliseconds arrival_wait,
                          chunks::ChunkStore::Bringer bringer, unsigned threads) {
  gpu.preload = control::StartPreload(gpu.session, gpu.chunk_store, gpu.gpu_dir, meta.gpu->ns_pids,
                                      [map = gpu.gpu_map, here = gpu.here](const cuda::Uuid& uuid) {
                                        return cuda::OrdinalAfterMap(uuid, map, here);
                                      },
                                      arrival_wait, std::move(bringer), threads, gpu.pinned_tier);
}

Result<std::vector<control::ShimProcess>> RestoreGpuProcesses(const GpuStep& step, Phases& phases) {
  const SnapshotMeta& meta = *step.meta;
  std::vector<pid_t> tids(meta.gpu->restore_tids.begin(), meta.gpu->restore_tids.end());
  GPUSNAP_RETURN_IF_ERROR(
      gpu::ResumeWithin(step.gpu->driver, step.gpu_pids, tids, step.gpu->gpu_map, step.timeout, phases.timings())
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
  if (step.gpu->preload.valid()) {
    Timed<Result<control::PreloadedMemory>> made = step.gpu->preload.get();
    phases.timings()["gpushare-preload"] = made.seconds;
    preloaded = AdoptOrSay(procs, std::move(made.value), phases.timings(), step.progress);
  }
  PauseIfRequested("gpushare-load");
  if (step.before_load) GPUSNAP_RETURN_IF_ERROR(step.before_load().Wrap(step.failed));
  Status loaded =
      control::LoadAll(procs, step.gpu->chunk_store, step.gpu->gpu_dir, control::AfterLoad::kHold, phases.timings());
  preloaded.reset();  // what the processes adopted is theirs now
  step.gpu->chunk_lock.reset();
  GPUSNAP_RETURN_IF_ERROR(loaded.Wrap(step.failed));
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("gpushare-load"));
  phases.Done();
  return procs;
}

namespace {

// Every task of the tree under `reaper_pid`, but the reaper.
std::vector<pid_t> TreeBelow(pid_t reaper_pid) {
  std::vector<pid_t> tasks = proc::Tree(reaper_pid);
  std::erase(tasks, reaper_pid);
  return tasks;
}

// "pid 12 (stopped), pid 14 thread 15 (a SIGSTOP pending)", the first few.
std::string DescribeHeld(const std::vector<proc::HeldThread>& held) {
  constexpr size_t kNamed = 4;
  std::string out;
  for (size_t i = 0; i < std::min(held.size(), kNamed); ++i) {
    const proc::HeldThread& t = held[i];
    std::string why = t.stop.state == 't'  ? "stopped by a tracer"
                      : t.stop.state == 'T' ? "stopped"
                                            : "a SIGSTOP pending";
    out += fmt::format("{}pid {}{} ({})", i ? ", " : "", t.pid, t.tid == t.pid ? "" : fmt::format(" thread {}", t.tid),
                       why);
  }
  if (held.size() > kNamed) out += fmt::format(" and {} more", held.size() - kNamed);
  return out;
}

// Within `wait`, no thread of the tree is held (proc::HeldThreads).
Status WaitForTreeToRun(pid_t reaper_pid, std::chrono::milliseconds wait) {
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    std::vector<proc::HeldThread> held = proc::HeldThreads(TreeBelow(reaper_pid));
    if (held.empty()) return Status::Ok();
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Error(Code::kFailedPrecondition, "the restored tree does not run: {} {} ms after it was let go",
                           DescribeHeld(held), wait.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace

Status LetTreeGo(pid_t reaper_pid, const std::vector<pid_t>& gpu_pids,
                 const std::vector<control::ShimProcess>& held_shims, std::chrono::milliseconds wait) {
  std::vector<pid_t> tasks = TreeBelow(reaper_pid);
  for (pid_t p : tasks)
    if (std::find(gpu_pids.begin(), gpu_pids.end(), p) == gpu_pids.end() && ::kill(p, SIGCONT) != 0 && errno != ESRCH)
      return Status::Errno(errno, "continuing restored pid {}", p);
  if (!held_shims.empty()) GPUSNAP_RETURN_IF_ERROR(control::ResumeAll(held_shims));
  if (std::getenv("GPUSNAP_TEST_STOP_AFTER_LET_GO") && !tasks.empty()) {
    // The stop lands once the task runs its signal; between the signal's
    // leaving the pending set and the task's state, /proc shows it running.
    // The hook waits for the stop, so that the check below meets one.
    ::kill(tasks.front(), SIGSTOP);
    for (int i = 0; i < 200; ++i) {
      auto held = proc::HeldThreads({tasks.front()});
      if (std::any_of(held.begin(), held.end(), [](const proc::HeldThread& t) { return proc::IsStopped(t.stop.state); }))
        break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  return WaitForTreeToRun(reaper_pid, wait);
}

}  // namespace gpusnap
