#include "agent/service/service.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include "container/cgroup.h"
#include "gpusnap/operations.h"
#include "gpusnap/workload.h"
#include "k8s/annotations.h"
#include "proc/proc.h"
#include "snapshot/placeholder.h"
#include "util/clock.h"
#include "util/files.h"
#include "util/progress_bar.h"
#include "util/test_hooks.h"

namespace gpusnap::agent {

namespace {

constexpr const char* kRestoreCriuConfig = "criu-restore.conf";

std::string NewJobId() {
  std::random_device rd;
  std::uniform_int_distribution<uint64_t> dist;
  uint64_t v = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ dist(rd);
  return fmt::format("job-{:016x}", v);
}

// Every phase an operation timed, those no progress event carried too; the
// job's own total is the job's.
void AddTimings(Job& job, const std::map<std::string, double>& timings) {
  for (const auto& [phase, seconds] : timings)
    if (phase != "total") job.timings_s.emplace(phase, seconds);
}

// The keys a job holds while it runs: its own, and a swap's second workload.
std::vector<std::string> LockKeysOf(const Job& job) {
  std::vector<std::string> keys{job.lock_key};
  if (job.kind == "swap" && job.workloads.size() == 2) keys.push_back("workload:" + job.workloads[1]);
  return keys;
}

Refused Refuse(int http_status, std::string message, std::string job_id = "") {
  return Refused{ApiError{http_status, std::move(message)}, std::move(job_id)};
}

// "job A is", "jobs A, B are": who uses a snapshot, for an error.
std::string JobsAre(const std::vector<std::string>& ids) {
  if (ids.size() == 1) return fmt::format("job {} is", ids[0]);
  std::string list;
  for (const auto& id : ids) list += (list.empty() ? "" : ", ") + id;
  return fmt::format("jobs {} are", list);
}

// Whether pod `pod` may have `meta` restored into it: the one check of a
// placeholder's snapshot, when its job starts and on what the restore reads.
Status MayRestoreInto(const container::PodRef& pod, const SnapshotMeta& meta, const tenancy::TenancyConfig& config) {
  return tenancy::MayRestore(meta.owner, pod.namespace_name, config)
      .Wrap(fmt::format("pod {}/{} may not restore snapshot `{}`", pod.namespace_name, pod.name, meta.id));
}

}  // namespace

Service::Service(ServiceOptions options, Store store, UniqueFd lock)
    : options_(std::move(options)), store_(std::move(store)), lock_(std::move(lock)) {}

Service::~Service() {
  MutexLock lock(mu_);
  if (!running_.empty()) options_.log(fmt::format("waiting for {} running job(s) to finish", running_.size()));
  while (!running_.empty()) lock.Wait(idle_);
}

Result<std::unique_ptr<Service>> Service::Open(ServiceOptions options) {
  if (!options.log) options.log = [](const std::string& line) { std::fprintf(stderr, "[agent] %s\n", line.c_str()); };
  options.store = StoreOrDefault(options.store);
  if (options.state_dir.empty()) options.state_dir = options.store + "/agent";
  if (!options.checkpoint) options.checkpoint = [](const CheckpointOptions& o) { return Checkpoint(o); };
  if (!options.restore) options.restore = [](const RestoreOptions& o) { return Restore(o); };
  GPUSNAP_ASSIGN_OR_RETURN(auto store, Store::Open(options.store, true));
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(options.state_dir + "/jobs", 0700));
  std::string lock_path = options.state_dir + "/agent.lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) return Status::Errno(errno, "opening `{}`", lock_path);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0)
    return Status::Error(Code::kFailedPrecondition, "another agent holds `{}`: one agent per state directory",
                         lock_path);
  // A restore lands in a fresh namespace, in the agent's own cgroup: the
  // source's cgroups (a container's, gone with it) are not recreated.
  GPUSNAP_RETURN_IF_ERROR(WriteFileAtomic(options.state_dir + "/" + kRestoreCriuConfig,
                                          "# gpusnap agent: restores into a fresh namespace keep the agent's cgroup\n"
                                          "manage-cgroups=ignore\n",
                                          0600));
  GPUSNAP_ASSIGN_OR_RETURN(GpuResources gpu, KeepGpu(options.pinned_cache_bytes, options.log));
  std::unique_ptr<Service> s(new Service(std::move(options), std::move(store), std::move(lock)));
  s->gpu_ = std::move(gpu);
  s->Recover();
  return s;
}

std::string Service::JournalPath(const std::string& id) const { return options_.state_dir + "/jobs/" + id + ".json"; }

void Service::Journal(const Job& job) const {
  Status st = WriteFileAtomic(JournalPath(job.id), JobToJson(job), 0600);
  if (!st.ok()) options_.log(fmt::format("job {}: journal: {}", job.id, st.ToString()));
}

void Service::Recover() {
  // Before any job thread: the lock is for the analysis and for Journal's contract.
  MutexLock lock(mu_);
  int cleaned = store_.CleanStaleTemporaries();
  if (cleaned > 0) recovery_notes_.push_back(fmt::format("removed {} unfinished snapshot directories", cleaned));
  std::vector<Job> loaded;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.state_dir + "/jobs", ec)) {
    const std::string path = entry.path().string();
    if (entry.path().extension() != ".json") {
      // A temporary of an atomic write the dead agent did not finish.
      std::filesystem::remove(entry.path(), ec);
      continue;
    }
    auto text = ReadFile(path);
    auto job = text.ok() ? JobFromJson(*text) : Result<Job>(text.status());
    if (!job.ok()) {
      recovery_notes_.push_back(fmt::format("ignoring job record `{}`: {}", path, job.status().ToString()));
      continue;
    }
    if (job->state == JobState::kRunning) {
      // A stopped source process is one the dead agent's operation stopped;
      // a process that merely reuses the pid is left alone.
      int continued = 0;
      for (const auto& p : job->source) {
        auto st = proc::ReadStat(p.pid);
        if (st.ok() && st->start_time == p.start_time && proc::IsStopped(st->state) &&
            ::kill(p.pid, SIGCONT) == 0)
          ++continued;
      }
      bool published = !job->snapshot.empty() && job->kind == "checkpoint" && store_.Load(job->snapshot).ok();
      Job failed = Interrupted(*job, published, NowRfc3339());
      // A suspend, resume or swap left half way: each workload made whole.
      std::string whole;
      for (const std::string& name : job->workloads) {
        auto settled = SettleWorkload(name, store_.root());
        whole += settled.ok() ? fmt::format("; `{}` is {} now", name, WorkloadState(*settled))
                              : fmt::format("; `{}` could not be made whole: {}", name, settled.status().ToString());
      }
      failed.error += whole;
      Journal(failed);
      recovery_notes_.push_back(fmt::format("job {} ({} of {}) was interrupted after phase `{}`{}{}", failed.id,
                                            failed.kind, failed.target, job->phase,
                                            continued ? fmt::format("; resumed {} stopped processes", continued) : "",
                                            whole));
      loaded.push_back(std::move(failed));
    } else {
      loaded.push_back(std::move(*job));
    }
  }
  for (Job& job : loaded) jobs_.emplace(job.id, std::move(job));
  PruneJobRecords();
}

void Service::PruneJobRecords() {
  std::error_code ec;
  for (const std::string& id : FinishedJobsBeyond(jobs_, options_.max_job_records)) {
    std::filesystem::remove(JournalPath(id), ec);
    jobs_.erase(id);
  }
}

std::variant<Accepted, Refused> Service::StartCheckpoint(const CheckpointRequest& request) {
  // Which tree: the agent's own refusals (the node's init, itself, the
  // kernel's), then the resolution every front door shares.
  TargetSpec spec;
  if (request.pod) {
    spec = TargetSpec::Pod(*request.pod);
  } else if (!request.container.empty()) {
    spec = TargetSpec::Container(request.container);
  } else {
    spec = TargetSpec::Pid(request.pid);
    if (request.pid == 1) return Refuse(403, "pid 1 is the node's init: not a workload the agent may take");
    if (request.pid == ::getpid()) return Refuse(403, fmt::format("pid {} is this agent", request.pid));
    auto st = proc::ReadStat(request.pid);
    if (!st.ok() || st->state == 'Z') return Refuse(404, fmt::format("no process with pid {}", request.pid));
    if (st->ppid == 0 || st->ppid == 2)
      return Refuse(403, fmt::format("pid {} is a kernel thread or the kernel's own: not a workload", request.pid));
  }
  auto target = ResolveTarget(spec, options_.kubelet_log_dir);
  if (!target.ok()) return Refused{FromStatus(target.status()), ""};
  pid_t root = target->host_pid;
  std::string container_id = target->container_id;

  Job job;
  job.kind = "checkpoint";
  job.lock_key = container_id.empty() ? fmt::format("pid:{}", root) : "container:" + container_id;
  job.target = container_id.empty() ? fmt::format("pid {}", root) : fmt::format("container {} (pid {})", container_id, root);
  for (pid_t p : proc::Tree(root))
    if (auto st = proc::ReadStat(p); st.ok()) job.source.push_back({p, st->start_time});
  // The checkpoint holds a container's init stopped while CRIU dumps
  // (snapshot/target.h): it is tracked, so a restarted agent lets it go.
  if (pid_t init = InitToHoldDuringDump(*target, request.leave_running); init > 0)
    if (auto st = proc::ReadStat(init); st.ok()) job.source.push_back({init, st->start_time});
  job.snapshot = request.snapshot_id.empty() ? NewSnapshotId(SnapshotIdPrefix(*target)) : request.snapshot_id;
  if (store_.Load(job.snapshot).ok())
    return Refuse(409, fmt::format("snapshot `{}` already exists", job.snapshot));
  std::optional<container::PodRef> pod = PodOf(request, container_id);
  // A pod's namespace must have opted in before anything of it is dumped.
  std::optional<Tenant> tenant;
  if (pod) {
    auto of = TenantOf(pod->namespace_name);
    if (!of.ok())
      return Refused{FromStatus(of.status().Wrap(fmt::format("pod {}/{}", pod->namespace_name, pod->name))), ""};
    tenant = std::move(*of);
  }
  auto settings = SettingsFor(request, pod);
  if (!settings.ok()) return Refused{FromStatus(settings.status()), ""};
  // The pod's push-to is its namespace's to use, with its credentials; the
  // request's is the administrator's.
  std::optional<RegistryUse> push_access;
  if (!settings->push_to.empty()) {
    if (tenant && settings->push_to_from_pod) {
      auto ref = ParseRegistryReference(settings->push_to);  // checked by PushToOfPod: cannot fail here
      auto access = ref.ok() ? TenantAccess(*tenant, *ref) : Result<RegistryUse>(ref.status());
      if (access.ok())
        if (Status st = tenancy::MayPush(*ref, access->encryption != nullptr, tenant->namespace_name, tenant->config);
            !st.ok())
          access = st;
      if (!access.ok()) {
        Status refused = access.status().Wrap(fmt::format("pod {}/{}: annotation {} `{}` refused", pod->namespace_name,
                                                          pod->name, k8s::kAnnotationPushTo, settings->push_to));
        if (options_.warn_pod) options_.warn_pod(*pod, std::string(kReasonPushRefused), refused.message());
        return Refused{FromStatus(refused), ""};
      }
      push_access = std::move(*access);
    }
    job.transfer.emplace();
    job.transfer->reference = settings->push_to;
  }
  // The checkpoint chooses (the tree's pre-checks decide `auto`): nothing
  // is refused here for the path's sake.
  job.capture_path = JobCapturePath{std::string(CapturePathName(settings->capture_path)), "", ""};

  CheckpointOptions o;
  o.target = TargetSpec::Pid(root);
  o.store = store_.root();
  o.id = job.snapshot;
  o.leave_running = request.leave_running;
  o.criu_bundle = options_.criu_bundle;
  o.timeout_s = options_.operation_timeout_s;
  o.capture_path = settings->capture_path;
  o.caches = settings->caches;
  o.exclude = settings->exclude;
  o.image = settings->image;
  o.gpu_resources = gpu_;
  if (pod) o.owner = SnapshotOwner{pod->namespace_name, pod->name};
  return Launch(std::move(job), [this, o, pod, push_access, from = settings->capture_path_from](Job& running) mutable
                    -> Status {
    std::string id = running.id;
    o.progress = [this, id](const ProgressEvent& e) { OnProgress(id, e); };
    auto meta = options_.checkpoint(o);
    if (!meta.ok()) return meta.status();
    JobCapturePath chosen;
    {
      MutexLock lock(mu_);
      Job& now = jobs_.at(id);
      now.bytes_total = meta->total_bytes;
      now.capture_path->path = CapturePathName(meta->capture_path.path);
      now.capture_path->reason = meta->capture_path.reason;
      AddTimings(now, meta->timings_s);
      chosen = *now.capture_path;
      Journal(now);
    }
    options_.log(fmt::format("job {}: captured `{}` by the {} path (asked: {}, by {}){}", id, meta->id, chosen.path,
                             chosen.requested, from, chosen.reason.empty() ? "" : ": " + chosen.reason));
    if (pod) RecordCapturePathOnPod(id, *pod, meta->capture_path);
    if (!running.transfer) return Status::Ok();
    return PushSnapshot(id, meta->id, running.transfer->reference, push_access);
  });
}

std::optional<container::PodRef> Service::PodOf(const CheckpointRequest& request,
                                                const std::string& container_id) const {
  if (request.pod) return request.pod;
  if (container_id.empty()) return std::nullopt;
  auto named = container::KubeletContainers(options_.kubelet_log_dir);
  auto it = named.find(container_id);
  if (it == named.end()) return std::nullopt;
  return container::PodRef{it->second.namespace_name, it->second.pod, it->second.container};
}

Result<CheckpointSettings> Service::SettingsFor(const CheckpointRequest& request,
                                                const std::optional<container::PodRef>& pod) const {
  if (!pod || !options_.pod || !AsksThePod(request)) return CheckpointSettingsFor(request, nullptr);
  std::string which = fmt::format("pod {}/{}", pod->namespace_name, pod->name);
  auto object = options_.pod(*pod);
  if (!object.ok()) return object.status().Wrap(which + ": reading its annotations");
  auto settings = CheckpointSettingsFor(request, *object ? &**object : nullptr);
  if (!settings.ok()) return settings.status().Wrap(which);
  return settings;
}

void Service::RecordCapturePathOnPod(const std::string& id, const container::PodRef& pod,
                                     const CapturePathRecord& chosen) const {
  if (!options_.patch_pod) return;
  Status st = options_.patch_pod(pod, CapturePathChosenPatch(chosen.path, chosen.reason));
  // A pod the API server does not know has nowhere to record it.
  if (!st.ok() && st.code() != Code::kNotFound)
    options_.log(fmt::format("job {}: pod {}/{}: recording its capture path: {}", id, pod.namespace_name, pod.name,
                             st.ToString()));
}

Status Service::PushSnapshot(const std::string& id, const std::string& snapshot, const std::string& reference,
                             const std::optional<RegistryUse>& tenant) {
  // The snapshot is published whatever becomes of the push.
  auto failed = [&](const Status& st) {
    return st.Wrap(fmt::format("snapshot `{}` is in the store; pushing it to `{}` failed", snapshot, reference));
  };
  auto access = tenant ? Result<RegistryAccess>(tenant->access) : Access();
  if (!access.ok()) return failed(access.status());
  std::shared_ptr<const EncryptionKeys> encryption = tenant ? tenant->encryption : options_.encryption;
  // Checked when the request or the pod named it (request.cc, PushToOfPod); kept as text in the job.
  auto ref = ParseRegistryReference(reference);
  if (!ref.ok()) return failed(ref.status());
  auto pushed = Push({.store = store_.root(),
                      .id = snapshot,
                      .reference = *ref,
                      .mount_from = "",
                      .signing_key = nullptr,
                      .encryption = encryption,
                      .access = *access,
                      .progress = [this, id](const ProgressEvent& e) { OnTransferProgress(id, e); }});
  if (!pushed.ok()) return failed(pushed.status());
  MutexLock lock(mu_);
  Job& job = jobs_.at(id);
  FinishTransfer(job, *pushed);
  Journal(job);
  options_.log(fmt::format("job {}: pushed `{}` to {} ({}){}: {} of {} blobs uploaded, {}", id, snapshot, reference,
                           pushed->manifest_digest,
                           encryption ? fmt::format(", encrypted for {} recipient(s)", encryption->recipients.size())
                                      : "",
                           pushed->blobs_moved, pushed->blobs, HumanBytes(pushed->bytes_moved)));
  return Status::Ok();
}

Result<RegistryAccess> Service::Access() const {
  if (!options_.registry) return RegistryAccess{};
  return options_.registry();
}

Result<std::optional<Service::Tenant>> Service::TenantOf(const std::string& namespace_name) const {
  if (!options_.tenancy || !options_.namespace_credentials) return std::optional<Tenant>();
  Tenant tenant;
  tenant.namespace_name = namespace_name;
  GPUSNAP_ASSIGN_OR_RETURN(tenant.credentials, options_.namespace_credentials(namespace_name));
  GPUSNAP_ASSIGN_OR_RETURN(tenant.config, options_.tenancy());
  return std::optional<Tenant>(std::move(tenant));
}

Result<Service::RegistryUse> Service::TenantAccess(const Tenant& tenant, const RegistryReference& reference) const {
  GPUSNAP_ASSIGN_OR_RETURN(
      auto source, tenancy::CredentialsToUse(reference, tenant.namespace_name, tenant.credentials.docker_config,
                                             fmt::format("Secret {}/{}", tenant.namespace_name, kNamespaceSecret),
                                             tenant.config));
  // The agent's settings either way (its CA, plain HTTP, timeouts, policy);
  // its credentials only where the administrator lets them serve the
  // namespace, its keys never.
  RegistryUse use;
  GPUSNAP_ASSIGN_OR_RETURN(use.access, Access());
  if (source == tenancy::CredentialsSource::kNamespace) use.access.credentials_file = tenant.credentials.file;
  GPUSNAP_ASSIGN_OR_RETURN(KeyMaterial administrators,
                           ReadKeyFiles(tenant.config.For(tenant.namespace_name).keys, tenant.namespace_name));
  GPUSNAP_ASSIGN_OR_RETURN(NamespaceKeys keys,
                           CombineNamespaceKeys(tenant.credentials.keys, administrators, tenant.namespace_name));
  use.access.decryption_keys = keys.decryption;
  use.encryption = keys.encryption;
  return use;
}

RestoreOptions Service::RestoreOptionsFor(const RestoreRequest& request) const {
  RestoreOptions o;
  o.source = request.source;
  o.name = request.name;
  o.store = store_.root();
  o.criu_bundle = options_.criu_bundle;
  o.timeout_s = options_.operation_timeout_s;
  o.gpus = request.gpus;
  o.criu_config = options_.state_dir + "/" + kRestoreCriuConfig;
  o.into_container = request.target_container;
  o.standby = request.standby;
  o.huge_pages = options_.huge_pages;
  o.gpu_resources = gpu_;
  return o;
}

std::variant<Accepted, Refused> Service::StartRestore(const RestoreRequest& request,
                                                      const std::optional<container::PodRef>& for_pod) {
  // Refused now, before any job: what the restore refuses whatever the snapshot.
  RestoreOptions o = RestoreOptionsFor(request);
  if (Status st = CheckRestoreOptions(o); !st.ok()) return Refused{FromStatus(st), ""};
  // A placeholder's: its namespace must have opted in, and may pull only from
  // its repositories, with its credentials; refused before anything is pulled.
  std::optional<Tenant> tenant;
  std::string which = for_pod ? fmt::format("pod {}/{}", for_pod->namespace_name, for_pod->name) : "";
  if (for_pod) {
    auto of = TenantOf(for_pod->namespace_name);
    if (!of.ok()) return Refused{FromStatus(of.status().Wrap(which)), ""};
    tenant = std::move(*of);
  }
  if (tenant && request.source.from_registry()) {
    auto access = TenantAccess(*tenant, *request.source.reference);
    if (!access.ok())
      return Refused{FromStatus(access.status().Wrap(fmt::format("{}: {} `{}` refused", which,
                                                                 k8s::kAnnotationRestoreFrom,
                                                                 request.source.ToString()))),
                     ""};
    o.registry = std::move(access->access);
  }
  // Into a container: refused now (404, 409) unless it is an idle placeholder;
  // the restore checks again when it starts.
  if (!request.target_container.empty()) {
    auto target = FindIdlePlaceholder(request.target_container);
    if (!target.ok()) return Refused{FromStatus(target.status()), ""};
    o.into_container = target->container_id;
  }
  Job job;
  job.kind = "restore";
  job.restored_name = request.name;
  std::string into = o.into_container.empty() ? "" : " into container " + o.into_container;
  if (request.source.from_registry()) {
    // The snapshot, and the name it gives, are known once its files are
    // pulled (RunRestore): a second restore of the reference without a name
    // would take the same name.
    job.lock_key = !o.into_container.empty() ? "container:" + o.into_container
                   : !request.name.empty()   ? "workload:" + request.name
                                             : "reference:" + request.source.ToString();
    job.target = fmt::format("reference {}{}", request.source.ToString(), into);
    job.transfer.emplace();
    job.transfer->reference = request.source.ToString();
  } else {
    auto meta = store_.Load(request.source.id);
    if (!meta.ok()) return Refused{FromStatus(meta.status()), ""};
    if (tenant)
      if (Status st = MayRestoreInto(*for_pod, *meta, tenant->config); !st.ok()) return Refused{FromStatus(st), ""};
    job.restored_name = RestoredWorkloadName(*meta, request.name);
    // Into a container: one job at a time for it, capture or restore.
    job.lock_key = o.into_container.empty() ? "workload:" + job.restored_name : "container:" + o.into_container;
    job.target = fmt::format("snapshot {}{}", meta->id, into);
    job.snapshot = meta->id;
    job.bytes_total = meta->total_bytes;
  }
  return Launch(std::move(job), [this, o, tenant, for_pod](Job& running) -> Status {
    GPUSNAP_RETURN_IF_ERROR(RunRestore(running.id, o, tenant, for_pod));
    if (o.standby && gpu_.pinned_tier) PinStandby(running.id);
    return Status::Ok();
  });
}

size_t Service::StandbyWorkloads() const {
  size_t n = 0;
  if (auto all = ListWorkloads(); all.ok())
    for (const auto& w : *all)
      if (w.running && w.standby) ++n;
  return n;
}

std::variant<Accepted, Refused> Service::StartWake(const WakeRequest& request) {
  // Refused now unless it is a standby; the wake checks again when it starts.
  auto standby = FindWorkload(request.name);
  if (!standby.ok()) return Refused{FromStatus(standby.status()), ""};
  if (!standby->running)
    return Refuse(409, fmt::format("workload `{}` has exited: there is no standby to wake", request.name));
  if (!standby->standby)
    return Refuse(409, fmt::format("workload `{}` is running, not a standby: only a standby is woken", request.name));
  Job job;
  job.kind = "wake";
  job.lock_key = "workload:" + request.name;  // a restore under the name takes it too
  job.target = fmt::format("standby {} (snapshot {})", request.name, standby->restored_from);
  job.restored_name = request.name;
  WakeOptions o;
  o.name = request.name;
  o.gpus = request.gpus;
  o.timeout_s = options_.operation_timeout_s;
  o.gpu_resources = gpu_;
  return Launch(std::move(job), [this, o, snapshot = standby->restored_from](Job& running) mutable -> Status {
    std::string id = running.id;
    // Its snapshot is not removed while it wakes; other standbys of it wait
    // their turn. One already gone (or in another store) the wake refuses itself.
    if (auto held = HoldSnapshot(id, snapshot); !held.ok() && held.status().code() != Code::kNotFound)
      return held.status();
    o.progress = [this, id](const ProgressEvent& e) {
      OnProgress(id, e);
      if (e.done) PauseIfRequested("wake-" + e.phase);
    };
    auto woken = Wake(o);
    if (!woken.ok()) return woken.status();
    MutexLock lock(mu_);
    jobs_[id].restored_pid = woken->workload.pid;
    AddTimings(jobs_[id], woken->timings_s);
    return Status::Ok();
  });
}

std::variant<Accepted, Refused> Service::StartInPlace(const std::string& kind, const std::string& name) {
  // Refused now unless it is in the state to change; the story checks again when it runs.
  auto w = FindWorkload(name);
  if (!w.ok()) return Refused{FromStatus(w.status()), ""};
  if (!w->running) return Refuse(409, fmt::format("workload `{}` has exited", name));
  if (w->standby) return Refuse(409, fmt::format("workload `{}` is a standby: wake it", name));
  if (kind == "suspend" && w->suspended) return Refuse(409, fmt::format("workload `{}` is suspended already", name));
  if (kind == "resume" && !w->suspended)
    return Refuse(409, fmt::format("workload `{}` is running, not suspended", name));
  Job job;
  job.kind = kind;
  job.lock_key = "workload:" + name;
  job.target = fmt::format("workload {}", name);
  job.workloads = {name};
  InPlaceOptions o;
  o.name = name;
  o.store = store_.root();
  o.quiesce_timeout_ms = options_.operation_timeout_s * 1000;
  o.gpu_resources = gpu_;
  return Launch(std::move(job), [this, o, kind](Job& running) mutable -> Status {
    std::string id = running.id;
    o.progress = [this, id](const ProgressEvent& e) { OnProgress(id, e); };
    auto done = kind == "suspend" ? SuspendInPlace(o) : ResumeInPlace(o);
    if (!done.ok()) return done.status();
    MutexLock lock(mu_);
    Job& now = jobs_.at(id);
    AddTimings(now, done->timings_s);
    return Status::Ok();
  });
}

std::variant<Accepted, Refused> Service::StartSuspend(const InPlaceRequest& request) {
  return StartInPlace("suspend", request.name);
}

std::variant<Accepted, Refused> Service::StartResume(const InPlaceRequest& request) {
  return StartInPlace("resume", request.name);
}

std::variant<Accepted, Refused> Service::StartSwap(const SwapRequest& request) {
  // Both checked now (404, 409); the story checks again, with the chunks, before it touches either.
  auto out = FindWorkload(request.suspend);
  if (!out.ok()) return Refused{FromStatus(out.status()), ""};
  auto in = FindWorkload(request.resume);
  if (!in.ok()) return Refused{FromStatus(in.status()), ""};
  if (!out->running || out->standby || out->suspended)
    return Refuse(409, fmt::format("workload `{}` is {}, not running: only a running workload is swapped out",
                                   request.suspend, WorkloadState(*out)));
  if (!in->running || in->standby || !in->suspended)
    return Refuse(409, fmt::format("workload `{}` is {}, not suspended: only a suspended workload is swapped in",
                                   request.resume, WorkloadState(*in)));
  Job job;
  job.kind = "swap";
  job.lock_key = "workload:" + request.suspend;  // and the other's (LockKeysOf)
  job.target = fmt::format("workloads {} (out) and {} (in)", request.suspend, request.resume);
  job.workloads = {request.suspend, request.resume};
  SwapOptions o;
  o.suspend = request.suspend;
  o.resume = request.resume;
  o.store = store_.root();
  o.quiesce_timeout_ms = options_.operation_timeout_s * 1000;
  o.gpu_resources = gpu_;
  return Launch(std::move(job), [this, o](Job& running) mutable -> Status {
    std::string id = running.id;
    o.progress = [this, id](const ProgressEvent& e) { OnProgress(id, e); };
    auto done = SwapWorkloads(o);
    if (!done.ok()) return done.status();
    MutexLock lock(mu_);
    Job& now = jobs_.at(id);
    AddTimings(now, done->timings_s);
    now.restored_pid = done->resumed.pid;
    now.restored_name = done->resumed.name;
    return Status::Ok();
  });
}

Status Service::MarkSnapshotInUse(const std::string& id, const std::string& snapshot) {
  MutexLock lock(mu_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(options_.operation_timeout_s);
  for (;;) {
    auto it = busy_snapshots_.find(snapshot);
    if (it == busy_snapshots_.end()) break;
    if (it->second.deleting)
      return Status::Error(Code::kFailedPrecondition, "snapshot `{}` is being deleted", snapshot);
    // Other readers do not matter; a checkpoint still writing it does.
    std::string writer = it->second.writer;
    if (writer.empty()) break;
    if (!lock.WaitUntil(idle_, deadline))
      return Status::Error(Code::kTimeout, "job {} wrote snapshot `{}` for {} s", writer, snapshot,
                           options_.operation_timeout_s);
  }
  busy_snapshots_[snapshot].readers.insert(id);
  jobs_.at(id).snapshot = snapshot;
  return Status::Ok();
}

Result<SnapshotMeta> Service::HoldSnapshot(const std::string& id, const std::string& snapshot) {
  GPUSNAP_RETURN_IF_ERROR(MarkSnapshotInUse(id, snapshot));
  GPUSNAP_ASSIGN_OR_RETURN(SnapshotMeta meta, store_.Load(snapshot));
  MutexLock lock(mu_);
  Job& job = jobs_.at(id);
  job.bytes_total = meta.total_bytes;
  Journal(job);
  return meta;
}

Status Service::RunRestore(const std::string& id, RestoreOptions o, const std::optional<Tenant>& tenant,
                           const std::optional<container::PodRef>& pod) {
  bool pulls = o.source.from_registry();
  // A tenant's pull has its access already (StartRestore); the API's caller's is the agent's.
  if (pulls && !tenant) {
    GPUSNAP_ASSIGN_OR_RETURN(o.registry, Access());
  }
  o.progress = [this, id, pulls](const ProgressEvent& e) {
    // The pull's own account (bytes, blobs) is the job's transfer.
    if (pulls && (e.phase == "pull" || (!e.done && e.phase.starts_with("pull")))) return OnTransferProgress(id, e);
    OnProgress(id, e);
    // The restore's fault-injection points for the crash tests.
    if (e.done) PauseIfRequested("restore-" + e.phase);
  };
  // The metadata the restore reads, before CRIU runs: whether the pod's
  // namespace may restore it (a reference's is known only now; a snapshot of
  // the store is checked again, as the restore reads it). A reference's
  // snapshot is held from then on (a snapshot of the store the job held when
  // it started).
  if (pulls || tenant)
    o.on_source_opened = [this, id, pulls, tenant, pod, asked = o.name](const SnapshotMeta& meta) -> Status {
      if (tenant) GPUSNAP_RETURN_IF_ERROR(MayRestoreInto(*pod, meta, tenant->config));
      if (!pulls) return Status::Ok();
      GPUSNAP_RETURN_IF_ERROR(MarkSnapshotInUse(id, meta.id));
      MutexLock lock(mu_);
      Job& job = jobs_.at(id);
      job.bytes_total = meta.total_bytes;
      job.restored_name = RestoredWorkloadName(meta, asked);
      Journal(job);
      return Status::Ok();
    };
  auto result = options_.restore(o);
  if (!result.ok()) return result.status();
  MutexLock lock(mu_);
  Job& job = jobs_.at(id);
  job.restored_pid = result->workload.pid;
  if (!result->workload.name.empty()) job.restored_name = result->workload.name;
  job.restore_path = CapturePathName(result->restore_path);
  job.fallback_reason = result->fallback_reason;
  // Every phase the restore timed, those no progress event carried too
  // (a reference's pull-chunks-wait, pull).
  AddTimings(job, result->timings_s);
  if (result->pulled && job.transfer) {
    const TransferResult& pulled = *result->pulled;
    FinishTransfer(job, pulled);
    options_.log(fmt::format("job {}: pulled {} ({}) as `{}`: {}", id, o.source.ToString(), pulled.manifest_digest,
                             pulled.id,
                             pulled.already_present
                                 ? std::string("already in the store")
                                 : fmt::format("{} of {} blobs downloaded, {}", pulled.blobs_moved, pulled.blobs,
                                               HumanBytes(pulled.bytes_moved))));
  }
  Journal(job);
  if (result->restore_path != CapturePath::kProcess)
    options_.log(fmt::format("job {}: restored `{}` by the {} path{}", id, o.source.ToString(), job.restore_path,
                             job.fallback_reason.empty() ? "" : ", not as a process: " + job.fallback_reason));
  return Status::Ok();
}

std::variant<Accepted, Refused> Service::Launch(Job job, std::function<Status(Job&)> work) {
  std::string id;
  {
    MutexLock lock(mu_);
    for (const std::string& key : LockKeysOf(job)) {
      if (auto it = running_.find(key); it != running_.end()) {
        const Job& other = jobs_.at(it->second);
        return Refuse(409, fmt::format("job {} is already running a {} of {}", other.id, other.kind, other.target),
                      other.id);
      }
    }
    if (auto conflict = SnapshotConflict(job)) return *conflict;
    do {
      job.id = NewJobId();
    } while (jobs_.count(job.id) > 0);
    job.created = NowRfc3339();
    job.state = JobState::kRunning;
    Journal(job);
    for (const std::string& key : LockKeysOf(job)) running_[key] = job.id;
    if (!job.snapshot.empty()) {
      SnapshotUsers& users = busy_snapshots_[job.snapshot];
      if (job.kind == "checkpoint") {
        users.writer = job.id;
      } else {
        users.readers.insert(job.id);
      }
    }
    id = job.id;
    options_.log(fmt::format("job {}: {} of {} started", id, job.kind, job.target));
    jobs_[id] = std::move(job);
    metrics_.JobStarted();
  }
  std::thread([this, id, work = std::move(work)] { RunJob(id, work); }).detach();
  return Accepted{id};
}

void Service::RunJob(const std::string& id, const std::function<Status(Job&)>& work) {
  Job copy;
  {
    MutexLock lock(mu_);
    copy = jobs_.at(id);
  }
  auto started = std::chrono::steady_clock::now();
  Status st = work(copy);
  MutexLock lock(mu_);
  Job& job = jobs_.at(id);
  job.timings_s["total"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (st.ok()) {
    Succeed(job, NowRfc3339());
  } else {
    Fail(job, st.ToString(), NowRfc3339());
  }
  Journal(job);
  for (const auto& [phase, seconds] : job.timings_s) metrics_.ObservePhase(job.kind, phase, seconds);
  metrics_.AddBytes(job.kind, job.bytes_done);
  metrics_.JobFinished(job.kind, st.ok());
  options_.log(fmt::format("job {}: {} of {} {}{}", id, job.kind, job.target, JobStateName(job.state),
                           st.ok() ? "" : ": " + st.ToString()));
  for (const std::string& key : LockKeysOf(job)) running_.erase(key);
  LeaveSnapshot(job.snapshot, id);
  PruneJobRecords();  // `job` may be gone from here
  idle_.notify_all();
}

std::optional<Refused> Service::SnapshotConflict(const Job& job) const {
  auto it = busy_snapshots_.find(job.snapshot);
  if (job.snapshot.empty() || it == busy_snapshots_.end()) return std::nullopt;
  const SnapshotUsers& users = it->second;
  if (users.deleting) return Refuse(409, fmt::format("snapshot `{}` is being deleted", job.snapshot));
  // A checkpoint writes its snapshot alone; restores and wakes share theirs.
  if (!users.writer.empty())
    return Refuse(409, fmt::format("job {} is using snapshot `{}`", users.writer, job.snapshot), users.writer);
  if (job.kind == "checkpoint" && !users.readers.empty()) {
    std::vector<std::string> readers(users.readers.begin(), users.readers.end());
    return Refuse(409, fmt::format("{} using snapshot `{}`", JobsAre(readers), job.snapshot), readers[0]);
  }
  return std::nullopt;
}

void Service::LeaveSnapshot(const std::string& snapshot, const std::string& id) {
  auto it = busy_snapshots_.find(snapshot);
  if (it == busy_snapshots_.end()) return;
  it->second.readers.erase(id);
  if (it->second.writer == id) it->second.writer.clear();
  if (it->second.empty()) busy_snapshots_.erase(it);
}

void Service::OnProgress(const std::string& id, const ProgressEvent& e) {
  MutexLock lock(mu_);
  Job& job = jobs_.at(id);
  ApplyProgress(job, e.phase, e.seconds, e.bytes, e.done);
  Journal(job);
}

void Service::OnTransferProgress(const std::string& id, const ProgressEvent& e) {
  MutexLock lock(mu_);
  Job& job = jobs_.at(id);
  ApplyTransferProgress(job, e.phase, e.seconds, e.bytes, e.done);
  Journal(job);
}

Result<Job> Service::GetJob(const std::string& id) const {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return Status::Error(Code::kNotFound, "no job `{}`", id);
  return it->second;
}

std::vector<Job> Service::ListJobs() const {
  std::vector<Job> out;
  {
    MutexLock lock(mu_);
    for (const auto& [id, job] : jobs_) out.push_back(job);
  }
  std::sort(out.begin(), out.end(), [](const Job& a, const Job& b) { return a.created > b.created; });
  return out;
}

size_t Service::RunningJobs() const {
  MutexLock lock(mu_);
  return running_.size();
}

std::vector<Service::ProcessView> Service::ListProcesses(bool all) const {
  std::map<std::string, container::KubeletLogName> pods = container::KubeletContainers(options_.kubelet_log_dir);
  std::vector<ProcessView> out;
  for (auto& p : container::ScanProcesses()) {
    ProcessView v;
    v.gpu = proc::UsesNvidiaGpu(p.pid);
    if (!v.gpu && !(all && !p.container_id.empty())) continue;
    if (auto it = pods.find(p.container_id); it != pods.end()) v.pod = it->second;
    v.process = std::move(p);
    out.push_back(std::move(v));
  }
  return out;
}

Result<std::vector<SnapshotMeta>> Service::ListSnapshots() const {
  std::vector<std::string> warnings;
  auto list = store_.List(&warnings);
  for (const auto& w : warnings) options_.log("listing snapshots: " + w);
  return list;
}

Result<SnapshotMeta> Service::GetSnapshot(const std::string& id) const { return store_.Load(id); }

Status Service::DeleteSnapshot(const std::string& id) {
  {
    MutexLock lock(mu_);
    if (auto it = busy_snapshots_.find(id); it != busy_snapshots_.end()) {
      const SnapshotUsers& users = it->second;
      if (users.deleting) return Status::Error(Code::kFailedPrecondition, "another delete is using snapshot `{}`", id);
      std::vector<std::string> jobs(users.readers.begin(), users.readers.end());
      if (!users.writer.empty()) jobs.insert(jobs.begin(), users.writer);
      return Status::Error(Code::kFailedPrecondition, "{} using snapshot `{}`", JobsAre(jobs), id);
    }
    GPUSNAP_RETURN_IF_ERROR(store_.Load(id).status());
    busy_snapshots_[id].deleting = true;  // no job may start on it while its files go
  }
  auto removed = RemoveSnapshot(store_.root(), id);  // and the chunks only it named
  if (removed.ok() && !removed->chunks_status.ok()) options_.log(removed->chunks_status.message());
  Status st = removed.status();
  MutexLock lock(mu_);
  busy_snapshots_.erase(id);
  return st;
}

}  // namespace gpusnap::agent
