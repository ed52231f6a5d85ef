#include "agent/kube/placeholder_pods.h"

#include <fmt/format.h>

#include "agent/api/request.h"
#include "agent/service/pod_annotations.h"
#include "gpusnap/snapshot.h"
#include "k8s/annotations.h"
#include "store/registry_reference.h"
#include "util/progress_bar.h"

namespace gpusnap::agent {

namespace {

using nlohmann::json;

// obj[key] when it is a string, else "".
std::string Str(const json& obj, std::string_view key) {
  if (!obj.is_object()) return "";
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

const json& Field(const json& obj, std::string_view key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it != obj.end() ? *it : kNull;
}

// The container the webhook made the placeholder: as its mutation record
// says, else as the pod asked (gpusnap.io/restore-container), else the first.
std::string PlaceholderContainer(const json& pod) {
  const json& annotations = Field(Field(pod, "metadata"), "annotations");
  json mutation = json::parse(Str(annotations, k8s::kAnnotationMutation), nullptr, false);
  if (std::string name = Str(Field(mutation, "restore"), "container"); !name.empty()) return name;
  if (std::string name = Str(annotations, k8s::kAnnotationRestoreContainer); !name.empty()) return name;
  const json& containers = Field(Field(pod, "spec"), "containers");
  return containers.is_array() && !containers.empty() ? Str(containers[0], "name") : "";
}

bool HasContainer(const json& pod, const std::string& name) {
  const json& containers = Field(Field(pod, "spec"), "containers");
  if (!containers.is_array()) return false;
  for (const json& c : containers)
    if (Str(c, "name") == name) return true;
  return false;
}

// The running container's status entry, or null.
const json& RunningStatus(const json& pod, const std::string& name) {
  static const json kNull;
  const json& statuses = Field(Field(pod, "status"), "containerStatuses");
  if (!statuses.is_array()) return kNull;
  for (const json& s : statuses)
    if (Str(s, "name") == name) return Field(Field(s, "state"), "running").is_object() ? s : kNull;
  return kNull;
}

std::string Cut(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  return std::string(text.substr(0, max - 3)) + "...";
}

json OrNull(const std::string& value) { return value.empty() ? json(nullptr) : json(value); }

}  // namespace

PodDecision DecidePod(const json& pod, std::string_view node, Memory memory) {
  PodDecision d;
  const json& meta = Field(pod, "metadata");
  const json& annotations = Field(meta, "annotations");
  PlaceholderPod& p = d.pod;
  p.namespace_name = Str(meta, "namespace");
  p.name = Str(meta, "name");
  p.uid = Str(meta, "uid");
  p.resource_version = Str(meta, "resourceVersion");
  p.node = Str(Field(pod, "spec"), "nodeName");
  p.snapshot = Str(annotations, k8s::kAnnotationRestoreFrom);
  p.source = ParseSnapshotRef(p.snapshot);
  p.restore_status = Str(annotations, k8s::kAnnotationRestoreStatus);
  p.restore_job = Str(annotations, k8s::kAnnotationRestoreJob);
  auto decide = [&d](PodStep step, std::string reason) {
    d.step = step;
    d.reason = std::move(reason);
    return d;
  };

  if (p.name.empty() || p.namespace_name.empty() || p.uid.empty()) return decide(PodStep::kIgnore, "not a pod");
  if (Str(Field(meta, "labels"), k8s::kLabelPlaceholder) != k8s::kLabelPlaceholderOn)
    return decide(PodStep::kIgnore,
                  fmt::format("not labelled {}={}", k8s::kLabelPlaceholder, k8s::kLabelPlaceholderOn));
  if (p.node != node)
    return decide(PodStep::kIgnore, p.node.empty() ? "not scheduled yet" : fmt::format("on node `{}`", p.node));
  if (p.snapshot.empty()) return decide(PodStep::kIgnore, fmt::format("no {} annotation", k8s::kAnnotationRestoreFrom));
  if (!Field(meta, "deletionTimestamp").is_null()) return decide(PodStep::kIgnore, "being deleted");

  p.container = PlaceholderContainer(pod);
  std::string runtime_id = Str(RunningStatus(pod, p.container), "containerID");
  size_t scheme = runtime_id.find("://");
  p.container_id = scheme == std::string::npos ? runtime_id : runtime_id.substr(scheme + 3);

  if (memory == Memory::kInHand) return decide(PodStep::kDone, "this agent is restoring it");
  if (p.restore_status == k8s::kRestoreStatusRestored || p.restore_status == k8s::kRestoreStatusFailed)
    return decide(PodStep::kDone, fmt::format("{} already", p.restore_status));
  if (p.restore_status == k8s::kRestoreStatusRestoring)
    return memory == Memory::kRecorded ? decide(PodStep::kDone, "recorded already (an older version of the pod)")
                                       : decide(PodStep::kRecover, "restoring, by an agent before this one");
  if (!p.restore_status.empty())
    return decide(PodStep::kDone, fmt::format("{} is `{}`, which this agent does not know: left alone",
                                              k8s::kAnnotationRestoreStatus, p.restore_status));

  if (p.container.empty()) return decide(PodStep::kFail, "the pod has no container to restore into");
  if (!HasContainer(pod, p.container))
    return decide(PodStep::kFail, fmt::format("the pod has no container `{}` to restore into", p.container));
  if (!p.source.ok())
    return decide(PodStep::kFail, fmt::format("{}: {}", k8s::kAnnotationRestoreFrom, p.source.status().message()));
  bool reference = p.source->from_registry();
  if (runtime_id.empty()) return decide(PodStep::kWait, fmt::format("container `{}` is not running yet", p.container));
  if (!IsValidContainerId(p.container_id))
    return decide(PodStep::kFail, fmt::format("container `{}` has the id `{}`, which the agent cannot find through "
                                              "cgroups (12 to 64 lowercase hex digits are expected)",
                                              p.container, runtime_id));
  return decide(PodStep::kRestore,
                fmt::format("restore {} `{}` into container `{}` ({})", reference ? "registry reference" : "snapshot",
                            p.snapshot, p.container, p.container_id.substr(0, 12)));
}

json RecordPatch(const RestoreRecord& record, std::string_view resource_version) {
  json patch = {{"metadata",
                 {{"annotations",
                   {{std::string(k8s::kAnnotationRestoreStatus), record.status},
                    {std::string(k8s::kAnnotationRestoreJob), OrNull(record.job)},
                    {std::string(k8s::kAnnotationRestoreError), OrNull(Cut(record.error, 4000))},
                    {std::string(k8s::kAnnotationRestorePath), OrNull(record.path)},
                    {std::string(k8s::kAnnotationRestoreFallbackReason), OrNull(Cut(record.fallback_reason, 4000))},
                    {std::string(k8s::kAnnotationRestoreProgress), nullptr}}}}}};
  if (!resource_version.empty()) patch["metadata"]["resourceVersion"] = resource_version;
  return patch;
}

std::string RestoreProgress(const Job& job) {
  if (!job.transfer) return "";
  const JobTransfer& t = *job.transfer;
  // The restore goes on while the chunks arrive: both are told.
  std::string pulled = !t.done            ? (t.progress.empty() ? fmt::format("pulling {}", t.reference) : t.progress)
                       : t.already_present ? fmt::format("{} ({}) was in the node's store", t.reference, t.digest)
                                           : fmt::format("pulled {} ({}): {} of {} blobs, {}", t.reference, t.digest,
                                                         t.blobs_moved, t.blobs, HumanBytes(t.bytes_moved));
  if (job.phase.empty()) return pulled;
  return fmt::format("{}; restoring, {} done", pulled, job.phase);
}

json ProgressPatch(std::string_view progress) {
  return {{"metadata", {{"annotations", {{std::string(k8s::kAnnotationRestoreProgress), Cut(progress, 1000)}}}}}};
}

json RestoreEvent(const PlaceholderPod& pod, bool restored, const std::string& message, std::string_view node,
                  std::string_view now, std::string_view name_suffix) {
  return PodEvent({pod.namespace_name, pod.name, pod.uid, pod.container}, restored ? kReasonRestored : kReasonRestoreFailed,
                  !restored, "Restore", message, node, now, name_suffix);
}

std::string WorkloadNameForPod(std::string_view pod_name, std::string_view pod_uid) {
  std::string uid(pod_uid.substr(0, 8));
  std::string name(pod_name.substr(0, uid.empty() ? 40 : 31));
  while (!name.empty() && (name.back() == '-' || name.back() == '.')) name.pop_back();
  if (name.empty()) name = "pod";
  return uid.empty() ? name : name + "-" + uid;
}

const Job* FindRestoreJob(const std::vector<Job>& jobs, const PlaceholderPod& pod) {
  if (!pod.restore_job.empty()) {
    for (const Job& j : jobs)
      if (j.id == pod.restore_job && j.kind == "restore") return &j;
  }
  const Job* newest = nullptr;
  for (const Job& j : jobs)
    if (j.kind == "restore" && !pod.container_id.empty() && j.lock_key == "container:" + pod.container_id &&
        (!newest || j.created > newest->created))
      newest = &j;
  return newest;
}

std::string PodPath(const PlaceholderPod& pod) {
  return fmt::format("/api/v1/namespaces/{}/pods/{}", pod.namespace_name, pod.name);
}

std::string EventsPath(const PlaceholderPod& pod) {
  return fmt::format("/api/v1/namespaces/{}/events", pod.namespace_name);
}

}  // namespace gpusnap::agent
