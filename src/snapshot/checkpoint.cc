// The checkpoint, as DESIGN.md §2 tells it (the CPU steps; GPU steps join here).
//
// 1. Resolve the target to a process tree and the namespace CRIU must enter;
//    find its GPU processes.
// 2. Start a snapshot in the store (.tmp-<id>, locked by us).
// 3. GPU processes: lock all, stop their CPU threads, checkpoint all
//    (snapshot/gpu.h). From here on, any failure resumes them.
//    CRIU then dumps the tree from inside its namespace.
// 4. At CRIU's post-dump notification, while the tree is still frozen,
//    publish the snapshot (digests, fsync, rename). Only after we answer does
//    CRIU kill the tree (or, with --leave-running, resume it). A failure or a
//    crash before that answer makes CRIU resume the tree: the source is never
//    lost, and no half snapshot is ever visible.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <cstdlib>
#include <filesystem>

#include "criu/bundle.h"
#include "criu/operation.h"
#include "criu/options.h"
#include "ns/proc.h"
#include "gpushare/chunk_lock.h"
#include "gpushare/tree.h"
#include "snapshot/checkpointable.h"
#include "snapshot/gpu.h"
#include "gpusnap/operations.h"
#include "snapshot/container_files.h"
#include "snapshot/format.h"
#include "snapshot/phases.h"
#include "snapshot/tcp_ports.h"
#include "snapshot/target.h"
#include "store/store.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/test_hooks.h"

namespace gpusnap {

namespace {

SnapshotMeta DescribeSource(const Target& t, const std::string& id, const std::string& criu_version, bool tcp) {
  SnapshotMeta m;
  m.id = id;
  m.created = NowRfc3339();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  m.hostname = host;
  struct utsname u{};
  if (::uname(&u) == 0) m.kernel = u.release;
  m.source.kind = t.name.empty() ? "pid" : "workload";
  m.source.name = t.name;
  m.source.host_pid = t.host_pid;
  m.source.ns_pid = t.ns_pid;
  m.source.cmdline = t.cmdline;
  m.source.log = t.log;
  m.criu_version = criu_version;
  m.tcp_established = tcp;
  m.shell_job = t.shell_job;
  m.pids.assign(t.tree.begin(), t.tree.end());
  return m;
}

}  // namespace

std::string DefaultStore() {
  const char* env = std::getenv("GPUSNAP_STORE");
  return env && *env ? env : "/var/lib/gpusnap";
}

Result<SnapshotMeta> Checkpoint(const CheckpointOptions& options) {
  Phases phases(options.progress);

  // 1. The tree and CRIU.
  phases.Start("resolve");
  GPUSNAP_ASSIGN_OR_RETURN(auto target, ResolveTarget(options.target));
  std::vector<ProcessFiles> tree_files = ReadProcessFiles(target.tree);
  GPUSNAP_RETURN_IF_ERROR(CheckCheckpointable(tree_files));
  GPUSNAP_ASSIGN_OR_RETURN(auto bundle, criu::FindBundle(options.criu_bundle));
  GPUSNAP_ASSIGN_OR_RETURN(auto features, criu::DetectFeatures(bundle, options.tcp_established));
  std::vector<pid_t> gpu_pids = gpu::FindGpuProcesses(target.tree);
  std::optional<cuda::Driver> driver;
  std::optional<SnapshotGpuState> gpu_state;
  if (!gpu_pids.empty()) {
    // One driver, one cuInit, for every GPU process of the tree.
    GPUSNAP_ASSIGN_OR_RETURN(auto loaded, cuda::Driver::Load());
    driver.emplace(std::move(loaded));
    GPUSNAP_ASSIGN_OR_RETURN(auto visible, cuda::ListGpus(*driver));
    GPUSNAP_ASSIGN_OR_RETURN(auto kernel_driver, gpu::KernelDriverVersion());
    std::vector<int> ns_pids;
    for (pid_t p : gpu_pids) {
      GPUSNAP_ASSIGN_OR_RETURN(auto nspids, proc::NsPids(p));
      ns_pids.push_back(nspids.back());
    }
    gpu_state = gpu::Describe(*driver, visible, gpu_pids, ns_pids, kernel_driver);
  }
  // With the gpushare shim in the GPU processes, their device memory goes to
  // the chunk store instead of through the driver's checkpoint.
  GPUSNAP_ASSIGN_OR_RETURN(auto shim_procs, gpushare::FindShimProcesses(gpu_pids));
  if (!shim_procs.empty()) {
    gpu_state->gpushare = true;
    gpu_state->shim = gpushare::MappedShimPath(gpu_pids.front());
    for (const auto& p : shim_procs) gpu_state->control_sockets.push_back(p.socket);
  }
  phases.Done();

  // 2. A private, locked directory in the store; stale ones of crashed runs go.
  GPUSNAP_ASSIGN_OR_RETURN(auto store, Store::Open(options.store.empty() ? DefaultStore() : options.store, true));
  store.CleanStaleTemporaries();
  std::string id = options.id.empty() ? NewSnapshotId(target.name.empty() ? "pid" + std::to_string(target.host_pid)
                                                                         : target.name)
                                      : options.id;
  GPUSNAP_ASSIGN_OR_RETURN(auto pending, store.Begin(id));
  SnapshotMeta meta = DescribeSource(target, id, fmt::format("{}.{}", features.version_major, features.version_minor),
                                     options.tcp_established);
  meta.gpu = gpu_state;
  for (uint16_t port : TreeListeningPorts(tree_files)) meta.listen_ports.push_back(port);
  if (meta.gpu && meta.gpu->gpushare) meta.gpu->chunk_store = store.root();
  GPUSNAP_RETURN_IF_ERROR(WriteFileSynced(pending.dir() + "/" + format::kConfigDump, ConfigDumpJson(meta, target.started)));
  GPUSNAP_RETURN_IF_ERROR(WriteFileSynced(pending.dir() + "/" + format::kSpecDump, SpecDumpJson(meta)));
  std::string images = pending.dir() + "/" + format::kCheckpointDir;
  if (::mkdir(images.c_str(), 0700) != 0) return Status::Errno(errno, "creating `{}`", images);
  UniqueFd images_fd(::open(images.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  UniqueFd work_fd(::open(pending.dir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!images_fd.valid() || !work_fd.valid()) return Status::Errno(errno, "opening `{}`", images);

  // 3. The dump.
  criu::DumpPlan plan;
  plan.root_pid = target.ns_pid;
  plan.images_dir_fd = images_fd.get();
  plan.work_dir_fd = work_fd.get();
  plan.log_file = format::kDumpLog;
  plan.leave_running = options.leave_running;
  plan.tcp_established = options.tcp_established;
  plan.shell_job = target.shell_job;
  plan.verbose = options.verbose;
  plan.config_file = options.criu_config;

  criu::Operation dump = criu::MakeOperation(bundle, DUMP, criu::DumpOptions(plan, features), target.ns_holder,
                                             std::chrono::seconds(options.timeout_s),
                                             pending.dir() + "/" + format::kDumpLog);

  // 4. Publish while the tree is frozen.
  bool published = false;
  dump.on_notify = [&](const std::string& script, int) -> Status {
    if (script != "post-dump") return Status::Ok();
    phases.Done(0);
    PauseIfRequested("post-dump");
    phases.Start("publish");
    meta.timings_s = phases.timings();
    Status st = pending.Publish(meta);
    if (!st.ok()) return st.Wrap("publishing the snapshot");
    published = true;
    phases.Done(meta.total_bytes);
    PauseIfRequested("published");
    return Status::Ok();
  };
  PauseIfRequested("dump");
  // The manifests move with the snapshot when it is published.
  auto manifest_dir = [&] { return (published ? store.SnapshotDir(id) : pending.dir()) + "/" + format::kGpuDir; };
  auto load_gpushare = [&]() -> Status {
    if (shim_procs.empty()) return Status::Ok();
    std::map<std::string, double> ignored;
    return gpushare::LoadAll(shim_procs, store.root(), manifest_dir(), ignored)
        .Wrap("bringing back the device memory of the GPU processes");
  };
  // From here to the end, gpusnap holds the chunk store lock shared: no chunk
  // the release finds present, and none the loads below read, can be
  // collected before a published manifest names it (gpushare/chunk_lock.h).
  std::optional<ChunkStoreLock> chunk_lock;
  if (!shim_procs.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(auto lock, ChunkStoreLock::Acquire(store.root(), ChunkStoreLock::Mode::kShared,
                                                                kChunkWriterWaitMs));
    chunk_lock.emplace(std::move(lock));
    phases.Start("gpushare-release");
    std::string dir = manifest_dir();
    if (::mkdir(dir.c_str(), 0700) != 0) return Status::Errno(errno, "creating `{}`", dir);
    GPUSNAP_RETURN_IF_ERROR(gpushare::ReleaseAll(shim_procs, store.root(), dir, options.gpu_lock_timeout_ms,
                                                 phases.timings())
                                .Wrap("releasing the device memory of the GPU processes"));
    phases.Done();
  }
  std::vector<pid_t> restore_tids;
  if (driver) {
    phases.Start("gpu-suspend");
    auto tids = gpu::Suspend(*driver, gpu_pids, options.gpu_lock_timeout_ms, phases.timings());
    if (!tids.ok()) {
      if (Status st = load_gpushare(); !st.ok())
        return tids.status().Wrap(fmt::format("suspending the GPU processes (and then {})", st.message()));
      return tids.status().Wrap("suspending the GPU processes");
    }
    restore_tids = *tids;
    meta.gpu->restore_tids.assign(restore_tids.begin(), restore_tids.end());
    phases.Done();
  }
  // The GPU processes come back to life if the dump fails or they stay running.
  auto resume_gpu = [&]() -> Status {
    if (!driver) return Status::Ok();
    std::map<std::string, double> ignored;
    GPUSNAP_RETURN_IF_ERROR(
        gpu::Resume(*driver, gpu_pids, restore_tids, {}, ignored).Wrap("resuming the GPU processes"));
    return load_gpushare();
  };
  phases.Start("dump");
  auto resp = criu::Run(dump);
  if (resp.ok() && options.leave_running) GPUSNAP_RETURN_IF_ERROR(resume_gpu());
  if (!resp.ok()) {
    if (Status st = resume_gpu(); !st.ok())
      return Status::Error(resp.status().code(), "{}; then {}", resp.status().message(), st.message());
    if (published) {
      // The snapshot is whole; only the source's fate is in question.
      return resp.status().Wrap(fmt::format("snapshot `{}` was published, but CRIU then failed", id));
    }
    // Keep CRIU's log of a failed dump where the user can read it.
    std::string kept = store.root() + "/logs/" + id + ".dump.log";
    if (MakeDirs(store.root() + "/logs").ok()) {
      std::error_code ec;
      std::filesystem::copy_file(dump.log_path, kept, ec);
    }
    std::string msg = resp.status().message();
    auto pos = msg.find(dump.log_path);
    if (pos != std::string::npos) msg.replace(pos, dump.log_path.size(), kept);
    return Status::Error(resp.status().code(), "checkpoint of `{}` failed: {}", options.target, msg);
  }
  if (!published) return Status::Error(Code::kInternal, "CRIU finished the dump without a post-dump notification");
  phases.Total();
  meta.timings_s = phases.timings();
  return meta;
}

}  // namespace gpusnap
