// The agent's work, without HTTP: start checkpoint and restore jobs, keep
// them in the journal, list and remove snapshots, and on start recover what
// an agent that died left behind.
//
// Journal: <state dir>/jobs/<job id>.json, one record per job (agent/service/job.h),
// rewritten atomically at every phase. The store's gpusnap.json files are the
// snapshot catalog; the agent keeps no index of its own.
//
// Recovery (Open): an exclusive flock on <state dir>/agent.lock (a second
// agent on the same state dir is refused); stale .tmp-* directories of the
// store are removed (the store's own rule: their writer is gone); every job
// record still running is marked failed, naming its phase; each process of a
// checkpoint's source tree that is still the same process and is stopped
// (left so by a dead agent) gets SIGCONT.
//
// Concurrency: one running capture per lock key (a container, or the root pid
// of a tree); jobs on different keys run concurrently, each on its own thread.
// A job uses its snapshot while it runs (busy_snapshots_): a checkpoint writes
// it, alone (no other job starts on it: 409); restores and wakes read it, any
// number at once (restores whose images hold deleted files take turns at
// CRIU's step inside the restore: snapshot/restore_turn.h). A snapshot that a
// job uses is not deleted (409), and no job starts on one being deleted (409).
// A restore of a registry reference learns its snapshot once its files are
// pulled: from then on it reads it (waiting while a checkpoint writes it),
// and its chunks arrive while it restores.
//
// Suspend, resume, swap (in place): the job names its workloads before it
// touches any; an agent that died during one makes each whole at its next
// start, running or suspended (SettleWorkload), and says which in the job's
// error.
//
// Wake: one job per workload name (the lock key a restore under that name
// takes too); it reads its standby's snapshot like a restore (HoldSnapshot),
// so the wakes of standbys of one snapshot run at once.
//
// Registry: a restore of a reference pulls as it restores (phases
// "pull-files", then "pull-chunks-wait" and "pull" beside the restore's own);
// a checkpoint with `push_to` (or whose pod names one) pushes its snapshot
// once published (phase "push"). The job's `transfer` shows either as it goes.
//
// Tenancy (docs/SECURITY.md; with --kube, when both `tenancy` and
// `namespace_credentials` are set): a pod's namespace must have opted in (its
// Secret gpusnap) before the agent dumps the pod or restores into it; a
// placeholder restores only what tenancy::MayRestore allows, checked when the
// job starts (a snapshot of the store) and again once the restore has read
// the snapshot's metadata (a reference's, once its files are pulled), before
// CRIU runs; a pod's gpusnap.io/restore-from and gpusnap.io/push-to name only
// repositories tenancy::RepositoryAllowed gives its namespace, reached with
// the credentials tenancy::CredentialsToUse picks, and with the namespace's
// keys (namespace_keys.h): its pulls open encrypted artifacts with them, its
// pushes are encrypted for them (tenancy::MayPush refuses one in the clear
// where the namespace must encrypt), never with the agent's own. A request's
// own pushTo is the administrator's: the agent's credentials and keys. A
// checkpoint records the pod
// it took as the snapshot's owner (gpusnap.json `owner`).
//
// GPU: when the node has a CUDA driver, the agent loads it once at Open and
// retains every GPU's primary context, and every job's GPU steps use them
// (GpuResources, gpusnap/operations.h). With `pinned_cache_bytes`, it keeps
// gpushare chunks in pinned host memory (gpushare/control/pinned_tier.h): a
// standby's when a restore makes it (phase "pin"), a snapshot's on a warm job
// (StartWarm), and what wakes and restores read from the store; its wakes and
// restores fill device memory from it first.
//
// Capture path: a checkpoint asks for the request's, else its pod's
// annotation, else auto; the job records what the checkpoint chose and why,
// and so does the pod (agent/service/pod_annotations.h). A restore records the path
// it took, and why a `both` snapshot fell back to its rootfs.
// Thread-safety: every public method may be called from any thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/api/request.h"
#include "agent/service/job.h"
#include "agent/service/metrics.h"
#include "agent/service/pod_annotations.h"
#include "agent/service/registry_access.h"
#include "container/containers.h"
#include "cuda/gpu_session.h"
#include "gpushare/control/pinned_tier.h"
#include "gpusnap/operations.h"
#include "gpusnap/status.h"
#include "store/store.h"
#include "tenancy/tenancy.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::agent {

struct ServiceOptions {
  std::string store;                                   // default DefaultStore()
  std::string state_dir;                               // default <store>/agent
  std::string criu_bundle;                             // default: found
  std::string kubelet_log_dir = "/var/log/containers";
  int operation_timeout_s = 600;
  // Every restore it runs sets the host's transparent huge pages to `always`
  // while CRIU restores (RestoreOptions::huge_pages; `--huge-pages`).
  bool huge_pages = false;
  size_t max_job_records = 1000;                       // finished records kept (the newest), at start and as jobs end
  std::function<void(const std::string&)> log;         // one line each
  // How to reach registries, asked once per pull or push (so credentials
  // read from a Secret are read again each time; agent/service/registry_access.h).
  // Unset: RegistryAccess's defaults.
  std::function<Result<RegistryAccess>()> registry;
  // Whom the API's callers' pushes (a request's pushTo) are encrypted for
  // (`gpusnap agent --encryption-key`); none: in the clear. A pod's push-to
  // uses its namespace's keys instead, never these, and a placeholder's pull
  // its namespace's private keys, never `registry`'s (namespace_keys.h).
  std::shared_ptr<const EncryptionKeys> encryption;
  // A pod as the API server has it, for what its annotations ask of its
  // checkpoints (agent/service/pod_annotations.h); nullopt for a pod the server does
  // not know. Unset: pods are not asked (no Kubernetes API server).
  std::function<Result<std::optional<nlohmann::json>>(const container::PodRef&)> pod;
  // A merge patch of a pod: where a checkpoint records its capture path.
  // Unset: pods are not written.
  std::function<Status(const container::PodRef&, const nlohmann::json&)> patch_pod;
  // The administrator's tenancy configuration, read at each use
  // (agent/service/tenancy_source.h). Unset: no tenancy (no Kubernetes).
  std::function<Result<tenancy::TenancyConfig>()> tenancy;
  // A namespace's opt-in Secret (agent/service/registry_access.h):
  // kPermissionDenied when it has none. Unset: no tenancy.
  std::function<Result<NamespaceCredentials>(const std::string& namespace_name)> namespace_credentials;
  // A Warning Event on a pod: what the agent refused of it (a push-to its
  // namespace may not use). Unset: none is posted.
  std::function<void(const container::PodRef&, const std::string& reason, const std::string& message)> warn_pod;
  // The operations. Unset: the library's Checkpoint and Restore.
  std::function<Result<SnapshotMeta>(const CheckpointOptions&)> checkpoint;
  std::function<Result<RestoreResult>(const RestoreOptions&)> restore;
  // The pinned chunk tier's bound (`--pinned-cache`), rounded down to whole
  // chunks; 0: no tier. Needs the CUDA driver.
  uint64_t pinned_cache_bytes = 0;
};

// What a started job answers with.
struct Accepted {
  std::string job_id;
};
// A refusal; `job_id` names the running job a 409 conflicts with.
struct Refused {
  ApiError error;
  std::string job_id;
};

class Service {
 public:
  // Takes the state directory's lock and recovers (see above).
  static Result<std::unique_ptr<Service>> Open(ServiceOptions options);
  // Waits for running jobs to finish.
  ~Service() EXCLUDES(mu_);

  std::variant<Accepted, Refused> StartCheckpoint(const CheckpointRequest& request) EXCLUDES(mu_);
  // `for_pod`: a placeholder pod's restore, which its namespace's tenancy
  // rules govern (above); unset: the API's caller, an administrator.
  std::variant<Accepted, Refused> StartRestore(const RestoreRequest& request,
                                               const std::optional<container::PodRef>& for_pod = std::nullopt)
      EXCLUDES(mu_);
  // A standby's wake (docs/STANDBY.md): 404 for no such workload, 409 for
  // one that is not a standby (running, exited) or that a job acts on.
  std::variant<Accepted, Refused> StartWake(const WakeRequest& request) EXCLUDES(mu_);
  // In place (docs/GPUSHARE.md): a running gpushare workload suspended (its
  // device memory into the store's chunks, freed), a suspended one resumed,
  // or both in that order (a swap of two workloads on one GPU; the first
  // resumed again if the second's resume fails). 404 for no such workload,
  // 409 for one already so (suspended, running), not a gpushare workload's
  // state to change (a standby, exited) or that a job acts on. One job per
  // workload name (the lock key restores and wakes take too); a swap holds
  // both names.
  std::variant<Accepted, Refused> StartSuspend(const InPlaceRequest& request) EXCLUDES(mu_);
  std::variant<Accepted, Refused> StartResume(const InPlaceRequest& request) EXCLUDES(mu_);
  std::variant<Accepted, Refused> StartSwap(const SwapRequest& request) EXCLUDES(mu_);
  // A job of kind `warm` that pins the gpushare chunks of `snapshot` in the
  // tier (as many as fit), its progress the job's bytes: 404 for no such
  // snapshot, 409 without a tier, for a snapshot without gpushare chunks, or
  // while another warm job pins it.
  std::variant<Accepted, Refused> StartWarm(const std::string& snapshot) EXCLUDES(mu_);
  // The tier's gauges now; nullopt without a tier.
  std::optional<gpushare::control::PinnedTierGauges> PinnedTierNow() const;
  // How many standbys wait on this node (the run directory's records).
  size_t StandbyWorkloads() const;

  // kNotFound for an unknown id.
  Result<Job> GetJob(const std::string& id) const EXCLUDES(mu_);
  std::vector<Job> ListJobs() const EXCLUDES(mu_);  // newest first

  Result<std::vector<SnapshotMeta>> ListSnapshots() const;
  Result<SnapshotMeta> GetSnapshot(const std::string& id) const;
  // kFailedPrecondition while a job writes or reads it.
  Status DeleteSnapshot(const std::string& id) EXCLUDES(mu_);

  // The node's GPU processes (with `all`, also every process in a container),
  // each with its container and, where the kubelet names it, its pod.
  struct ProcessView {
    container::NodeProcess process;
    bool gpu = false;
    std::optional<container::KubeletLogName> pod;
  };
  std::vector<ProcessView> ListProcesses(bool all) const;

  const Metrics& metrics() const { return metrics_; }
  Metrics& metrics() { return metrics_; }  // the API's refusals are counted here too
  std::vector<std::string> recovery_notes() const { return recovery_notes_; }
  size_t RunningJobs() const EXCLUDES(mu_);
  const std::string& store_root() const { return store_.root(); }  // absolute

 private:
  explicit Service(ServiceOptions options, Store store, UniqueFd lock);
  void Recover() EXCLUDES(mu_);
  std::variant<Accepted, Refused> Launch(Job job, std::function<Status(Job&)> work) EXCLUDES(mu_);
  void RunJob(const std::string& id, const std::function<Status(Job&)>& work) EXCLUDES(mu_);
  // The restore itself, through Restore (gpusnap/operations.h) as every
  // front door: a snapshot of the store held since the job started, or a
  // reference's, pulled as it restores and held once its files are in.
  // What a namespace's pods may do (the configuration read now), and its
  // credentials; unset when the agent has no tenancy.
  struct Tenant {
    std::string namespace_name;
    tenancy::TenancyConfig config;
    NamespaceCredentials credentials;
  };
  // The namespace's: kPermissionDenied when it has not opted in; the
  // configuration's error when it is bad.
  Result<std::optional<Tenant>> TenantOf(const std::string& namespace_name) const;
  // How a transfer reaches its registry, and whom a push encrypts for.
  struct RegistryUse {
    RegistryAccess access;
    std::shared_ptr<const EncryptionKeys> encryption;
  };
  // How a tenant reaches `reference`: refused where its namespace may not use
  // it; its own credentials, or the agent's where the configuration allows;
  // its namespace's keys (namespace_keys.h), never the agent's.
  Result<RegistryUse> TenantAccess(const Tenant& tenant, const RegistryReference& reference) const;
  Status RunRestore(const std::string& id, RestoreOptions o, const std::optional<Tenant>& tenant,
                    const std::optional<container::PodRef>& pod) EXCLUDES(mu_);
  // Job `id` reads `snapshot` from now on, once no checkpoint writes it
  // (waiting up to the operation timeout; other readers do not matter);
  // kFailedPrecondition while it is being deleted.
  Status MarkSnapshotInUse(const std::string& id, const std::string& snapshot) EXCLUDES(mu_);
  // MarkSnapshotInUse, then the snapshot's metadata (its size in the job).
  Result<SnapshotMeta> HoldSnapshot(const std::string& id, const std::string& snapshot) EXCLUDES(mu_);
  // Who uses a snapshot: the jobs that read it, the one that writes it, or a
  // DELETE removing it.
  struct SnapshotUsers {
    std::set<std::string> readers;  // job ids: restores, wakes
    std::string writer;             // a checkpoint's job id
    bool deleting = false;
    bool empty() const { return readers.empty() && writer.empty() && !deleting; }
  };
  // Why job `job` may not use its snapshot now (409), or nothing.
  std::optional<Refused> SnapshotConflict(const Job& job) const REQUIRES(mu_);
  // Job `id` no longer uses `snapshot`.
  void LeaveSnapshot(const std::string& snapshot, const std::string& id) REQUIRES(mu_);
  // The pod a checkpoint takes (its snapshot's owner), whose settings it
  // reads and on which its choice is recorded: the request's pod, else the
  // pod of the container the kubelet's log links name, else none.
  std::optional<container::PodRef> PodOf(const CheckpointRequest& request, const std::string& container_id) const;
  // The request's settings, else the pod's annotations (read only when the
  // request leaves something to them), else the defaults.
  Result<CheckpointSettings> SettingsFor(const CheckpointRequest& request,
                                         const std::optional<container::PodRef>& pod) const;
  // Best effort: the checkpoint is done whatever the API server answers.
  void RecordCapturePathOnPod(const std::string& id, const container::PodRef& pod,
                              const CapturePathRecord& chosen) const;
  // `tenant`: a tenant's access and keys (TenantAccess); unset: the agent's own.
  Status PushSnapshot(const std::string& id, const std::string& snapshot, const std::string& reference,
                      const std::optional<RegistryUse>& tenant) EXCLUDES(mu_);
  Result<RegistryAccess> Access() const;
  // What every restore this agent runs shares (the store, the bundle, its
  // CRIU config, the timeout) and what the request asks (the source, the
  // name, the GPUs, the container as given, standby).
  RestoreOptions RestoreOptionsFor(const RestoreRequest& request) const;
  // A suspend's or resume's job on the workload `name`.
  std::variant<Accepted, Refused> StartInPlace(const std::string& kind, const std::string& name) EXCLUDES(mu_);
  // Job `id` pins the gpushare chunks of `meta` in the tier, in phase "pin"
  // (its bytes the job's). REQUIRES: gpu_.pinned_tier.
  Status PinSnapshot(const std::string& id, const SnapshotMeta& meta) EXCLUDES(mu_);
  // After a restore job `id` made a standby: its snapshot's chunks pinned.
  // Only a speed-up: a failure is logged, the job succeeds.
  void PinStandby(const std::string& id) EXCLUDES(mu_);
  // The driver kept for every job (with each GPU's context) when this node
  // has one, and the tier when `pinned_cache_bytes` asks for one (which
  // needs the driver: the error says so).
  static Result<GpuResources> KeepGpu(uint64_t pinned_cache_bytes, const std::function<void(const std::string&)>& log);
  void OnProgress(const std::string& id, const ProgressEvent& event) EXCLUDES(mu_);
  void OnTransferProgress(const std::string& id, const ProgressEvent& event) EXCLUDES(mu_);
  // Under mu_: a job's records are written in the order of its changes.
  void Journal(const Job& job) const REQUIRES(mu_);
  // Finished records beyond options_.max_job_records go, from the journal
  // and from memory, those that finished first (FinishedJobsBeyond).
  void PruneJobRecords() REQUIRES(mu_);
  std::string JournalPath(const std::string& id) const;

  ServiceOptions options_;
  Store store_;
  UniqueFd lock_;
  Metrics metrics_;
  GpuResources gpu_;  // set once by Open
  std::vector<std::string> recovery_notes_;

  mutable Mutex mu_;
  std::condition_variable idle_;  // a job ended
  std::map<std::string, Job> jobs_ GUARDED_BY(mu_);
  std::map<std::string, std::string> running_ GUARDED_BY(mu_);         // lock key -> job id
  std::map<std::string, SnapshotUsers> busy_snapshots_ GUARDED_BY(mu_);  // by snapshot id; none empty
};

}  // namespace gpusnap::agent
