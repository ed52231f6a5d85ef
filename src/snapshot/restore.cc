// The restore, as DESIGN.md §3 and docs/ARCHITECTURE.md tell it.
//
// 0. A registry reference: its files are pulled (what the store has is not
//    fetched again) into a staging directory the restore reads from, its
//    gpushare chunks arrive beside the steps that follow, in the order the
//    preload copies them; the snapshot joins the store at step 5.
// 1. A rootfs capture goes to its own story here (rootfs_restore.cc).
//    Verify the snapshot (schema, every file's digest) and, for a GPU
//    snapshot, that this machine's driver and GPUs fit, before anything
//    starts; a GPU snapshot's digests are checked beside CRIU instead, its
//    tasks left stopped until they match. gpushare: preload device memory
//    beside the steps that follow.
// 2. Start a fresh pid + mount namespace held by a reaper; or, into a
//    container, check that its init is an idle placeholder and use that.
//    Undone by tearing down what was restored in it.
// 3. CRIU restores the tree inside it (pids as at dump: the namespace is new)
//    once its listening ports are free, and, when its images hold deleted
//    files, once it has its turn (restore_turn.h); GPU processes come back
//    stopped, as they were dumped.
// 4. GPU processes: restore all (onto the mapped GPUs), unlock all only then,
//    let their threads run (gpu/processes.h); gpushare: adopt the preloaded
//    memory, load the rest, their work still held.
// 5. Find the restored root's host pid, hand the namespace to its reaper for
//    good, let the tree go (its other tasks continue, gpushare's held work
//    goes) and record the workload: the point of no return. Until here no
//    task but the GPU processes' (gpushare: none) has run, so a failed restore
//    leaves no trace of the workload having run again.
//
// A standby (options.standby, docs/STANDBY.md) takes steps 0-3 and the record
// of step 5: no GPU step, no preload, no driver loaded here; its tasks stay
// stopped, holding no GPU memory, until `gpusnap wake` (wake.cc) takes step 4.
//
// One exit: any failure returns through UndoStack::Fail, which tears down what
// the restore started (a fresh namespace as a whole; in a placeholder, the
// restored processes, leaving the placeholder idle) and reports what it could
// not undo. The store is never changed by a restore.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>

#include "criu/bundle.h"
#include "criu/lazy_pages.h"
#include "criu/operation.h"
#include "criu/options.h"
#include "cuda/gpu_map.h"
#include "gpu/processes.h"
#include "gpusnap/operations.h"
#include "gpushare/control/chunk_lock.h"
#include "gpushare/control/preload.h"
#include "gpushare/control/tree.h"
#include "ns/reaper.h"
#include "proc/proc.h"
#include "registry/reference.h"
#include "registry/staged_pull.h"
#include "snapshot/gpu_steps.h"
#include "snapshot/huge_pages.h"
#include "snapshot/lazy_pages.h"
#include "snapshot/phases.h"
#include "snapshot/placeholder.h"
#include "snapshot/restore_turn.h"
#include "snapshot/rootfs_restore.h"
#include "snapshot/tcp_ports.h"
#include "store/layout.h"
#include "store/store.h"
#include "util/beside.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/test_hooks.h"
#include "util/undo.h"

namespace gpusnap {

namespace {

namespace control = gpushare::control;

// What the steps find and leave for the steps after them and for the undo.
struct RestoreRun {
  std::optional<Store> store;
  // A reference's, published when the restore is recorded; before the preload,
  // which waits on its chunks, so that it outlives it.
  std::unique_ptr<registry::StagedPull> pull;
  std::string dir;  // the snapshot's files: in the store, or the pull's staging (read beside by the digests)
  SnapshotMeta meta;
  std::future<Timed<Status>> digests;  // a GPU snapshot's, checked beside CRIU
  std::atomic<bool> criu_done{false};   // the digests' pace: until then they follow CRIU's reads
  std::shared_ptr<cuda::Driver> driver;  // shared: a driver call that never returns keeps it alive past ours
  cuda::GpuMap gpu_map;
  std::optional<control::ChunkStoreLock> chunk_lock;  // gpushare: held shared until every chunk is loaded
  control::PendingPreload preload;
  ns::SpawnedReaper reaper;
  bool into_container = false;
  std::vector<control::ShimProcess> held_shims;  // gpushare: loaded, their work held until the tree goes
  std::optional<LazyPagesServer> lazy;  // --lazy-pages: the daemon serving the tree's memory, under its keeper

  // A restore that ends before CRIU has run lets the digests read at once:
  // the future's destructor waits for them.
  ~RestoreRun() { criu_done = true; }

  std::set<std::string> Arriving() const { return pull ? pull->arriving() : std::set<std::string>(); }

  // The tasks CRIU left stopped go on (gpu_steps.h).
  Status LetGo(const std::vector<pid_t>& gpu_pids) const { return LetTreeGo(reaper.reaper_pid, gpu_pids, held_shims); }

  // Nothing of the restore is left: a fresh namespace goes as a whole (its
  // reaper ends what it holds); a placeholder stays, idle again.
  Status TearDown() const {
    if (!into_container) {
      if (::kill(reaper.reaper_pid, SIGTERM) != 0 && errno != ESRCH)
        return Status::Errno(errno, "ending the restore's reaper (pid {})", reaper.reaper_pid);
      return Status::Ok();
    }
    Status st;
    for (pid_t p : proc::Tree(reaper.reaper_pid))
      if (p != reaper.reaper_pid && ::kill(p, SIGKILL) != 0 && errno != ESRCH && st.ok())
        st = Status::Errno(errno, "ending restored pid {} in the placeholder", p);
    return st;
  }
};

Result<RestoreResult> TakeRestore(const RestoreOptions& options, Phases& phases, RestoreRun& run, UndoStack& undo) {
  RestoreResult result;

  // 0. Pull what the store lacks: the files now, the chunks beside what follows.
  std::string store_root = options.store.empty() ? DefaultStore() : options.store;
  if (registry::LooksLikeReference(options.id)) {
    if (auto ref = registry::ParseReference(options.id); !ref.ok())
      return Status::Error(Code::kInvalidArgument, "invalid snapshot id `{}` (an id holds no `/`), nor a registry "
                           "reference: {}", options.id, ref.status().message());
    auto t = std::chrono::steady_clock::now();
    GPUSNAP_ASSIGN_OR_RETURN(run.pull, registry::StagedPull::Begin({.store = store_root,
                                                                   .reference = options.id,
                                                                   .as_id = "",
                                                                   .access = options.registry,
                                                                   .progress = options.progress}));
    phases.timings()["pull-files"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  }

  // 1. Verify.
  phases.Start("verify");
  GPUSNAP_ASSIGN_OR_RETURN(run.store, Store::Open(store_root, false));
  const Store& store = *run.store;
  if (run.pull) {
    run.meta = run.pull->meta();
    run.dir = run.pull->dir();
  } else {
    GPUSNAP_ASSIGN_OR_RETURN(run.meta, store.Load(options.id));
    run.dir = store.SnapshotDir(run.meta.id);
  }
  const SnapshotMeta& meta = run.meta;
  if (!meta.capture_path.has_process()) {
    // A rootfs capture restores by its own story (rootfs_restore.cc); one from
    // a registry joins the store whole first (it has no chunks to stream
    // beside CRIU).
    if (!run.pull) return RestoreRootfs(options, "");
    GPUSNAP_ASSIGN_OR_RETURN(TransferResult pulled, run.pull->Publish());
    RestoreOptions by_id = options;
    by_id.id = meta.id;
    by_id.store = store_root;
    GPUSNAP_ASSIGN_OR_RETURN(RestoreResult rootfs, RestoreRootfs(by_id, ""));
    rootfs.timings_s["pull"] = pulled.seconds;
    return rootfs;
  }
  // A GPU tree's digests are checked while CRIU restores it, every task left
  // stopped, and nothing of it runs before they all match; any other tree's
  // before CRIU starts.
  bool verify_alongside = meta.gpu.has_value();
  if (verify_alongside) {
    // CRIU sets the pace: it reads the images once from disk, in its order,
    // on cores of its own, and the digests follow it through the page cache.
    run.digests = Beside([&store, &meta, &run] {
      return store.Verify(meta, run.dir, {.spare_cores = 2, .reader_done = [&run] { return run.criu_done.load(); }});
    });
  } else {
    GPUSNAP_RETURN_IF_ERROR(store.Verify(meta, run.dir).Wrap("refusing to restore"));
  }
  std::string name = options.name.empty() ? meta.source.name : options.name;
  if (name.empty()) name = "restored-" + std::to_string(meta.source.host_pid);
  // Held until the record is written: a restore or run racing for the name is refused before it starts anything.
  GPUSNAP_ASSIGN_OR_RETURN(NameClaim name_claim, ClaimWorkloadName(name));
  GPUSNAP_ASSIGN_OR_RETURN(auto bundle, criu::FindBundle(options.criu_bundle));
  GPUSNAP_ASSIGN_OR_RETURN(auto features, criu::DetectFeatures(bundle, meta.tcp_established));
  std::string gpu_dir = run.dir + "/" + SnapshotFiles::kGpuDir;  // gpushare manifests
  if (options.standby) {
    // Everything but the GPU: its GPUs are chosen, and its device memory made, at the wake (wake.cc).
    if (!meta.gpu)
      return Status::Error(Code::kInvalidArgument, "snapshot `{}` holds no GPU state: a standby would have nothing to "
                           "wake onto; restore it without --standby", meta.id);
    if (!options.into_container.empty())
      return Status::Error(Code::kNotSupported, "--standby restores into a fresh namespace only, not into a container");
    if (!options.gpu_map.empty() || !options.gpus.empty())
      return Status::Error(Code::kInvalidArgument, "a standby's GPUs are chosen when it is woken: give --gpu-map or "
                           "--gpus to `gpusnap wake`, not with --standby");
    if (meta.gpu->gpushare)
      GPUSNAP_RETURN_IF_ERROR(
          control::CheckManifests(store.root(), gpu_dir, meta.gpu->ns_pids, run.Arriving()).Wrap("refusing to restore"));
  } else if (meta.gpu) {
    GPUSNAP_ASSIGN_OR_RETURN(auto loaded, cuda::Driver::Load());
    run.driver = std::make_shared<cuda::Driver>(std::move(loaded));
    GPUSNAP_ASSIGN_OR_RETURN(auto here, cuda::ListGpus(*run.driver));
    GPUSNAP_ASSIGN_OR_RETURN(auto kernel_driver, gpu::KernelDriverVersion());
    GPUSNAP_ASSIGN_OR_RETURN(run.gpu_map, gpu::PlanGpuMap(*meta.gpu, here, options.gpu_map, options.gpus));
    GPUSNAP_RETURN_IF_ERROR(
        gpu::CheckCompatible(*meta.gpu, here, kernel_driver, run.gpu_map).Wrap("refusing to restore"));
    if (meta.gpu->gpushare) {
      GPUSNAP_ASSIGN_OR_RETURN(run.chunk_lock,
                               control::ChunkStoreLock::Acquire(store.root(), control::ChunkStoreLock::Mode::kShared,
                                                                control::kChunkWriterWaitMs));
      GPUSNAP_RETURN_IF_ERROR(
          control::CheckManifests(store.root(), gpu_dir, meta.gpu->ns_pids, run.Arriving()).Wrap("refusing to restore"));
      run.preload = control::StartPreload(run.driver->path(), store.root(), gpu_dir, meta.gpu->ns_pids,
                                          [map = run.gpu_map, here](const cuda::Uuid& uuid) {
                                            return cuda::OrdinalAfterMap(uuid, map, here);
                                          },
                                          run.Arriving().empty() ? std::chrono::milliseconds(0)
                                                                 : std::chrono::seconds(options.timeout_s),
                                          [pull = run.pull.get()] { return pull ? pull->ChunkFailure() : Status::Ok(); });
    }
  } else if (!options.gpu_map.empty() || !options.gpus.empty()) {
    return Status::Error(Code::kInvalidArgument, "snapshot `{}` holds no GPU state; --gpu-map and --gpus do not apply",
                         meta.id);
  }
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("verify"));
  phases.Done(meta.total_bytes);

  // 2. The namespace.
  phases.Start("namespace");
  std::vector<std::string> join_cgroups;
  run.into_container = !options.into_container.empty();
  if (!run.into_container) {
    GPUSNAP_ASSIGN_OR_RETURN(run.reaper, ns::SpawnReaper({.workload_argv = {}, .log_path = "",
                                                          .ns_last_pid = ns::HighNsLastPid(), .preload = ""}));
  } else {
    GPUSNAP_ASSIGN_OR_RETURN(auto target, FindIdlePlaceholder(options.into_container));
    run.reaper.reaper_pid = target.init_pid;
    join_cgroups = std::move(target.cgroup_procs);
  }
  undo.Push("tearing down the restored tree", [&run] { return run.TearDown(); });
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("namespace"));
  phases.Done();

  // 3. CRIU, once the tree's listening ports are free again here.
  if (!run.into_container && !meta.listen_ports.empty()) {
    phases.Start("free-ports");
    std::vector<uint16_t> ports(meta.listen_ports.begin(), meta.listen_ports.end());
    GPUSNAP_RETURN_IF_ERROR(FreeTimeWaitPorts(ports, std::chrono::seconds(65), [&](const std::string& why) {
                              if (options.progress) options.progress({"free-ports: " + why, 0, 0, false});
                            }).Wrap(fmt::format("restore of `{}` failed", meta.id)));
    phases.Done();
  }
  // Restores whose images hold deleted files take turns, from here to CRIU's end (restore_turn.h).
  GPUSNAP_ASSIGN_OR_RETURN(RestoreTurn turn,
                           TakeRestoreTurn({.images_dir = run.dir + "/" + SnapshotFiles::kCheckpointDir,
                                            .root = fmt::format("/proc/{}/root", run.reaper.reaper_pid),
                                            .snapshot_id = meta.id,
                                            .timeout = std::chrono::seconds(options.timeout_s),
                                            .progress = options.progress},
                                           phases));
  std::optional<HugePagesWindow> huge_pages;
  if (options.huge_pages) {
    GPUSNAP_ASSIGN_OR_RETURN(huge_pages, HugePagesWindow::Open(ThpFile(), RunDir() + "/thp"));
    PauseIfRequested("huge-pages");
  }
  std::string images = run.dir + "/" + SnapshotFiles::kCheckpointDir;
  std::string logs = RunDir() + "/logs";
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(logs));
  if (options.lazy_pages) {
    // CRIU's work dir is the daemon's: the restore finds it by its socket there.
    phases.Start("lazy-pages-start");
    GPUSNAP_RETURN_IF_ERROR(criu::CheckLazyPages(bundle).Wrap("refusing to restore"));
    GPUSNAP_ASSIGN_OR_RETURN(logs, MakeLazyPagesWorkDir(name));
    GPUSNAP_ASSIGN_OR_RETURN(run.lazy, LazyPagesServer::Start({.bundle = &bundle,
                                                              .images_dir = std::filesystem::absolute(images).string(),
                                                              .work_dir = logs,
                                                              .reaper_pid = run.reaper.reaper_pid,
                                                              .into_container = run.into_container,
                                                              .workload_name = name,
                                                              .workload_log = meta.source.log,
                                                              .verbose = options.verbose}));
    undo.Push("stopping the lazy-pages server", [&run] { return run.lazy->Stop(); });
    PauseIfRequested("lazy-pages");
    phases.Done();
  }
  phases.Start("criu-restore");
  std::string log_name = fmt::format("restore-{}-{}.log", meta.id, ::getpid());
  UniqueFd images_fd(::open(images.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd work_fd(::open(logs.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!images_fd.valid() || !work_fd.valid()) return Status::Errno(errno, "opening `{}`", images);
  criu::RestorePlan plan;
  plan.images_dir_fd = images_fd.get();
  plan.work_dir_fd = work_fd.get();
  plan.log_file = log_name;
  plan.tcp_established = meta.tcp_established;
  plan.shell_job = meta.shell_job;
  plan.verbose = options.verbose;
  plan.config_file = options.criu_config;
  plan.keep_criu_cgroups = run.into_container;
  plan.leave_stopped = true;  // step 5 lets the tree go
  plan.lazy_pages = run.lazy.has_value();
  criu::Operation op = criu::MakeOperation(bundle, RESTORE, criu::RestoreOptions(plan, features),
                                           run.reaper.reaper_pid, std::chrono::seconds(options.timeout_s),
                                           logs + "/" + log_name);
  op.join_cgroups = join_cgroups;
  if (turn.held()) op.inherit_fds.push_back(turn.fd());  // a CRIU outliving us keeps the turn
  op.on_notify = [&run](const std::string& script, int) {
    PauseIfRequested("criu-" + script);  // for the crash tests: a point inside CRIU's restore
    return run.lazy ? run.lazy->OnCriuNotify(script) : Status::Ok();
  };
  result.log = op.log_path;
  auto resp = criu::Run(op);
  turn.Release();  // CRIU has exited, and its ghosts are gone
  run.criu_done = true;
  if (huge_pages) {
    // The host's mode back as soon as CRIU is done: a failure to is told, not the restore's.
    if (Status closed = huge_pages->Close(); !closed.ok() && options.progress)
      options.progress({"huge-pages: " + closed.message(), 0, 0, false});
  }
  if (verify_alongside) {
    // A bad snapshot is the cause of whatever CRIU made of it.
    Timed<Status> digests = run.digests.get();
    phases.timings()["verify-digests"] = digests.seconds;
    GPUSNAP_RETURN_IF_ERROR(digests.value.Wrap("refusing to restore"));
  }
  if (run.lazy) {
    // A tree whose page server died has lost memory (its keeper killed it):
    // told beside what CRIU made of that, or alone when CRIU saw nothing.
    Status served = run.lazy->Check(resp.ok() ? std::chrono::milliseconds(0) : std::chrono::milliseconds(1000));
    if (!served.ok() && !resp.ok())
      return Status::Error(resp.status().code(), "restore of `{}` failed: {}\n(and {})", meta.id,
                           resp.status().message(), served.message());
    if (!served.ok()) return served.Wrap(fmt::format("restore of `{}` failed", meta.id));
  }
  // The undo tears down what CRIU left: it rolls back what it fails, but one
  // that answered success and then died leaves a tree that must not stay.
  if (!resp.ok()) return resp.status().Wrap(fmt::format("restore of `{}` failed", meta.id));
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("criu-restore"));
  std::vector<pid_t> gpu_pids;
  if (meta.gpu) {
    for (int ns_pid : meta.gpu->ns_pids) {
      GPUSNAP_ASSIGN_OR_RETURN(pid_t p, proc::WaitForNsPid(run.reaper.reaper_pid, ns_pid));
      gpu_pids.push_back(p);
    }
  }
  phases.Done();

  // 4. GPU (a standby: at its wake, wake.cc).
  if (run.driver) {
    GpuStep step{.driver = run.driver,
                 .meta = &meta,
                 .gpu_pids = gpu_pids,
                 .gpu_map = run.gpu_map,
                 .chunk_store = store.root(),
                 .gpu_dir = gpu_dir,
                 .timeout = std::chrono::seconds(options.timeout_s),
                 .preload = &run.preload,
                 .chunk_lock = &run.chunk_lock,
                 .before_load = nullptr,
                 .progress = options.progress,
                 .failed = fmt::format("restore of `{}` failed", meta.id)};
    if (run.pull) {  // the shims read what was not preloaded from the store: it must all be there
      step.before_load = [&run, &phases] {
        auto t = std::chrono::steady_clock::now();
        Status arrived = run.pull->WaitForChunks();
        phases.timings()["pull-chunks-wait"] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
        return arrived;
      };
    }
    GPUSNAP_ASSIGN_OR_RETURN(run.held_shims, RestoreGpuProcesses(step, phases));
  }

  // 5. Record it: the point of no return.
  GPUSNAP_ASSIGN_OR_RETURN(pid_t host_pid, proc::WaitForNsPid(run.reaper.reaper_pid, resp->restore().pid()));
  GPUSNAP_ASSIGN_OR_RETURN(auto stat, proc::ReadStat(host_pid));
  PauseIfRequested("record");
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("record"));
  if (run.pull) {  // the snapshot joins the store: nothing reads the staging any more
    // A standby's wake reads its chunks from the store: all of them, first.
    if (options.standby) GPUSNAP_RETURN_IF_ERROR(run.pull->WaitForChunks());
    GPUSNAP_ASSIGN_OR_RETURN(TransferResult pulled, run.pull->Publish());
    phases.timings()["pull"] = pulled.seconds;
  }
  if (run.lazy) GPUSNAP_RETURN_IF_ERROR(run.lazy->Commit().Wrap(fmt::format("restore of `{}` failed", meta.id)));
  GPUSNAP_RETURN_IF_ERROR(ns::CommitHold(run.reaper));
  if (!options.standby) {  // a standby's tree stays stopped until its wake
    phases.Start(meta.gpu && meta.gpu->gpushare ? "gpushare-resume" : "let-go");
    GPUSNAP_RETURN_IF_ERROR(run.LetGo(gpu_pids).Wrap(fmt::format("restore of `{}` failed", meta.id)));
    phases.Done();
  }
  Workload& w = result.workload;
  w.name = name;
  w.pid = host_pid;
  w.reaper_pid = run.reaper.reaper_pid;
  w.cmdline = meta.source.cmdline;
  w.log = meta.source.log;
  w.started = NowRfc3339();
  w.restored_from = meta.id;
  w.start_time = stat.start_time;
  w.standby = options.standby;
  w.store = options.standby ? store.root() : "";
  w.running = true;
  if (run.lazy) w.lazy_pages = run.lazy->work_dir();
  GPUSNAP_RETURN_IF_ERROR(RecordWorkload(w, std::move(name_claim)));
  undo.Disarm();
  phases.Total();
  result.timings_s = phases.timings();
  return result;
}

}  // namespace

Result<RestoreResult> Restore(const RestoreOptions& options) {
  Phases phases(options.progress);
  RestoreRun run;  // before the undo, whose steps refer to it
  auto restored = WithUndo([&](UndoStack& undo) { return TakeRestore(options, phases, run, undo); });
  // A `both` snapshot of the store whose process part cannot run on this
  // node: its rootfs part, into the placeholder the undo left idle.
  const CapturePathRecord& captured = run.meta.capture_path;
  if (restored.ok() || !captured.has_rootfs() || !captured.has_process() || options.into_container.empty() ||
      registry::LooksLikeReference(options.id) || restored.status().code() == Code::kCorruption)
    return restored;
  std::string why = fmt::format("the process restore cannot run here: {}", restored.status().message());
  auto rootfs = RestoreRootfs(options, why);
  if (!rootfs.ok())
    return rootfs.status().Wrap(fmt::format("{}; the rootfs path then failed too", why));
  return rootfs;
}

}  // namespace gpusnap
