// The restore, as DESIGN.md §3 tells it (the CPU steps; GPU steps join here).
//
// 1. Verify the snapshot (schema, every file's digest) and, for a GPU
//    snapshot, that this machine's driver and GPUs fit, before anything starts.
// 2. Start a fresh pid + mount namespace held by a reaper; or, into a
//    container, check that its init is an idle placeholder and use that.
// 3. CRIU restores the tree inside it (pids as at dump: the namespace is new);
//    GPU processes come back stopped, as they were dumped.
// 4. GPU processes: restore all (onto the mapped GPUs), unlock all only
//    then, let their threads run (snapshot/gpu.h).
// 5. Find the restored root's host pid, record the workload, release the
//    namespace to its reaper.
// A failure at any step tears the new namespace down (into a container: the
// restored processes, leaving the placeholder idle); the store is untouched.
#include <fcntl.h>
#include <unistd.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>

#include "criu/bundle.h"
#include "criu/operation.h"
#include "criu/options.h"
#include "gpusnap/operations.h"
#include "ns/proc.h"
#include "ns/reaper.h"
#include "cuda/gpu_map.h"
#include "gpushare/chunk_copy.h"
#include "gpushare/chunk_lock.h"
#include "gpushare/preload.h"
#include "gpushare/tree.h"
#include "snapshot/gpu.h"
#include "snapshot/format.h"
#include "snapshot/phases.h"
#include "snapshot/tcp_ports.h"
#include "snapshot/placeholder.h"
#include "store/store.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/test_hooks.h"

namespace gpusnap {

namespace {

Result<pid_t> HostPidOf(pid_t reaper, pid_t ns_pid) {
  for (int tries = 0; tries < 400; ++tries) {
    for (pid_t c : proc::Tree(reaper)) {
      auto nspids = proc::NsPids(c);
      if (nspids.ok() && !nspids->empty() && nspids->back() == ns_pid) return c;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Status::Error(Code::kExternal, "the restored task (pid {} in its namespace) did not appear", ns_pid);
}

// gpu::Resume on a thread of its own, waited for until `timeout`: a driver
// restore can block without end, and a restore must still answer. On timeout
// the thread is left behind (it owns its ptrace stops and shares the driver);
// the caller tears the namespace down, which ends the processes it waits on.
Status ResumeWithDeadline(std::shared_ptr<cuda::Driver> driver, std::vector<pid_t> pids, std::vector<pid_t> tids,
                          cuda::GpuMap map, std::chrono::seconds timeout, std::map<std::string, double>& timings) {
  struct Outcome {
    Status status;
    std::map<std::string, double> timings;
  };
  auto promise = std::make_shared<std::promise<Outcome>>();
  auto future = promise->get_future();
  std::thread([driver, pids = std::move(pids), tids = std::move(tids), map = std::move(map), promise] {
    Outcome o;
    o.status = gpu::Resume(*driver, pids, tids, map, o.timings);
    promise->set_value(std::move(o));
  }).detach();
  if (future.wait_for(timeout) != std::future_status::ready)
    return Status::Error(Code::kTimeout, "the GPU restore did not finish within {} s", timeout.count());
  Outcome o = future.get();
  timings.insert(o.timings.begin(), o.timings.end());
  return o.status;
}

// `fn()` on a thread of its own, beside the restore's steps: its result and
// how long it took.
template <typename T>
struct Timed {
  T value;
  double seconds = 0;
};
template <typename Fn>
auto Beside(Fn fn) {
  return std::async(std::launch::async, [fn = std::move(fn)] {
    auto t0 = std::chrono::steady_clock::now();
    auto value = fn();
    return Timed<decltype(value)>{std::move(value),
                                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  });
}

using Preload = std::future<Timed<Result<gpushare::PreloadedMemory>>>;

// gpushare: the shims' own allocations made and filled here, on the GPUs
// they go to, while CRIU restores the processes (gpushare/preload.h).
// GPUSNAP_GPUSHARE_PRELOAD=0 leaves all of it to the shims' load (no future).
Preload StartPreload(const cuda::Driver& driver, const SnapshotGpuState& gpu, const std::string& chunk_store,
                     const std::string& manifest_dir, const cuda::GpuMap& map, std::vector<cuda::GpuInfo> here) {
  const char* enabled = std::getenv("GPUSNAP_GPUSHARE_PRELOAD");
  if (enabled != nullptr && std::string_view(enabled) == "0") return {};
  std::vector<gpushare::PreloadTarget> targets;
  for (int ns_pid : gpu.ns_pids) targets.push_back({ns_pid, gpushare::ManifestPath(manifest_dir, {0, ns_pid, ""})});
  auto device_for = [map, here = std::move(here)](const cuda::Uuid& uuid) {
    return cuda::OrdinalAfterMap(uuid, map, here);
  };
  unsigned threads = gpushare::ThreadsFromEnv("GPUSNAP_GPUSHARE_PRELOAD_THREADS", 12);
  return Beside([libcuda = driver.path(), chunk_store, targets, device_for, threads] {
    return gpushare::PreloadedMemory::Make(libcuda, chunk_store, targets, device_for, threads);
  });
}

}  // namespace

Result<RestoreResult> Restore(const RestoreOptions& options) {
  RestoreResult result;
  Phases phases(options.progress);

  // 1. Verify.
  phases.Start("verify");
  GPUSNAP_ASSIGN_OR_RETURN(auto store, Store::Open(options.store.empty() ? DefaultStore() : options.store, false));
  GPUSNAP_ASSIGN_OR_RETURN(auto meta, store.Load(options.id));
  // A GPU tree's digests are checked while CRIU restores it, every task left
  // stopped, and nothing of it runs before they all match; any other tree's
  // before CRIU starts.
  bool verify_alongside = meta.gpu.has_value();
  std::future<Timed<Status>> verified;
  if (verify_alongside) {
    verified = Beside([&store, &meta] { return store.Verify(meta); });
  } else {
    GPUSNAP_RETURN_IF_ERROR(store.Verify(meta).Wrap("refusing to restore"));
  }
  std::string name = options.name.empty() ? meta.source.name : options.name;
  if (name.empty()) name = "restored-" + std::to_string(meta.source.host_pid);
  // Held until the record is written: a restore or run racing for the name is refused before it starts anything.
  GPUSNAP_ASSIGN_OR_RETURN(NameClaim name_claim, ClaimWorkloadName(name));
  GPUSNAP_ASSIGN_OR_RETURN(auto bundle, criu::FindBundle(options.criu_bundle));
  GPUSNAP_ASSIGN_OR_RETURN(auto features, criu::DetectFeatures(bundle, meta.tcp_established));
  // Shared: a driver call that never returns keeps it alive past our return.
  std::shared_ptr<cuda::Driver> driver;
  cuda::GpuMap gpu_map;
  std::string gpu_dir = store.SnapshotDir(meta.id) + "/" + format::kGpuDir;  // gpushare manifests
  std::optional<ChunkStoreLock> chunk_lock;  // gpushare: held shared until every chunk is loaded
  Preload preload;
  if (meta.gpu) {
    GPUSNAP_ASSIGN_OR_RETURN(auto loaded, cuda::Driver::Load());
    driver = std::make_shared<cuda::Driver>(std::move(loaded));
    GPUSNAP_ASSIGN_OR_RETURN(auto here, cuda::ListGpus(*driver));
    GPUSNAP_ASSIGN_OR_RETURN(auto kernel_driver, gpu::KernelDriverVersion());
    GPUSNAP_ASSIGN_OR_RETURN(gpu_map, gpu::PlanGpuMap(*meta.gpu, here, options.gpu_map, options.gpus));
    GPUSNAP_RETURN_IF_ERROR(gpu::CheckCompatible(*meta.gpu, here, kernel_driver, gpu_map).Wrap("refusing to restore"));
    if (meta.gpu->gpushare) {
      GPUSNAP_ASSIGN_OR_RETURN(auto lock, ChunkStoreLock::Acquire(store.root(), ChunkStoreLock::Mode::kShared,
                                                                  kChunkWriterWaitMs));
      chunk_lock.emplace(std::move(lock));
      GPUSNAP_RETURN_IF_ERROR(
          gpushare::CheckManifests(store.root(), gpu_dir, meta.gpu->ns_pids).Wrap("refusing to restore"));
      preload = StartPreload(*driver, *meta.gpu, store.root(), gpu_dir, gpu_map, here);
    }
  } else if (!options.gpu_map.empty() || !options.gpus.empty()) {
    return Status::Error(Code::kInvalidArgument, "snapshot `{}` holds no GPU state; --gpu-map and --gpus do not apply",
                         meta.id);
  }
  phases.Done(meta.total_bytes);

  // 2. The namespace.
  phases.Start("namespace");
  ns::SpawnedReaper reaper;
  std::vector<std::string> join_cgroups;
  if (options.into_container.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(reaper, ns::SpawnReaper({.workload_argv = {}, .log_path = "", .ns_last_pid = ns::HighNsLastPid(), .preload = ""}));
  } else {
    GPUSNAP_ASSIGN_OR_RETURN(auto target, FindIdlePlaceholder(options.into_container));
    reaper.reaper_pid = target.init_pid;
    join_cgroups = std::move(target.cgroup_procs);
  }
  // What a failure after CRIU started leaves: nothing of the restore. A fresh
  // namespace goes as a whole; a placeholder stays, idle again.
  auto tear_down = [&] {
    if (options.into_container.empty()) {
      ::kill(reaper.reaper_pid, SIGTERM);
      return;
    }
    for (pid_t p : proc::Tree(reaper.reaper_pid))
      if (p != reaper.reaper_pid) ::kill(p, SIGKILL);
  };
  phases.Done();

  // 3. CRIU, once the tree's listening ports are free again here.
  if (options.into_container.empty() && !meta.listen_ports.empty()) {
    phases.Start("free-ports");
    std::vector<uint16_t> ports(meta.listen_ports.begin(), meta.listen_ports.end());
    Status freed = FreeTimeWaitPorts(ports, std::chrono::seconds(65), [&](const std::string& why) {
      if (options.progress) options.progress({"free-ports: " + why, 0, 0, false});
    });
    if (!freed.ok()) {
      tear_down();
      return freed.Wrap(fmt::format("restore of `{}` failed", meta.id));
    }
    phases.Done();
  }
  phases.Start("criu-restore");
  std::string images = store.SnapshotDir(meta.id) + "/" + format::kCheckpointDir;
  std::string logs = RunDir() + "/logs";
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(logs));
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
  plan.keep_criu_cgroups = !options.into_container.empty();
  plan.leave_stopped = verify_alongside;
  criu::Operation op = criu::MakeOperation(bundle, RESTORE, criu::RestoreOptions(plan, features), reaper.reaper_pid,
                                           std::chrono::seconds(options.timeout_s), logs + "/" + log_name);
  op.join_cgroups = join_cgroups;
  result.log = op.log_path;
  auto resp = criu::Run(op);
  if (verify_alongside) {
    // A bad snapshot is the cause of whatever CRIU made of it.
    Timed<Status> digests = verified.get();
    phases.timings()["verify-digests"] = digests.seconds;
    if (!digests.value.ok()) {
      if (resp.ok()) tear_down();
      return digests.value.Wrap("refusing to restore");
    }
  }
  if (!resp.ok()) return resp.status().Wrap(fmt::format("restore of `{}` failed", meta.id));
  std::vector<pid_t> gpu_pids;
  if (meta.gpu) {
    for (int ns_pid : meta.gpu->ns_pids) {
      GPUSNAP_ASSIGN_OR_RETURN(pid_t p, HostPidOf(reaper.reaper_pid, ns_pid));
      gpu_pids.push_back(p);
    }
  }
  if (verify_alongside) {
    // Verified: the tasks CRIU left stopped go on, but for the GPU processes,
    // which stay stopped for the GPU steps, as they were dumped.
    for (pid_t p : proc::Tree(reaper.reaper_pid))
      if (p != reaper.reaper_pid && std::find(gpu_pids.begin(), gpu_pids.end(), p) == gpu_pids.end())
        ::kill(p, SIGCONT);
  }
  phases.Done();

  // 4. GPU.
  if (driver) {
    std::vector<pid_t> tids(meta.gpu->restore_tids.begin(), meta.gpu->restore_tids.end());
    Status st = ResumeWithDeadline(driver, gpu_pids, tids, gpu_map, std::chrono::seconds(options.timeout_s),
                                   phases.timings());
    if (!st.ok()) {
      // A tree whose GPU state did not come back must not run on half-restored.
      tear_down();
      return st.Wrap(fmt::format("restore of `{}` failed", meta.id));
    }
    if (options.progress)
      options.progress({"gpu-restore", phases.timings()["gpu-restore"] + phases.timings()["gpu-unlock"], 0, true});
    if (meta.gpu->gpushare) {
      // The driver restored the contexts with the device memory left out; the
      // shims now load it from the chunk store, then let their held work go.
      phases.Start("gpushare-load");
      std::vector<gpushare::ShimProcess> procs;
      for (size_t i = 0; i < gpu_pids.size(); ++i)
        procs.push_back({gpu_pids[i], meta.gpu->ns_pids[i], meta.gpu->control_sockets[i]});
      std::optional<gpushare::PreloadedMemory> preloaded;
      if (preload.valid()) {
        Timed<Result<gpushare::PreloadedMemory>> made = preload.get();
        phases.timings()["gpushare-preload"] = made.seconds;
        Status adopted = made.value.ok()
                             ? gpushare::AdoptPreloaded(procs, *(preloaded = std::move(*made.value)), phases.timings())
                             : made.value.status();
        // Only an optimisation: what was not adopted, the processes load.
        if (!adopted.ok() && options.progress)
          options.progress({"gpushare-preload: " + adopted.message() + "; the processes load that memory themselves",
                            0, 0, false});
      }
      PauseIfRequested("gpushare-load");
      Status loaded = gpushare::LoadAll(procs, store.root(), gpu_dir, phases.timings());
      preloaded.reset();  // what the processes adopted is theirs now
      chunk_lock.reset();
      if (!loaded.ok()) {
        tear_down();
        return loaded.Wrap(fmt::format("restore of `{}` failed", meta.id));
      }
      phases.Done();
    }
  }

  // 4. Record it.
  GPUSNAP_ASSIGN_OR_RETURN(pid_t host_pid, HostPidOf(reaper.reaper_pid, resp->restore().pid()));
  GPUSNAP_RETURN_IF_ERROR(ns::CommitHold(reaper));
  Workload& w = result.workload;
  w.name = name;
  w.pid = host_pid;
  w.reaper_pid = reaper.reaper_pid;
  w.cmdline = meta.source.cmdline;
  w.log = meta.source.log;
  w.started = NowRfc3339();
  w.restored_from = meta.id;
  GPUSNAP_ASSIGN_OR_RETURN(auto st, proc::ReadStat(host_pid));
  w.start_time = st.start_time;
  w.running = true;
  GPUSNAP_RETURN_IF_ERROR(RecordWorkload(w, std::move(name_claim)));
  phases.Total();
  result.timings_s = phases.timings();
  return result;
}

}  // namespace gpusnap
