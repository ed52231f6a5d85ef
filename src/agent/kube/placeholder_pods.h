// The agent's decisions about the placeholder pods of its node (pods the
// webhook labelled gpusnap.io/placeholder=true, docs/KUBERNETES.md), as pure
// functions: what to do with a pod, the merge patches that record a restore
// on it, the Event that reports the result. placeholder_watcher.h does the I/O.
//
// gpusnap.io/restore-from names a snapshot of the node's store, or a
// registry reference (it holds a `/`), which the job pulls first: what the
// store lacks of it is fetched.
//
// A pod's restore is recorded in its annotations (k8s/annotations.h):
//   gpusnap.io/restore-status    restoring | restored | failed
//   gpusnap.io/restore-job       the agent's job id (GET /v1/jobs/<id> on its node)
//   gpusnap.io/restore-error     why it failed (failed only)
//   gpusnap.io/restore-progress  while a reference is pulled and restored: how far
//                                (RestoreProgress); removed with the result
//   gpusnap.io/restore-path      restored only: process, or rootfs (a cold start
//                                with warm caches)
//   gpusnap.io/restore-fallback-reason  why a `both` snapshot was not restored as a
//                                process
// The agent sets restoring before it starts the job, with the pod's
// resourceVersion as a precondition, so a pod is restored at most once, also
// across agent restarts. A pod with any status is never restored again;
// removing gpusnap.io/restore-status asks for a new attempt.
//
// Pure; thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/service/job.h"
#include "store/snapshot_ref.h"

namespace gpusnap::agent {

inline constexpr std::string_view kReasonRestored = "GpusnapRestored";
inline constexpr std::string_view kReasonRestoreFailed = "GpusnapRestoreFailed";

// What the agent reads of a pod. Empty strings for what the pod lacks.
struct PlaceholderPod {
  std::string namespace_name, name, uid, resource_version, node;
  std::string snapshot;        // gpusnap.io/restore-from, as written: a snapshot id, or a registry reference
  Result<SnapshotRef> source = SnapshotRef{};  // it, parsed (ParseSnapshotRef) where it is read
  std::string container;       // the placeholder container's name
  std::string container_id;    // its runtime id once it runs ("containerd://<id>" without the scheme)
  std::string restore_status;  // gpusnap.io/restore-status
  std::string restore_job;     // gpusnap.io/restore-job
};

enum class PodStep {
  kIgnore,   // not a placeholder of this node (other node, no label or snapshot, being deleted)
  kWait,     // the placeholder container does not run yet
  kRestore,  // restore pod.snapshot into container pod.container_id
  kRecover,  // restoring, but this agent did not start it (an agent before it did): record what became of it
  kFail,     // the pod cannot be restored (say why, as failed), without a job
  kDone,     // restored or failed already, or this agent is on it
};

struct PodDecision {
  PodStep step = PodStep::kIgnore;
  std::string reason;  // for the log, and the error of kFail
  PlaceholderPod pod;
};

// What this agent remembers of a pod (by uid), besides its annotations.
enum class Memory {
  kNone,      // nothing
  kInHand,    // it claimed the pod and has not recorded the result yet
  kRecorded,  // it recorded the result: a pod still saying "restoring" is an older version of it
};

// What to do with `pod` (a v1 Pod as the API server returns it) on node
// `node`, given what the agent remembers of it.
PodDecision DecidePod(const nlohmann::json& pod, std::string_view node, Memory memory);

// The pod's restore, as its annotations record it.
struct RestoreRecord {
  std::string status;  // restoring, restored or failed (k8s::kRestoreStatus*)
  std::string job;     // empty: removed
  std::string error;   // empty: removed
  // Restored only; empty: removed. Defaulted: most records have neither.
  std::string path{};
  std::string fallback_reason{};
};
// A merge patch that sets the annotations of `record` (and removes the
// progress). With a resource version, the patch applies only to that version
// of the pod (HTTP 409 otherwise): the agent's claim before it restores.
nlohmann::json RecordPatch(const RestoreRecord& record, std::string_view resource_version = "");

// How far a running restore job is, for gpusnap.io/restore-progress: its
// pull's last line while it pulls (what the pull did once it is done), and
// the job's last phase once the restore has begun (it goes on while the
// chunks arrive). Empty for a job that pulls nothing (a snapshot of the store).
std::string RestoreProgress(const Job& job);
// A merge patch that sets gpusnap.io/restore-progress.
nlohmann::json ProgressPatch(std::string_view progress);

// A core v1 Event about the pod's placeholder container: reason
// GpusnapRestored (Normal) or GpusnapRestoreFailed (Warning). `now` is RFC
// 3339; `name_suffix` makes the Event's name unique (hex digits).
nlohmann::json RestoreEvent(const PlaceholderPod& pod, bool restored, const std::string& message,
                            std::string_view node, std::string_view now, std::string_view name_suffix);

// The name under which the restored tree is a workload of the agent
// (`gpusnap ps`): the pod's name, cut to fit, and the first 8 characters of
// its uid, as IsValidWorkloadName accepts.
std::string WorkloadNameForPod(std::string_view pod_name, std::string_view pod_uid);

// The restore job an agent before this one ran for `pod` (kRecover): the job
// named by the pod's annotation, else the newest restore into the pod's
// container; nullptr when there is none.
const Job* FindRestoreJob(const std::vector<Job>& jobs, const PlaceholderPod& pod);

// The API paths of a pod and of its namespace's events.
std::string PodPath(const PlaceholderPod& pod);
std::string EventsPath(const PlaceholderPod& pod);

}  // namespace gpusnap::agent
