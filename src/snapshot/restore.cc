// The restore, as docs/ARCHITECTURE.md tells it. Restore is the one front
// door (the CLI, the agent and its Kubernetes watcher all call it):
//
// 1. Check the options: refusals that need no snapshot, before any disk or
//    network work (CheckRestoreOptions).
// 2. Open the source: the store's snapshot, or a registry reference's, whose
//    files are pulled (what the store has is not fetched again) into a
//    staging directory the restore reads from, its gpushare chunks arriving
//    beside the steps that follow, in the order the preload copies them; the
//    snapshot joins the store when the restore is recorded.
// 3. Dispatch on the capture path, in this one place: a rootfs capture to
//    its own story (rootfs_restore.cc); a process capture to TakeRestore; a
//    `both` capture whose process part cannot run here falls back to its
//    rootfs part.
//
// TakeRestore, the process story:
// 1. Verify the snapshot (schema, every file's digest) and, for a GPU
//    snapshot, that this machine's driver and GPUs fit (PlanGpuRestore),
//    before anything starts; a GPU snapshot's digests are checked beside CRIU
//    instead, its tasks left stopped until they match. gpushare: preload
//    device memory beside the steps that follow.
// 2. Start a fresh pid + mount namespace held by a reaper; or, into a
//    container, check that its init is an idle placeholder and use that, and
//    that the snapshot's threads hold no privilege its init does not (their
//    credentials in the images against its own; privilege.h). Undone by
//    tearing down what was restored in it.
// 3. CRIU restores the tree inside it (pids as at dump: the namespace is new)
//    once its listening ports are free, and, when its images hold deleted
//    files, once it has its turn (restore_turn.h); GPU processes come back
//    stopped, as they were dumped. Into a container, the restored threads'
//    credentials are checked again, as /proc shows them, before any runs.
// 4. GPU processes: restore all (onto the mapped GPUs), unlock all only then,
//    let their threads run (gpu/processes.h); gpushare: adopt the preloaded
//    memory, load the rest, their work still held.
// 5. Find the restored root's host pid, hand the namespace to its reaper for
//    good, let the tree go (its other tasks continue, gpushare's held work
//    goes; every thread seen out of a stop, else the restore fails) and
//    record the workload: the point of no return. Until here no
//    task but the GPU processes' (gpushare: none) has run, so a failed restore
//    leaves no trace of the workload having run again.
//
// A standby (options.standby, docs/STANDBY.md) takes steps 1-3 and the record
// of step 5: no GPU step, no preload, no driver loaded here; its tasks stay
// stopped, holding no GPU memory, until `gpusnap wake` (wake.cc) takes step 4.
//
// One exit: any failure returns through UndoStack::Fail, which tears down what
// the restore started (a fresh namespace as a whole; in a placeholder, the
// restored processes, leaving the placeholder idle) and reports what it could
// not undo. The store is never changed by a restore, but for a pulled
// snapshot joining it.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>

#include "chunks/chunk_lock.h"
#include "criu/bundle.h"
#include "criu/lazy_pages.h"
#include "criu/lazy_pages_keeper.h"
#include "criu/operation.h"
#include "criu/options.h"
#include "criu/task_credentials.h"
#include "cuda/gpu_map.h"
#include "gpu/processes.h"
#include "gpusnap/operations.h"
#include "gpushare/control/preload.h"
#include "gpushare/control/tree.h"
#include "host/huge_pages.h"
#include "net/tcp_ports.h"
#include "ns/reaper.h"
#include "ns/seccomp_filters.h"
#include "proc/credentials.h"
#include "proc/proc.h"
#include "registry/reference.h"
#include "registry/staged_pull.h"
#include "snapshot/gpu_steps.h"
#include "snapshot/phases.h"
#include "snapshot/placeholder.h"
#include "snapshot/privilege.h"
#include "snapshot/restore_turn.h"
#include "snapshot/rootfs_restore.h"
#include "store/layout.h"
#include "store/store.h"
#include "util/beside.h"
#include "util/clock.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/test_hooks.h"
#include "util/undo.h"

namespace gpusnap {

namespace {

namespace control = gpushare::control;

// The snapshot a restore reads.
struct RestoreSource {
  std::optional<Store> store;
  // A reference's, published when the restore is recorded; before the preload,
  // which waits on its chunks, so that it outlives it.
  std::unique_ptr<registry::StagedPull> pull;
  std::string dir;  // the snapshot's files: in the store, or the pull's staging (read beside by the digests)
  SnapshotMeta meta;

  std::set<std::string> Arriving() const { return pull ? pull->arriving() : std::set<std::string>(); }
};

// Step 2 of Restore: the store's snapshot, or a reference's files pulled now
// into the staging (its chunks arrive beside what follows). Phase
// `pull-files` for a reference.
Result<RestoreSource> OpenSource(const RestoreOptions& options, Phases& phases) {
  RestoreSource source;
  if (options.source.from_registry()) {
    phases.Start("pull-files");
    auto pull = registry::StagedPull::Begin({.store = options.store,
                                             .reference = *options.source.reference,
                                             .as_id = "",
                                             .access = options.registry,
                                             .progress = options.progress});
    if (!pull.ok()) return pull.status().Wrap(fmt::format("restore of `{}`", options.source.ToString()));
    source.pull = std::move(pull).value();
    phases.Done();
    source.meta = source.pull->meta();
    source.dir = source.pull->dir();
  }
  auto store = Store::Open(options.store, false);
  if (!store.ok() && store.status().code() == Code::kNotFound && !source.pull)
    return Status::Error(Code::kNotFound, "no snapshot `{}`: there is no store `{}` yet", options.source.id,
                         options.store);
  if (!store.ok()) return store.status();
  source.store = std::move(store).value();
  if (!source.pull) {
    GPUSNAP_ASSIGN_OR_RETURN(source.meta, source.store->Load(options.source.id));
    source.dir = source.store->SnapshotDir(source.meta.id);
  }
  return source;
}

// What the steps find and leave for the steps after them and for the undo.
struct RestoreRun {
  // The snapshot read: the store's, or a reference's being pulled.
  const RestoreSource* source = nullptr;
  std::future<Timed<Status>> digests;  // a GPU snapshot's, checked beside CRIU
  std::atomic<bool> criu_done{false};   // the digests' pace: until then they follow CRIU's reads
  std::optional<GpuRestore> gpu;        // a GPU snapshot's plan, preload and chunk lock (not a standby's)
  ns::SpawnedReaper reaper;
  bool into_container = false;
  std::string container_id;             // into a container: its full id
  proc::Credentials placeholder;        // into a container: what its init holds, no restored thread more
  std::vector<control::ShimProcess> held_shims;  // gpushare: loaded, their work held until the tree goes
  std::optional<criu::LazyPagesServer> lazy;  // --lazy-pages: the daemon serving the tree's memory, under its keeper
  std::string name;                     // the workload's, claimed until it is recorded
  std::optional<NameClaim> name_claim;
  std::optional<criu::Bundle> bundle;
  criu::Features features;
  std::vector<std::string> join_cgroups;  // a placeholder's: CRIU joins them
  std::string criu_work_dir;            // CRIU's logs (a lazy restore's: the daemon's dir)
  RestoreTurn turn;                     // images with deleted files: this restore's turn at CRIU
  std::optional<host::HugePagesWindow> huge_pages;  // --huge-pages: THP `always` while CRIU runs
  pid_t restored_root = 0;              // the tree's root, in its namespace (CRIU's answer)
  std::vector<pid_t> gpu_pids;          // host pids, in meta.gpu->ns_pids order
  RestoreResult result;

  // A restore that ends before CRIU has run lets the digests read at once:
  // the future's destructor waits for them.
  ~RestoreRun() { criu_done = true; }

  const SnapshotMeta& meta() const { return source->meta; }
  // What the steps hold only while they run: the name (recorded, or free for
  // a fallback), the turn at CRIU, the host's THP mode.
  void ReleaseHeld() {
    name_claim.reset();
    turn.Release();
    huge_pages.reset();
  }
  std::string Failed() const { return fmt::format("restore of `{}` failed", meta().id); }

  // The tasks CRIU left stopped go on, and are seen running (gpu_steps.h).
  Status LetGo() const { return LetTreeGo(reaper.reaper_pid, gpu_pids, held_shims); }

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

// Step 1: the snapshot's digests (beside CRIU for a GPU tree), the name, CRIU,
// and for a GPU snapshot its plan and the gpushare preload.
Status Verify(const RestoreOptions& options, Phases& phases, RestoreRun& run) {
  const RestoreSource& source = *run.source;
  const Store& store = *source.store;
  const SnapshotMeta& meta = source.meta;
  phases.Start("verify");
  // A GPU tree's digests are checked while CRIU restores it, every task left
  // stopped, and nothing of it runs before they all match; any other tree's
  // before CRIU starts.
  if (meta.gpu) {
    // CRIU sets the pace: it reads the images once from disk, in its order,
    // on cores of its own, and the digests follow it through the page cache.
    run.digests = Beside([&store, &meta, &source, &run] {
      return store.Verify(meta, source.dir,
                          {.spare_cores = 2, .reader_done = [&run] { return run.criu_done.load(); }});
    });
  } else {
    GPUSNAP_RETURN_IF_ERROR(store.Verify(meta, source.dir).Wrap("refusing to restore"));
  }
  run.name = RestoredWorkloadName(meta, options.name);
  // Held until the record is written: a restore or run racing for the name is refused before it starts anything.
  GPUSNAP_ASSIGN_OR_RETURN(run.name_claim, ClaimWorkloadName(run.name));
  GPUSNAP_ASSIGN_OR_RETURN(run.bundle, criu::FindBundle(options.criu_bundle));
  GPUSNAP_ASSIGN_OR_RETURN(run.features, criu::DetectFeatures(*run.bundle, meta.tcp_established));
  if (options.standby) {
    // Everything but the GPU: its GPUs are chosen, and its device memory made, at the wake (wake.cc).
    if (!meta.gpu)
      return Status::Error(Code::kInvalidArgument, "snapshot `{}` holds no GPU state: a standby would have nothing to "
                           "wake onto; restore it without --standby", meta.id);
    if (meta.gpu->gpushare)
      GPUSNAP_RETURN_IF_ERROR(control::CheckManifests(store.root(), source.dir + "/" + SnapshotFiles::kGpuDir,
                                                      meta.gpu->ns_pids, source.Arriving())
                                  .Wrap("refusing to restore"));
  } else if (meta.gpu) {
    GPUSNAP_ASSIGN_OR_RETURN(run.gpu, PlanGpuRestore(meta, store.root(), source.dir, options.gpus, source.Arriving(),
                                                     "restore", options.gpu_resources));
    if (meta.gpu->gpushare)
      StartGpusharePreload(*run.gpu, meta,
                           source.Arriving().empty() ? std::chrono::milliseconds(0)
                                                     : std::chrono::seconds(options.timeout_s),
                           [pull = source.pull.get()] { return pull ? pull->ChunkFailure() : Status::Ok(); },
                           control::kPreloadThreadsBesideCriu);
  } else if (!options.gpus.empty()) {
    return Status::Error(Code::kInvalidArgument, "snapshot `{}` holds no GPU state; --gpu-map and --gpus do not apply",
                         meta.id);
  }
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("verify"));
  phases.Done(meta.total_bytes);
  return Status::Ok();
}

// Step 2: a fresh namespace under its reaper, or an idle placeholder's.
Status EnterNamespace(const RestoreOptions& options, Phases& phases, RestoreRun& run, UndoStack& undo) {
  phases.Start("namespace");
  run.into_container = !options.into_container.empty();
  if (!run.into_container) {
    GPUSNAP_ASSIGN_OR_RETURN(run.reaper, ns::SpawnReaper({.workload_argv = {}, .log_path = "", .preload = ""}));
  } else {
    GPUSNAP_ASSIGN_OR_RETURN(auto target, FindIdlePlaceholder(options.into_container));
    run.reaper.reaper_pid = target.init_pid;
    run.container_id = std::move(target.container_id);
    run.join_cgroups = std::move(target.cgroup_procs);
  }
  undo.Push("tearing down the restored tree", [&run] { return run.TearDown(); });
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("namespace"));
  phases.Done();
  return Status::Ok();
}

// The source's log, a path on the node the snapshot names: for a tree in a
// fresh namespace, where its restored output goes; never used for one in a
// container, whose log the pod decides (nothing is ever written at a path a
// snapshot names outside the container it is restored into).
std::string SourceLog(const RestoreRun& run) { return run.into_container ? "" : run.meta().source.log; }

// What a thread holds, as /proc shows it, and, where the placeholder's init
// is filtered, the seccomp filters that bind it.
Result<proc::Credentials> LiveCredentials(pid_t pid, pid_t tid, bool with_filters) {
  GPUSNAP_ASSIGN_OR_RETURN(proc::Credentials creds, proc::ReadTaskCredentials(pid, tid));
  if (with_filters && creds.seccomp_mode == proc::SeccompMode::kFilter) {
    GPUSNAP_ASSIGN_OR_RETURN(creds.seccomp_filters, ns::ReadSeccompFilters(tid));
  }
  return creds;
}

// Step 2, into a container: the placeholder's init read, and every thread of
// the snapshot held to it (privilege.h) before anything is prepared for CRIU.
Status CheckSnapshotPrivilege(Phases& phases, RestoreRun& run) {
  if (!run.into_container) return Status::Ok();
  phases.Start("check-privilege");
  pid_t init = run.reaper.reaper_pid;
  auto placeholder = LiveCredentials(init, init, true);
  if (!placeholder.ok())
    return placeholder.status().Wrap(fmt::format("reading what placeholder container `{}` holds", run.container_id));
  run.placeholder = std::move(*placeholder);
  if (!SkipRequested("check-privilege")) {
    std::string images = run.source->dir + "/" + SnapshotFiles::kCheckpointDir;
    auto dumped = criu::ReadDumpedCredentials(images);
    if (!dumped.ok()) return dumped.status().Wrap("refusing to restore");
    std::vector<CheckedThread> threads;
    for (auto& t : *dumped)
      threads.push_back({.pid = t.pid, .tid = t.tid, .comm = std::move(t.comm), .creds = std::move(t.creds)});
    GPUSNAP_RETURN_IF_ERROR(CheckWithinPlaceholder(
        fmt::format("snapshot `{}` needs more privilege than placeholder container `{}` holds", run.meta().id,
                    run.container_id),
        "in the snapshot", threads, run.placeholder));
  }
  phases.Done();
  return Status::Ok();
}

// After step 3, into a container, before any restored thread runs: what CRIU gave
// each one, as /proc shows it, held to the placeholder's init again. A
// difference fails the restore, and its undo ends the tree.
Status CheckRestoredPrivilege(RestoreRun& run) {
  if (!run.into_container) return Status::Ok();
  bool filtered = run.placeholder.seccomp_mode == proc::SeccompMode::kFilter;
  std::vector<CheckedThread> threads;
  for (pid_t pid : proc::Tree(run.reaper.reaper_pid)) {
    if (pid == run.reaper.reaper_pid) continue;
    for (pid_t tid : proc::Threads(pid)) {
      auto creds = LiveCredentials(pid, tid, filtered);
      if (!creds.ok())
        return creds.status().Wrap(fmt::format("{}: reading what restored pid {} holds", run.Failed(), pid));
      auto comm = ReadFile(fmt::format("/proc/{}/task/{}/comm", pid, tid));
      std::string name = comm.ok() ? *comm : "";
      if (!name.empty() && name.back() == '\n') name.pop_back();
      threads.push_back({.pid = pid, .tid = tid, .comm = std::move(name), .creds = std::move(*creds)});
    }
  }
  return CheckWithinPlaceholder(fmt::format("{}: the tree CRIU restored holds more privilege than placeholder "
                                            "container `{}`",
                                            run.Failed(), run.container_id),
                                "as restored", threads, run.placeholder);
}

// Step 3, before CRIU: the tree's listening ports free again here, its turn
// at CRIU (images with deleted files), THP, and a lazy restore's page server.
Status PrepareCriu(const RestoreOptions& options, Phases& phases, RestoreRun& run, UndoStack& undo) {
  const SnapshotMeta& meta = run.meta();
  if (!run.into_container && !meta.listen_ports.empty()) {
    phases.Start("free-ports");
    std::vector<uint16_t> ports(meta.listen_ports.begin(), meta.listen_ports.end());
    GPUSNAP_RETURN_IF_ERROR(net::FreeTimeWaitPorts(ports, std::chrono::seconds(65), [&](const std::string& why) {
                              if (options.progress) options.progress({"free-ports: " + why, 0, 0, false});
                            }).Wrap(run.Failed()));
    phases.Done();
  }
  std::string images = run.source->dir + "/" + SnapshotFiles::kCheckpointDir;
  // Restores whose images hold deleted files take turns, from here to CRIU's end (restore_turn.h).
  GPUSNAP_ASSIGN_OR_RETURN(run.turn, TakeRestoreTurn({.images_dir = images,
                                                      .root = fmt::format("/proc/{}/root", run.reaper.reaper_pid),
                                                      .snapshot_id = meta.id,
                                                      .timeout = std::chrono::seconds(options.timeout_s),
                                                      .progress = options.progress},
                                                     phases));
  if (options.huge_pages) {
    GPUSNAP_ASSIGN_OR_RETURN(run.huge_pages, host::HugePagesWindow::Open(host::ThpFile(), RunDir() + "/thp"));
    PauseIfRequested("huge-pages");
  }
  run.criu_work_dir = RunDir() + "/logs";
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(run.criu_work_dir));
  if (!options.lazy_pages) return Status::Ok();
  // CRIU's work dir is the daemon's: the restore finds it by its socket there.
  phases.Start("lazy-pages-start");
  GPUSNAP_RETURN_IF_ERROR(criu::CheckLazyPages(*run.bundle).Wrap("refusing to restore"));
  GPUSNAP_ASSIGN_OR_RETURN(run.criu_work_dir, criu::MakeLazyPagesWorkDir(RunDir(), run.name));
  GPUSNAP_ASSIGN_OR_RETURN(run.lazy, criu::LazyPagesServer::Start({.bundle = &*run.bundle,
                                                            .images_dir = std::filesystem::absolute(images).string(),
                                                            .work_dir = run.criu_work_dir,
                                                            .reaper_pid = run.reaper.reaper_pid,
                                                            .into_container = run.into_container,
                                                            .workload_name = run.name,
                                                            .workload_log = SourceLog(run),
                                                            .verbose = options.verbose}));
  undo.Push("stopping the lazy-pages server", [&run] { return run.lazy->Stop(); });
  PauseIfRequested("lazy-pages");
  phases.Done();
  return Status::Ok();
}

// Step 3: CRIU restores the tree inside the namespace, every task left
// stopped; then the verdicts beside it (the digests, the page server).
Status RunCriu(const RestoreOptions& options, Phases& phases, RestoreRun& run) {
  const SnapshotMeta& meta = run.meta();
  phases.Start("criu-restore");
  std::string images = run.source->dir + "/" + SnapshotFiles::kCheckpointDir;
  std::string log_name = fmt::format("restore-{}-{}.log", meta.id, ::getpid());
  UniqueFd images_fd(::open(images.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd work_fd(::open(run.criu_work_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
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
  criu::Operation op = criu::MakeOperation(*run.bundle, RESTORE, criu::RestoreOptions(plan, run.features),
                                           run.reaper.reaper_pid, std::chrono::seconds(options.timeout_s),
                                           run.criu_work_dir + "/" + log_name);
  op.join_cgroups = run.join_cgroups;
  op.ns_last_pid = ns::HighNsLastPid();  // CRIU's own pids clear of the tree's
  if (run.turn.held()) op.inherit_fds.push_back(run.turn.fd());  // a CRIU outliving us keeps the turn
  op.on_notify = [&run](const std::string& script, int) {
    PauseIfRequested("criu-" + script);  // for the crash tests: a point inside CRIU's restore
    return run.lazy ? run.lazy->OnCriuNotify(script) : Status::Ok();
  };
  run.result.log = op.log_path;
  auto resp = criu::Run(op);
  run.turn.Release();  // CRIU has exited, and its ghosts are gone
  run.criu_done = true;
  if (run.huge_pages) {
    // The host's mode back as soon as CRIU is done: a failure to is told, not the restore's.
    if (Status closed = run.huge_pages->Close(); !closed.ok() && options.progress)
      options.progress({"huge-pages: " + closed.message(), 0, 0, false});
  }
  if (run.digests.valid()) {
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
      return Status::Error(resp.status().code(), "{}: {}\n(and {})", run.Failed(), resp.status().message(),
                           served.message());
    if (!served.ok()) return served.Wrap(run.Failed());
  }
  // The undo tears down what CRIU left: it rolls back what it fails, but one
  // that answered success and then died leaves a tree that must not stay.
  if (!resp.ok()) return resp.status().Wrap(run.Failed());
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("criu-restore"));
  run.restored_root = resp->restore().pid();
  if (meta.gpu)
    for (int ns_pid : meta.gpu->ns_pids) {
      GPUSNAP_ASSIGN_OR_RETURN(pid_t p, proc::WaitForNsPid(run.reaper.reaper_pid, ns_pid));
      run.gpu_pids.push_back(p);
    }
  phases.Done();
  return Status::Ok();
}

// Step 4: the GPU processes restored onto the planned GPUs (gpu_steps.h); a
// reference's chunks all in before the shims load what was not preloaded.
Status RestoreGpu(const RestoreOptions& options, Phases& phases, RestoreRun& run) {
  if (!run.gpu) return Status::Ok();  // no GPU state, or a standby (its wake takes this step)
  const RestoreSource& source = *run.source;
  GpuStep step{.gpu = &*run.gpu,
               .meta = &source.meta,
               .gpu_pids = run.gpu_pids,
               .timeout = std::chrono::seconds(options.timeout_s),
               .before_load = nullptr,
               .progress = options.progress,
               .failed = run.Failed()};
  if (source.pull) {
    step.before_load = [&source, &phases] {
      auto t = std::chrono::steady_clock::now();
      Status arrived = source.pull->WaitForChunks();
      phases.timings()["pull-chunks-wait"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      return arrived;
    };
  }
  GPUSNAP_ASSIGN_OR_RETURN(run.held_shims, RestoreGpuProcesses(step, phases));
  return Status::Ok();
}

// Step 5: a pulled snapshot joins the store, the reaper keeps the tree, the
// tree goes (a standby's stays stopped), and the workload is recorded.
Status Record(const RestoreOptions& options, Phases& phases, RestoreRun& run) {
  const RestoreSource& source = *run.source;
  const SnapshotMeta& meta = source.meta;
  GPUSNAP_ASSIGN_OR_RETURN(pid_t host_pid, proc::WaitForNsPid(run.reaper.reaper_pid, run.restored_root));
  GPUSNAP_ASSIGN_OR_RETURN(auto stat, proc::ReadStat(host_pid));
  PauseIfRequested("record");
  GPUSNAP_RETURN_IF_ERROR(InjectedFailure("record"));
  if (source.pull) {  // nothing reads the staging any more
    // A standby's wake reads its chunks from the store: all of them, first.
    if (options.standby) GPUSNAP_RETURN_IF_ERROR(source.pull->WaitForChunks());
    GPUSNAP_ASSIGN_OR_RETURN(run.result.pulled, source.pull->Publish());
    phases.timings()["pull"] = run.result.pulled->seconds;
  }
  if (run.lazy) GPUSNAP_RETURN_IF_ERROR(run.lazy->Commit().Wrap(run.Failed()));
  GPUSNAP_RETURN_IF_ERROR(ns::CommitHold(run.reaper));
  if (!options.standby) {  // a standby's tree stays stopped until its wake
    phases.Start(meta.gpu && meta.gpu->gpushare ? "gpushare-resume" : "let-go");
    GPUSNAP_RETURN_IF_ERROR(run.LetGo().Wrap(run.Failed()));
    phases.Done();
  }
  Workload& w = run.result.workload;
  w.name = run.name;
  w.pid = host_pid;
  w.reaper_pid = run.reaper.reaper_pid;
  w.cmdline = meta.source.cmdline;
  w.log = SourceLog(run);
  w.started = NowRfc3339();
  w.restored_from = meta.id;
  w.start_time = stat.start_time;
  w.standby = options.standby;
  w.store = options.standby ? source.store->root() : "";
  w.running = true;
  if (run.lazy) w.lazy_pages = run.lazy->work_dir();
  return RecordWorkload(w, std::move(*run.name_claim));
}

// The process story: the steps in order, one undo exit (Restore's WithUndo).
Result<RestoreResult> TakeRestore(const RestoreOptions& options, Phases& phases, RestoreRun& run, UndoStack& undo) {
  // 1. Verify, and plan the GPUs.
  GPUSNAP_RETURN_IF_ERROR(Verify(options, phases, run));
  // 2. The namespace, and into a container, the snapshot's privilege held to its init's.
  GPUSNAP_RETURN_IF_ERROR(EnterNamespace(options, phases, run, undo));
  GPUSNAP_RETURN_IF_ERROR(CheckSnapshotPrivilege(phases, run));
  // 3. CRIU, once the ports, the turn, THP and a page server are ready; into
  // a container, what it restored held to the placeholder's init again.
  GPUSNAP_RETURN_IF_ERROR(PrepareCriu(options, phases, run, undo));
  GPUSNAP_RETURN_IF_ERROR(RunCriu(options, phases, run));
  GPUSNAP_RETURN_IF_ERROR(CheckRestoredPrivilege(run));
  // 4. GPU (a standby: at its wake, wake.cc).
  GPUSNAP_RETURN_IF_ERROR(RestoreGpu(options, phases, run));
  // 5. Record it: the point of no return.
  GPUSNAP_RETURN_IF_ERROR(Record(options, phases, run));
  undo.Disarm();
  phases.Total();
  run.result.timings_s = phases.timings();
  return std::move(run.result);
}

}  // namespace

std::string RestoredWorkloadName(const SnapshotMeta& meta, const std::string& asked) {
  if (!asked.empty()) return asked;
  if (!meta.source.name.empty()) return meta.source.name;
  return "restored-" + std::to_string(meta.source.host_pid);
}

Status CheckRestoreOptions(const RestoreOptions& options) {
  if (options.source.id.empty() && !options.source.from_registry())
    return Status::Error(Code::kInvalidArgument, "no snapshot id or registry reference to restore");
  if (options.standby && !options.into_container.empty())
    return Status::Error(Code::kNotSupported, "--standby restores into a fresh namespace only, not into a container");
  if (options.standby && !options.gpus.empty())
    return Status::Error(Code::kInvalidArgument, "a standby's GPUs are chosen when it is woken: give --gpu-map or "
                         "--gpus to `gpusnap wake`, not with --standby");
  return Status::Ok();
}

Result<RestoreResult> Restore(const RestoreOptions& given) {
  // 1. The options: refused before anything is read or fetched.
  GPUSNAP_RETURN_IF_ERROR(CheckRestoreOptions(given));
  RestoreOptions options = given;
  options.store = StoreOrDefault(options.store);
  Phases phases(options.progress);

  // 2. The source.
  GPUSNAP_ASSIGN_OR_RETURN(RestoreSource source, OpenSource(options, phases));
  if (options.on_source_opened) GPUSNAP_RETURN_IF_ERROR(options.on_source_opened(source.meta));
  const CapturePathRecord& captured = source.meta.capture_path;

  // 3. By the capture path. A rootfs capture from a registry joins the store
  // whole first (it has no chunks to stream beside CRIU).
  if (!captured.has_process()) {
    std::optional<TransferResult> pulled;
    if (source.pull) {
      GPUSNAP_ASSIGN_OR_RETURN(pulled, source.pull->Publish());
    }
    GPUSNAP_ASSIGN_OR_RETURN(RestoreResult rootfs, RestoreRootfs(options, *source.store, source.meta, ""));
    if (pulled) rootfs.timings_s["pull"] = pulled->seconds;
    rootfs.pulled = std::move(pulled);
    return rootfs;
  }
  RestoreRun run;  // before the undo, whose steps refer to it
  run.source = &source;
  auto restored = WithUndo([&](UndoStack& undo) { return TakeRestore(options, phases, run, undo); });
  run.ReleaseHeld();
  // A `both` snapshot of the store whose process part cannot run on this
  // node: its rootfs part, into the placeholder the undo left idle.
  if (restored.ok() || !captured.has_rootfs() || options.into_container.empty() || source.pull ||
      restored.status().code() == Code::kCorruption)
    return restored;
  std::string why = fmt::format("the process restore cannot run here: {}", restored.status().message());
  auto rootfs = RestoreRootfs(options, *source.store, source.meta, why);
  if (!rootfs.ok())
    return rootfs.status().Wrap(fmt::format("{}; the rootfs path then failed too", why));
  return rootfs;
}

}  // namespace gpusnap
