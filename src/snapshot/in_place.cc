// Suspend, resume and swap in place (docs/GPUSHARE.md): a gpushare
// workload's device memory released into the chunk store while its
// processes live on, and given back.
//
// Suspend:
// 0. Find the processes: the workload's (running, not a standby, not
//    suspended) GPU processes, or the pids given; each loads the shim.
// 1. Quiesce and release them all (gpushare/control/tree.h: all or none).
// 2. Record the workload suspended, with the store that holds its chunks.
// 3. Queue its chunks for the agent's pinned tier, where there is one, so
//    that its resume copies them from pinned memory.
//
// Resume:
// 0. Find the processes: a suspended workload's, or the pids given.
// 1. Check, touching nothing: every manifest decodes and names chunks that
//    are in the store.
// 2. Preload: the released memory made and filled here, on the GPU each
//    allocation was on (as a wake's preload), and adopted by the processes.
//    Only an optimisation: what was not adopted, the processes load.
// 3. The processes load the rest, then all resume; their manifests go.
// 4. Record the workload running.
//
// Swap: check both; suspend one (its undo: resume it); resume the other.
//
// One exit each: a suspend that fails has resumed every process (the
// control layer's undo) and left the record alone; a resume that fails
// before its load leaves the processes released, and a failed load frees
// what it loaded (the shim), so the workload stays suspended, whole.
#include <chrono>
#include <memory>
#include <optional>

#include "cuda/driver.h"
#include "cuda/gpu_session.h"
#include "cuda/gpus.h"
#include "gpu/processes.h"
#include "gpusnap/operations.h"
#include "gpushare/common/chunk_copy.h"
#include "gpushare/control/preload.h"
#include "gpushare/control/tree.h"
#include "proc/proc.h"
#include "snapshot/gpu_steps.h"
#include "snapshot/phases.h"
#include "util/test_hooks.h"
#include "util/undo.h"

namespace gpusnap {

namespace {

namespace control = gpushare::control;

// What step 0 finds: the workload (by name), its store, its shim processes.
struct InPlaceTarget {
  std::optional<Workload> workload;
  std::string store;
  std::vector<control::ShimProcess> procs;
  std::vector<pid_t> pids;
};

enum class Wanted { kRunning, kSuspended };

// A workload named in `options` must be in the state `wanted`; its GPU
// processes are the tree's that hold a GPU.
Result<InPlaceTarget> FindInPlaceTarget(const InPlaceOptions& options, Wanted wanted) {
  InPlaceTarget t;
  if (!options.name.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(Workload w, FindWorkload(options.name));
    if (!w.running)
      return Status::Error(Code::kFailedPrecondition, "workload `{}` (pid {}) has exited", w.name, w.pid);
    if (w.standby)
      return Status::Error(Code::kFailedPrecondition,
                           "workload `{}` is a standby: it holds no GPU memory to suspend or resume (wake it)", w.name);
    if (wanted == Wanted::kRunning && w.suspended)
      return Status::Error(Code::kFailedPrecondition, "workload `{}` is suspended already", w.name);
    if (wanted == Wanted::kSuspended && !w.suspended)
      return Status::Error(Code::kFailedPrecondition, "workload `{}` is running, not suspended", w.name);
    t.pids = gpu::FindGpuProcesses(proc::Tree(w.pid));
    if (t.pids.empty())
      return Status::Error(Code::kFailedPrecondition, "workload `{}` has no GPU process to suspend or resume", w.name);
    t.store = w.suspended ? w.store : "";
    t.workload = std::move(w);
  } else {
    t.pids = options.pids;
  }
  if (t.store.empty()) t.store = StoreOrDefault(options.store);
  GPUSNAP_ASSIGN_OR_RETURN(t.procs, control::ShimProcessesOf(t.pids));
  return t;
}

std::string What(const InPlaceOptions& options) {
  if (!options.name.empty()) return fmt::format("`{}`", options.name);
  std::string pids;
  for (pid_t p : options.pids) pids += (pids.empty() ? "pid " : ", ") + std::to_string(p);
  return pids;
}

// The released memory of `procs`, made and filled here on the GPU each
// allocation was on, for them to adopt (preload.h).
Result<control::PreloadedMemory> PreloadReleased(const std::vector<control::ShimProcess>& procs,
                                                 const std::string& store, const GpuResources& resources) {
  GPUSNAP_ASSIGN_OR_RETURN(std::shared_ptr<cuda::GpuSession> session, cuda::GpuSession::KeptOrOpen(resources.session));
  GPUSNAP_ASSIGN_OR_RETURN(std::vector<cuda::GpuInfo> here, cuda::ListGpus(*session->driver()));
  std::vector<control::PreloadTarget> targets;
  for (const control::ShimProcess& p : procs)
    targets.push_back({p.ns_pid, control::ManifestPath(control::SuspendedDir(store, p), p)});
  // In place: each allocation goes back to the GPU it was on.
  auto same_gpu = [here](const cuda::Uuid& uuid) -> std::optional<int> {
    for (const cuda::GpuInfo& g : here)
      if (g.uuid == uuid) return g.index;
    return std::nullopt;
  };
  unsigned threads = gpushare::ThreadsFromEnv("GPUSNAP_GPUSHARE_PRELOAD_THREADS", control::PreloadThreadsAlone());
  return control::PreloadedMemory::Make(session, store, targets, same_gpu, threads, std::chrono::milliseconds(0), {},
                                        resources.pinned_tier.get());
}

// Writes what the workload is now into its record (by name only).
Status RecordInPlace(InPlaceTarget& t, bool suspended) {
  if (!t.workload) return Status::Ok();
  t.workload->suspended = suspended;
  t.workload->store = suspended ? t.store : "";
  return UpdateWorkload(*t.workload);
}

Result<InPlaceResult> TakeSuspend(const InPlaceOptions& options, Phases& phases, UndoStack& undo) {
  // 0. The processes.
  GPUSNAP_ASSIGN_OR_RETURN(InPlaceTarget t, FindInPlaceTarget(options, Wanted::kRunning));
  // 1. Quiesce and release, all or none.
  phases.Start("suspend-release");
  GPUSNAP_RETURN_IF_ERROR(control::SuspendInPlace(t.procs, t.store, options.quiesce_timeout_ms, phases.timings()));
  // By value: the undo runs once this function has returned.
  undo.Push(fmt::format("resuming {}", What(options)), [procs = t.procs, store = t.store] {
    std::map<std::string, double> ignored;
    return control::ResumeInPlace(procs, store, ignored);
  });
  phases.Done();
  // 2. Recorded suspended.
  PauseIfRequested("suspend-record");
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("suspend-record"));
  GPUSNAP_RETURN_IF_ERROR(RecordInPlace(t, true));
  undo.Disarm();
  // 3. Its chunks pinned ahead of its resume, on the agent's tier's own
  // thread. Only an optimisation: what the tier lacks, the resume reads.
  if (control::PinnedTier* tier = options.gpu_resources.pinned_tier.get())
    if (auto refs = control::SuspendedChunks(t.store, t.procs); refs.ok()) tier->AdmitLater(t.store, *std::move(refs));
  phases.Total();
  return InPlaceResult{t.workload, t.pids, phases.timings()};
}

Result<InPlaceResult> TakeResume(const InPlaceOptions& options, Phases& phases) {
  // 0. The processes.
  GPUSNAP_ASSIGN_OR_RETURN(InPlaceTarget t, FindInPlaceTarget(options, Wanted::kSuspended));
  // 1. Check, touching nothing: the released processes' manifests and chunks
  // (pids given may be running already: they are only resumed).
  phases.Start("resume-check");
  GPUSNAP_ASSIGN_OR_RETURN(auto states, control::InPlaceStatesOf(t.procs));
  std::vector<control::ShimProcess> released;
  for (size_t i = 0; i < t.procs.size(); ++i)
    if (states[i].state == "released") released.push_back(t.procs[i]);
  for (const control::ShimProcess& p : released)
    GPUSNAP_RETURN_IF_ERROR(control::CheckManifests(t.store, control::SuspendedDir(t.store, p), {p.ns_pid})
                                .Wrap(fmt::format("refusing to resume {}", What(options))));
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("resume-check"));
  phases.Done();
  // 2. Preload and adopt: only an optimisation.
  phases.Start("resume-preload");
  std::optional<control::PreloadedMemory> preloaded;
  if (!released.empty() && control::PreloadEnabled())
    preloaded = AdoptOrSay(released, PreloadReleased(released, t.store, options.gpu_resources), phases.timings(),
                           options.progress);
  phases.Done();
  PauseIfRequested("resume-adopted");
  // 3. The rest loaded, then every process resumed.
  phases.Start("resume-load");
  Status resumed = control::ResumeInPlace(t.procs, t.store, phases.timings());
  preloaded.reset();  // what the processes adopted is theirs now
  GPUSNAP_RETURN_IF_ERROR(resumed);
  phases.Done();
  // 4. Recorded running.
  GPUSNAP_RETURN_IF_ERROR(RecordInPlace(t, false));
  phases.Total();
  return InPlaceResult{t.workload, t.pids, phases.timings()};
}

Status CheckOneOf(const InPlaceOptions& options) {
  if (options.name.empty() == options.pids.empty())
    return Status::Error(Code::kInvalidArgument, "name a workload or give its pids (one of the two)");
  return options.name.empty() ? Status::Ok() : CheckWorkloadName(options.name);
}

}  // namespace

Result<InPlaceResult> SuspendInPlace(const InPlaceOptions& options) {
  GPUSNAP_RETURN_IF_ERROR(CheckOneOf(options));
  Phases phases(options.progress);
  return WithUndo([&](UndoStack& undo) { return TakeSuspend(options, phases, undo); });
}

Result<InPlaceResult> ResumeInPlace(const InPlaceOptions& options) {
  GPUSNAP_RETURN_IF_ERROR(CheckOneOf(options));
  Phases phases(options.progress);
  return TakeResume(options, phases);
}

Result<SwapResult> SwapWorkloads(const SwapOptions& options) {
  GPUSNAP_RETURN_IF_ERROR(CheckWorkloadName(options.suspend));
  GPUSNAP_RETURN_IF_ERROR(CheckWorkloadName(options.resume));
  if (options.suspend == options.resume)
    return Status::Error(Code::kInvalidArgument, "a swap takes two workloads, not `{}` twice", options.suspend);
  Phases phases(options.progress);
  InPlaceOptions out{.name = options.suspend, .pids = {}, .store = options.store,
                     .quiesce_timeout_ms = options.quiesce_timeout_ms, .gpu_resources = options.gpu_resources,
                     .progress = options.progress};
  InPlaceOptions in{.name = options.resume, .pids = {}, .store = "", .quiesce_timeout_ms = 0,
                    .gpu_resources = options.gpu_resources, .progress = options.progress};
  return WithUndo([&](UndoStack& undo) -> Result<SwapResult> {
    // 0. Check both, touching nothing: the one running, the other suspended with its chunks.
    GPUSNAP_RETURN_IF_ERROR(FindInPlaceTarget(out, Wanted::kRunning).status().Wrap("refusing to swap"));
    GPUSNAP_ASSIGN_OR_RETURN(InPlaceTarget next, FindInPlaceTarget(in, Wanted::kSuspended));
    for (const control::ShimProcess& p : next.procs)
      GPUSNAP_RETURN_IF_ERROR(control::CheckManifests(next.store, control::SuspendedDir(next.store, p), {p.ns_pid})
                                  .Wrap(fmt::format("refusing to swap in `{}`", options.resume)));
    // 1. The one out, freeing its memory.
    phases.Start("suspend");
    GPUSNAP_ASSIGN_OR_RETURN(InPlaceResult suspended, SuspendInPlace(out));
    undo.Push(fmt::format("resuming `{}` again", options.suspend),
              [&] {
                InPlaceOptions back{.name = options.suspend, .pids = {}, .store = "", .quiesce_timeout_ms = 0,
                                    .gpu_resources = options.gpu_resources, .progress = nullptr};
                return ResumeInPlace(back).status();
              });
    phases.Done();
    PauseIfRequested("swap-suspended");
    GPUSNAP_RETURN_IF_ERROR(InjectedFailure("swap-suspended"));
    // 2. The other in.
    phases.Start("resume");
    auto resumed = ResumeInPlace(in);
    if (!resumed.ok())
      return resumed.status().Wrap(fmt::format("swap of `{}` for `{}` undone, `{}` resumed again: resuming `{}`",
                                               options.suspend, options.resume, options.suspend, options.resume));
    phases.Done();
    undo.Disarm();
    for (const auto& [phase, s] : suspended.timings_s) phases.timings()["suspend." + phase] = s;
    for (const auto& [phase, s] : resumed->timings_s) phases.timings()["resume." + phase] = s;
    phases.Total();
    return SwapResult{*suspended.workload, *resumed->workload, phases.timings()};
  });
}

Result<Workload> SettleWorkload(const std::string& name, const std::string& store) {
  GPUSNAP_ASSIGN_OR_RETURN(Workload w, FindWorkload(name));
  if (!w.running || w.standby) return w;
  std::vector<pid_t> pids = gpu::FindGpuProcesses(proc::Tree(w.pid));
  if (pids.empty()) return w;
  GPUSNAP_ASSIGN_OR_RETURN(auto procs, control::ShimProcessesOf(pids));
  std::string where = w.suspended ? w.store : StoreOrDefault(store);
  std::map<std::string, double> timings;
  auto settled = control::SettleInPlace(procs, where, timings);
  if (!settled.ok()) return settled.status().Wrap(fmt::format("settling `{}`", name));
  control::InPlaceWhole whole = *settled;
  bool suspended = whole == control::InPlaceWhole::kSuspended;
  if (w.suspended == suspended) return w;
  w.suspended = suspended;
  w.store = suspended ? where : "";
  GPUSNAP_RETURN_IF_ERROR(UpdateWorkload(w));
  return w;
}

}  // namespace gpusnap
