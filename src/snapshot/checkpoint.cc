// The checkpoint, as docs/ARCHITECTURE.md tells it. Checkpoint is the one
// front door: the CLI and the agent call it.
//
// 1. Resolve the target to a process tree and the namespace CRIU must enter;
//    take the tree's checkpoint lock; choose the capture path
//    (snapshot/capture_path.h: the process, the container's filesystem, or
//    both); for the process path, find its GPU and gpushare processes.
// 2. Start a snapshot in the store (.tmp-<id>, locked by us).
// 3. The rootfs path (rootfs, both): the container's writable layer and its
//    caches, read with its cgroup frozen (snapshot/rootfs_capture.h). A
//    rootfs-only capture is published here, the workload running on.
// 4. gpushare processes: quiesce all, save their device memory as chunks and
//    free it (with --leave-running, unless GPUSNAP_GPUSHARE_KEEP=0, gpusnap holds
//    an fd of it first). Undone by loading it back.
// 5. GPU processes: lock all, stop their CPU threads, checkpoint all
//    (gpu/processes.h). Undone by restoring and unlocking them.
// 6. CRIU dumps the tree from inside its namespace (a container's init that
//    would exit with the tree held stopped meanwhile). At its post-dump
//    notification, while the tree is still frozen, publish the snapshot
//    (digests, fsync, rename). Only after we answer does CRIU kill the tree;
//    a failure or a crash before that answer makes CRIU resume it: the
//    source is never lost, and no half snapshot is ever visible. With
//    --leave-running the source is not killed, so nothing waits for the
//    publish: CRIU resumes the tree as soon as it has dumped it.
// 7. Past the point of no return (CRIU is done): with --leave-running, the
//    GPU state of the source comes back, as an undo would bring it (the
//    memory held at step 4 adopted, the rest loaded), and only
//    then is the snapshot published: the workload's pause ("paused") ends
//    with its memory back, not with the digests and the fsync. A publish that
//    fails then leaves the source running and no snapshot.
//
// One exit: each step that must be undone pushes its undo; any failure
// returns through UndoStack::Fail, which runs them newest first and reports
// what they could not do. The undo is disarmed once CRIU has finished the
// dump: a CRIU failure after the publish still needs the source back.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <optional>

#include "chunks/chunk_lock.h"
#include "criu/bundle.h"
#include "criu/operation.h"
#include "criu/options.h"
#include "cuda/gpu_session.h"
#include "gpu/processes.h"
#include "gpusnap/operations.h"
#include "gpushare/control/tree.h"
#include "proc/proc.h"
#include "snapshot/capture_path.h"
#include "snapshot/checkpointable.h"
#include "snapshot/container_files.h"
#include "snapshot/dump_log.h"
#include "snapshot/phases.h"
#include "snapshot/rootfs_capture.h"
#include "snapshot/target.h"
#include "snapshot/tree_lock.h"
#include "store/layout.h"
#include "store/store.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/test_hooks.h"
#include "util/undo.h"

namespace gpusnap {

namespace {

// Free space a rootfs capture leaves in the store's filesystem.
constexpr uint64_t kRootfsReserveBytes = 256ull << 20;

// What the steps find and leave for the steps after them and for the undo.
struct CheckpointRun {
  Target target;
  std::optional<LockFile> tree_lock;
  std::vector<pid_t> gpu_pids;
  std::shared_ptr<cuda::Driver> driver;  // the session's: loaded (cuInit done) once per process
  std::vector<gpushare::control::ShimProcess> shim_procs;
  // With --leave-running, unless GPUSNAP_GPUSHARE_KEEP=0: the source's device
  // memory, held through its release, adopted back after the dump.
  gpushare::control::HeldMemory held;
  std::optional<Store> store;
  std::optional<PendingSnapshot> pending;
  SnapshotMeta meta;
  std::optional<chunks::ChunkStoreLock> chunk_lock;
  std::vector<pid_t> restore_tids;
  bool published = false;
  CaptureDecision path;                   // the capture path taken, and why
  std::optional<ContainerRootfs> container;  // the rootfs path's container
  std::optional<criu::Bundle> bundle;     // the process path's CRIU
  criu::Features features;
  std::vector<ProcessFiles> tree_files;
  // From the first step that stops the workload's work (its GPU work held,
  // its GPU locked, or CRIU's freeze) to its running again (--leave-running).
  std::optional<std::chrono::steady_clock::time_point> pause_start;

  // The gpushare manifests move with the snapshot when it is published.
  std::string ManifestDir() const {
    return (published ? store->SnapshotDir(meta.id) : pending->dir()) + "/" + SnapshotFiles::kGpuDir;
  }
  Status LoadGpushare(std::map<std::string, double>& timings) {
    return gpushare::control::LoadAll(shim_procs, store->root(), ManifestDir(), gpushare::control::AfterLoad::kResume,
                                      timings);
  }
  Status LoadGpushare() {
    std::map<std::string, double> ignored;
    return LoadGpushare(ignored);
  }
  Status ResumeGpu() {
    std::map<std::string, double> ignored;
    return gpu::Resume(*driver, gpu_pids, restore_tids, {}, ignored);
  }
};

// Step 1: the tree, its lock, the capture path; for the process path CRIU
// and the GPU processes (gpushare's among them).
Status Resolve(const CheckpointOptions& options, Phases& phases, CheckpointRun& run) {
  phases.Start("resolve");
  CapturePath asked = options.capture_path.value_or(CapturePath::kProcess);
  GPUSNAP_ASSIGN_OR_RETURN(run.target, ResolveTarget(options.target));
  const Target& target = run.target;
  GPUSNAP_ASSIGN_OR_RETURN(run.tree_lock, LockTreeForCheckpoint(target.host_pid));
  run.tree_files = ReadProcessFiles(target.tree);
  GPUSNAP_RETURN_IF_ERROR(CheckRootfsRequest(options.caches, options.exclude));
  if (asked == CapturePath::kProcess && (!options.caches.empty() || !options.exclude.empty()))
    return Status::Error(Code::kInvalidArgument, "--cache and --exclude apply to the rootfs path: give --capture-path "
                         "rootfs, both or auto");
  Status rootfs_ok = Status::Error(Code::kFailedPrecondition, "not asked for");
  if (asked != CapturePath::kProcess) {
    auto found = FindContainerRootfs(target, options.image);
    rootfs_ok = found.status();
    if (found.ok()) run.container = std::move(found).value();
  }
  GPUSNAP_ASSIGN_OR_RETURN(run.path, ChooseCapturePath(asked, CheckCheckpointable(run.tree_files), rootfs_ok));
  if (run.path.path != CapturePath::kRootfs) {
    GPUSNAP_ASSIGN_OR_RETURN(run.bundle, criu::FindBundle(options.criu_bundle));
    GPUSNAP_ASSIGN_OR_RETURN(run.features, criu::DetectFeatures(*run.bundle, options.tcp_established));
    run.gpu_pids = gpu::FindGpuProcesses(target.tree);
  }
  if (!run.gpu_pids.empty()) {
    // One driver, one cuInit, for every GPU process of the tree: the agent's, else loaded now.
    GPUSNAP_ASSIGN_OR_RETURN(auto session, cuda::GpuSession::KeptOrOpen(options.gpu_resources.session));
    run.driver = session->driver();
    GPUSNAP_ASSIGN_OR_RETURN(run.meta.gpu, gpu::DescribeTree(*run.driver, run.gpu_pids));
  }
  // With the gpushare shim in the GPU processes, their device memory goes to
  // the chunk store instead of through the driver's checkpoint.
  GPUSNAP_ASSIGN_OR_RETURN(run.shim_procs, gpushare::control::FindShimProcesses(run.gpu_pids));
  if (!run.shim_procs.empty()) {
    run.meta.gpu->gpushare = true;
    run.meta.gpu->shim = gpushare::control::MappedShimPath(run.gpu_pids.front());
    for (const auto& p : run.shim_procs) run.meta.gpu->control_sockets.push_back(p.socket);
  }
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("resolve"));
  phases.Done();
  return Status::Ok();
}

// Step 2: a private, locked directory in the store (stale ones of crashed
// runs go), the snapshot's metadata begun, config.dump and spec.dump.
Status Begin(const CheckpointOptions& options, CheckpointRun& run) {
  const Target& target = run.target;
  GPUSNAP_ASSIGN_OR_RETURN(run.store, Store::Open(StoreOrDefault(options.store), true));
  run.store->CleanStaleTemporaries();
  std::string id = options.id.empty() ? NewSnapshotId(SnapshotIdPrefix(target)) : options.id;
  GPUSNAP_ASSIGN_OR_RETURN(run.pending, run.store->Begin(id));
  bool process_path = run.path.path != CapturePath::kRootfs;
  std::optional<SnapshotGpuState> gpu = std::move(run.meta.gpu);
  SnapshotMeta& meta = run.meta;
  meta = DescribeSource(target, id,
                        process_path ? fmt::format("{}.{}", run.features.version_major, run.features.version_minor)
                                     : "",
                        options.tcp_established);
  meta.capture_path = {run.path.path, options.capture_path.value_or(CapturePath::kProcess), run.path.reason};
  meta.owner = options.owner;
  if (!process_path) meta.pids.clear();
  meta.gpu = std::move(gpu);
  for (uint16_t port : TreeListeningPorts(run.tree_files)) meta.listen_ports.push_back(port);
  if (meta.gpu && meta.gpu->gpushare) meta.gpu->chunk_store = run.store->root();
  const std::string& dir = run.pending->dir();
  GPUSNAP_RETURN_IF_ERROR(WriteFileSynced(dir + "/" + SnapshotFiles::kConfigDump, ConfigDumpJson(meta, target.started)));
  GPUSNAP_RETURN_IF_ERROR(WriteFileSynced(dir + "/" + SnapshotFiles::kSpecDump, SpecDumpJson(meta)));
  return InjectedFailure("begin");
}

// Digests, fsync, rename: at CRIU's post-dump notification (step 6), after
// the source runs again (--leave-running, step 7), or at step 3 for a rootfs
// capture.
Status Publish(Phases& phases, CheckpointRun& run) {
  phases.Start("publish");
  run.meta.timings_s = phases.timings();
  GPUSNAP_RETURN_IF_ERROR(run.pending->Publish(run.meta).Wrap("publishing the snapshot"));
  run.published = true;
  phases.Done(run.meta.total_bytes);
  PauseIfRequested("published");
  return Status::Ok();
}

// Step 4: gpushare's device memory to the chunk store. From here to the end,
// gpusnap holds the chunk store lock shared: no chunk the release finds
// present, and none the undo reads, can be collected before a published
// manifest names it (chunks/chunk_lock.h).
Status ReleaseGpushare(const CheckpointOptions& options, Phases& phases, CheckpointRun& run, UndoStack& undo) {
  if (run.shim_procs.empty()) return Status::Ok();
  GPUSNAP_ASSIGN_OR_RETURN(run.chunk_lock,
                           chunks::ChunkStoreLock::Acquire(run.store->root(), chunks::ChunkStoreLock::Mode::kShared,
                                                           chunks::kChunkWriterWaitMs));
  run.pause_start = std::chrono::steady_clock::now();
  phases.Start("gpushare-release");
  std::string manifests = run.ManifestDir();
  if (::mkdir(manifests.c_str(), 0700) != 0) return Status::Errno(errno, "creating `{}`", manifests);
  bool keep = options.leave_running && gpushare::control::KeepMemoryFromEnv();
  GPUSNAP_RETURN_IF_ERROR(gpushare::control::ReleaseAll(run.shim_procs, run.store->root(), manifests,
                                                        options.gpu_lock_timeout_ms, phases.timings(),
                                                        keep ? &run.held : nullptr)
                              .Wrap("releasing the device memory of the GPU processes"));
  undo.Push("bringing back the device memory of the GPU processes", [&run] { return run.LoadGpushare(); });
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("gpushare-release"));
  phases.Done();
  return Status::Ok();
}

// Step 5: the GPU processes, checkpointed by the driver.
Status SuspendGpu(const CheckpointOptions& options, Phases& phases, CheckpointRun& run, UndoStack& undo) {
  if (!run.driver) return Status::Ok();
  if (!run.pause_start) run.pause_start = std::chrono::steady_clock::now();
  phases.Start("gpu-suspend");
  auto tids = gpu::Suspend(*run.driver, run.gpu_pids, options.gpu_lock_timeout_ms, phases.timings());
  if (!tids.ok()) return tids.status().Wrap("suspending the GPU processes");
  run.restore_tids = *tids;
  run.meta.gpu->restore_tids.assign(run.restore_tids.begin(), run.restore_tids.end());
  undo.Push("resuming the GPU processes", [&run] { return run.ResumeGpu(); });
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("gpu-suspend"));
  phases.Done();
  return Status::Ok();
}

// Step 6: CRIU dumps the tree from inside its namespace, and the snapshot is
// published at its post-dump notification, while the tree is frozen (with
// --leave-running, at step 7).
Status Dump(const CheckpointOptions& options, Phases& phases, CheckpointRun& run) {
  const Target& target = run.target;
  const std::string& dir = run.pending->dir();
  std::string images = dir + "/" + SnapshotFiles::kCheckpointDir;
  if (::mkdir(images.c_str(), 0700) != 0) return Status::Errno(errno, "creating `{}`", images);
  UniqueFd images_fd(::open(images.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd work_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!images_fd.valid() || !work_fd.valid()) return Status::Errno(errno, "opening `{}`", images);
  criu::DumpPlan plan;
  plan.root_pid = target.ns_pid;
  plan.images_dir_fd = images_fd.get();
  plan.work_dir_fd = work_fd.get();
  plan.log_file = SnapshotFiles::kDumpLog;
  plan.leave_running = options.leave_running;
  plan.tcp_established = options.tcp_established;
  plan.shell_job = target.shell_job;
  plan.verbose = options.verbose;
  plan.config_file = options.criu_config;
  bool dumped = false;
  criu::Operation dump = criu::MakeOperation(*run.bundle, DUMP, criu::DumpOptions(plan, run.features),
                                             target.ns_holder, std::chrono::seconds(options.timeout_s),
                                             dir + "/" + SnapshotFiles::kDumpLog);
  dump.on_notify = [&](const std::string& script, int) -> Status {
    if (script != "post-dump") return Status::Ok();
    phases.Done(0);
    PauseIfRequested("post-dump");
    GPUSNAP_RETURN_IF_ERROR(InjectedFailure("post-dump"));
    dumped = true;
    return options.leave_running ? Status::Ok() : Publish(phases, run);
  };
  PauseIfRequested("dump");
  if (!run.pause_start) run.pause_start = std::chrono::steady_clock::now();
  phases.Start("dump");
  // A container's init that would exit with the tree is held until CRIU answers.
  proc::HeldStopped held_init = proc::HeldStopped::Stop(InitToHoldDuringDump(target, options.leave_running));
  auto resp = criu::Run(dump);
  held_init.Release();
  if (!resp.ok()) {
    // The snapshot is whole; only the source's fate is in question.
    if (run.published)
      return resp.status().Wrap(fmt::format("snapshot `{}` was published, but CRIU then failed", run.meta.id));
    return KeepDumpLog(run.store->root(), run.meta.id, dump.log_path, resp.status())
        .Wrap(fmt::format("checkpoint of `{}` failed", options.target.ToString()));
  }
  if (!dumped) return Status::Error(Code::kInternal, "CRIU finished the dump without a post-dump notification");
  return Status::Ok();
}

// Step 7, with --leave-running: the source's GPU state back as an undo would
// bring it, and only then the publish (the workload's pause ends with its
// memory back, not with the digests and the fsync).
Status RunOnThenPublish(const CheckpointOptions& options, Phases& phases, CheckpointRun& run) {
  std::string what = fmt::format("the dump of `{}` is whole", run.meta.id);
  if (run.driver) GPUSNAP_RETURN_IF_ERROR(run.ResumeGpu().Wrap(what + ", but resuming the GPU processes failed"));
  // The memory held through the release goes back where it was; what is
  // not adopted (a refusal stops a process's adopts) the load brings from
  // the chunks.
  if (run.held.allocations > 0) {
    Status adopted = gpushare::control::AdoptHeld(run.shim_procs, run.held, phases.timings());
    if (!adopted.ok() && options.progress)
      options.progress({"gpushare-adopt: " + adopted.message() + "; the rest is loaded from the chunks", 0, 0, false});
  }
  if (!run.shim_procs.empty())
    GPUSNAP_RETURN_IF_ERROR(
        run.LoadGpushare(phases.timings()).Wrap(what + ", but bringing back the device memory failed"));
  phases.timings()["paused"] =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - *run.pause_start).count();
  return Publish(phases, run).Wrap(
      fmt::format("`{}` runs on, but its snapshot could not be kept", options.target.ToString()));
}

// The story: the steps in order, one undo exit (Checkpoint's WithUndo).
Result<SnapshotMeta> TakeCheckpoint(const CheckpointOptions& options, Phases& phases, CheckpointRun& run,
                                    UndoStack& undo) {
  // 1. The tree, its lock, the capture path; CRIU and the GPU processes.
  GPUSNAP_RETURN_IF_ERROR(Resolve(options, phases, run));
  // 2. A private, locked directory in the store.
  GPUSNAP_RETURN_IF_ERROR(Begin(options, run));
  // 3. The container's filesystem (rootfs, both); a rootfs capture ends here.
  if (run.path.path != CapturePath::kProcess) {
    GPUSNAP_ASSIGN_OR_RETURN(run.meta.rootfs, CaptureRootfs(*run.container, options.caches, options.exclude,
                                                            run.pending->dir(), kRootfsReserveBytes, phases));
    GPUSNAP_RETURN_IF_ERROR(InjectedFailure("rootfs"));
  }
  if (run.path.path == CapturePath::kRootfs) {
    phases.Total();  // recorded in the snapshot: nothing follows its publish
    GPUSNAP_RETURN_IF_ERROR(Publish(phases, run));
    run.meta.timings_s = phases.timings();
    return run.meta;
  }
  // 4. gpushare: the device memory to the chunk store.
  GPUSNAP_RETURN_IF_ERROR(ReleaseGpushare(options, phases, run, undo));
  // 5. The GPU processes, checkpointed by the driver.
  GPUSNAP_RETURN_IF_ERROR(SuspendGpu(options, phases, run, undo));
  // 6. The dump, and the publish while the tree is frozen.
  GPUSNAP_RETURN_IF_ERROR(Dump(options, phases, run));
  // 7. The point of no return: CRIU is done (and, but with --leave-running,
  // the snapshot published).
  undo.Disarm();
  if (options.leave_running) GPUSNAP_RETURN_IF_ERROR(RunOnThenPublish(options, phases, run));
  phases.Total();
  run.meta.timings_s = phases.timings();
  return run.meta;
}

}  // namespace

std::string StoreOrDefault(const std::string& given) { return given.empty() ? DefaultStore() : given; }

std::string DefaultStore() {
  const char* env = std::getenv("GPUSNAP_STORE");
  return env && *env ? env : "/var/lib/gpusnap";
}

Result<SnapshotMeta> Checkpoint(const CheckpointOptions& options) {
  Phases phases(options.progress);
  CheckpointRun run;  // before the undo, whose steps refer to it
  return WithUndo([&](UndoStack& undo) { return TakeCheckpoint(options, phases, run, undo); });
}

}  // namespace gpusnap
