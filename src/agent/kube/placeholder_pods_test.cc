// The agent's decisions about placeholder pods: one case per rule, the
// patches that record a restore (applied as the API server applies a merge
// patch), the Event, and the recovery of an earlier agent's job.
#include "agent/kube/placeholder_pods.h"

#include <gtest/gtest.h>

#include "gpusnap/workload.h"
#include "k8s/annotations.h"
#include "k8s/mutate.h"
#include "k8s/pod_testing.h"

namespace gpusnap::agent {
namespace {

using nlohmann::json;

const std::string kId = std::string(64, 'a');
constexpr const char* kNode = "gpu-node-1";

// A placeholder pod as the webhook leaves it and the kubelet reports it running.
json Placeholder() {
  return json::parse(R"({
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": "vllm-0", "namespace": "ml", "uid": "3f2a9c1e-0b7d-4c11-9e2f-5b8a7d6c4e21",
                 "resourceVersion": "4711",
                 "labels": {"gpusnap.io/placeholder": "true"},
                 "annotations": {"gpusnap.io/restore-from": "vllm-warm",
                                 "gpusnap.io/mutation":
                                   "{\"restore\":{\"container\":\"server\",\"gpus\":1,\"snapshot\":\"vllm-warm\"}}"}},
    "spec": {"nodeName": "gpu-node-1",
             "containers": [{"name": "sidecar", "image": "busybox"}, {"name": "server", "image": "vllm"}]},
    "status": {"phase": "Running", "containerStatuses": [
      {"name": "sidecar", "state": {"running": {}}, "containerID": "containerd://)" + std::string(64, 'b') + R"("},
      {"name": "server", "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
       "containerID": "containerd://)" + kId + R"("}]}
  })");
}

json WithAnnotation(json pod, const std::string& key, const std::string& value) {
  pod["metadata"]["annotations"][key] = value;
  return pod;
}

PodDecision Decide(const json& pod, Memory memory = Memory::kNone) { return DecidePod(pod, kNode, memory); }

TEST(DecidePod, RunningPlaceholderIsRestored) {
  PodDecision d = Decide(Placeholder());
  ASSERT_EQ(d.step, PodStep::kRestore) << d.reason;
  EXPECT_EQ(d.pod.snapshot, "vllm-warm");
  EXPECT_EQ(d.pod.container, "server");  // from the mutation record, not the first container
  EXPECT_EQ(d.pod.container_id, kId);
  EXPECT_EQ(d.pod.namespace_name, "ml");
  EXPECT_EQ(d.pod.name, "vllm-0");
  EXPECT_EQ(d.pod.resource_version, "4711");
}

TEST(DecidePod, WhatTheWebhookMadeIsRestoredOnceRunning) {
  // The webhook's own mutation of a restore-from pod, then the scheduler and the kubelet.
  json pod = k8s::testing::Fixture("restore-placeholder.json");
  auto m = k8s::MutatePod(pod, {});
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  pod = pod.patch(m->patch);
  pod["metadata"]["uid"] = "0f5e2d1c-aaaa-bbbb-cccc-123456789abc";
  pod["metadata"]["resourceVersion"] = "12";
  EXPECT_EQ(Decide(pod).step, PodStep::kIgnore);  // not scheduled yet
  pod["spec"]["nodeName"] = kNode;
  EXPECT_EQ(Decide(pod).step, PodStep::kWait);
  json running = {{"name", "vllm"}, {"state", {{"running", json::object()}}}, {"containerID", "containerd://" + kId}};
  pod["status"] = {{"containerStatuses", json::array({running})}};
  PodDecision d = Decide(pod);
  ASSERT_EQ(d.step, PodStep::kRestore) << d.reason;
  EXPECT_EQ(d.pod.container, "vllm");
  EXPECT_EQ(d.pod.snapshot, "vllm-20250101-abc123");
}

TEST(DecidePod, ContainerFromAnnotationThenFirst) {
  json pod = Placeholder();
  pod["metadata"]["annotations"].erase("gpusnap.io/mutation");
  EXPECT_EQ(Decide(pod).pod.container, "sidecar");
  pod["metadata"]["annotations"]["gpusnap.io/restore-container"] = "server";
  EXPECT_EQ(Decide(pod).pod.container, "server");
}

TEST(DecidePod, RuntimesSchemesAreStripped) {
  json pod = Placeholder();
  pod["status"]["containerStatuses"][1]["containerID"] = "cri-o://" + kId;
  EXPECT_EQ(Decide(pod).pod.container_id, kId);
}

TEST(DecidePod, OtherNodeIsIgnored) {
  json pod = Placeholder();
  pod["spec"]["nodeName"] = "gpu-node-2";
  EXPECT_EQ(Decide(pod).step, PodStep::kIgnore);
  pod["spec"].erase("nodeName");
  PodDecision d = Decide(pod);
  EXPECT_EQ(d.step, PodStep::kIgnore);
  EXPECT_EQ(d.reason, "not scheduled yet");
}

TEST(DecidePod, UnlabelledPodIsIgnored) {
  json pod = Placeholder();
  pod["metadata"]["labels"]["gpusnap.io/placeholder"] = "false";
  EXPECT_EQ(Decide(pod).step, PodStep::kIgnore);
}

TEST(DecidePod, PodWithoutSnapshotIsIgnored) {
  json pod = Placeholder();
  pod["metadata"]["annotations"].erase("gpusnap.io/restore-from");
  EXPECT_EQ(Decide(pod).step, PodStep::kIgnore);
}

TEST(DecidePod, PodBeingDeletedIsIgnored) {
  json pod = Placeholder();
  pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z";
  EXPECT_EQ(Decide(pod).step, PodStep::kIgnore);
}

TEST(DecidePod, WrongShapesAreIgnoredNotThrown) {
  EXPECT_EQ(Decide(json::array()).step, PodStep::kIgnore);
  EXPECT_EQ(Decide(json{{"metadata", "x"}}).step, PodStep::kIgnore);
  json pod = Placeholder();
  pod["status"]["containerStatuses"] = "garbage";
  EXPECT_EQ(Decide(pod).step, PodStep::kWait);
}

TEST(DecidePod, ContainerNotRunningYetWaits) {
  json pod = Placeholder();
  pod["status"]["containerStatuses"][1]["state"] = {{"waiting", {{"reason", "ContainerCreating"}}}};
  pod["status"]["containerStatuses"][1].erase("containerID");
  PodDecision d = Decide(pod);
  EXPECT_EQ(d.step, PodStep::kWait);
  EXPECT_NE(d.reason.find("`server` is not running"), std::string::npos);
  pod["status"].erase("containerStatuses");
  EXPECT_EQ(Decide(pod).step, PodStep::kWait);
}

TEST(DecidePod, RestoredAndFailedAreDone) {
  EXPECT_EQ(Decide(WithAnnotation(Placeholder(), "gpusnap.io/restore-status", "restored")).step, PodStep::kDone);
  EXPECT_EQ(Decide(WithAnnotation(Placeholder(), "gpusnap.io/restore-status", "failed")).step, PodStep::kDone);
  EXPECT_EQ(Decide(WithAnnotation(Placeholder(), "gpusnap.io/restore-status", "paused")).step, PodStep::kDone);
}

TEST(DecidePod, PodInHandIsNeverRestoredTwice) {
  PodDecision d = Decide(Placeholder(), Memory::kInHand);
  EXPECT_EQ(d.step, PodStep::kDone);
  EXPECT_EQ(d.reason, "this agent is restoring it");
}

TEST(DecidePod, RestoringByAnEarlierAgentIsRecovered) {
  json pod = WithAnnotation(Placeholder(), "gpusnap.io/restore-status", "restoring");
  PodDecision d = Decide(WithAnnotation(pod, "gpusnap.io/restore-job", "job-0123456789abcdef"));
  EXPECT_EQ(d.step, PodStep::kRecover);
  EXPECT_EQ(d.pod.restore_job, "job-0123456789abcdef");
  EXPECT_EQ(d.pod.container_id, kId);
  // What this agent recorded already: an older version of the pod, not to be recorded again.
  EXPECT_EQ(Decide(pod, Memory::kRecorded).step, PodStep::kDone);
}

TEST(DecidePod, StatusRemovedAfterARecordIsANewAttempt) {
  EXPECT_EQ(Decide(Placeholder(), Memory::kRecorded).step, PodStep::kRestore);
}

TEST(DecidePod, InvalidSnapshotIdFails) {
  PodDecision d = Decide(WithAnnotation(Placeholder(), "gpusnap.io/restore-from", ".etc"));
  EXPECT_EQ(d.step, PodStep::kFail);
  EXPECT_NE(d.reason.find("invalid snapshot id `.etc`"), std::string::npos);
}

TEST(DecidePod, ARegistryReferenceIsRestoredAndAMalformedOneFails) {
  PodDecision d = Decide(WithAnnotation(Placeholder(), "gpusnap.io/restore-from", "registry.example:5000/ml/vllm:warm"));
  ASSERT_EQ(d.step, PodStep::kRestore) << d.reason;
  EXPECT_EQ(d.pod.snapshot, "registry.example:5000/ml/vllm:warm");
  EXPECT_NE(d.reason.find("registry reference"), std::string::npos) << d.reason;
  // With a `/`, a reference, and refused as one.
  PodDecision bad = Decide(WithAnnotation(Placeholder(), "gpusnap.io/restore-from", "../etc"));
  EXPECT_EQ(bad.step, PodStep::kFail);
  EXPECT_NE(bad.reason.find("gpusnap.io/restore-from: invalid snapshot id `../etc` (an id holds no `/`), nor a "
                            "registry reference: invalid registry reference `../etc`"),
            std::string::npos)
      << bad.reason;
}

TEST(RestoreProgress, ThePullThenWhatItDid) {
  Job job;
  job.kind = "restore";
  EXPECT_EQ(RestoreProgress(job), "");  // a snapshot of the store: nothing to show
  job.transfer.emplace();
  job.transfer->reference = "r.example/ml/x:v1";
  EXPECT_EQ(RestoreProgress(job), "pulling r.example/ml/x:v1");
  job.transfer->progress = "pull: 3 of 9 blobs moved";
  EXPECT_EQ(RestoreProgress(job), "pull: 3 of 9 blobs moved");
  // The restore goes on beside the chunks' pull.
  job.phase = "pull-files";
  EXPECT_EQ(RestoreProgress(job), "pull: 3 of 9 blobs moved; restoring, pull-files done");
  job.transfer->done = true;
  job.transfer->digest = "sha256:ab";
  job.transfer->blobs = 9;
  job.transfer->blobs_moved = 9;
  job.transfer->bytes_moved = 2048;
  job.phase = "verify";
  EXPECT_EQ(RestoreProgress(job), "pulled r.example/ml/x:v1 (sha256:ab): 9 of 9 blobs, 2.0 KiB; restoring, verify done");
  job.transfer->already_present = true;
  EXPECT_EQ(RestoreProgress(job), "r.example/ml/x:v1 (sha256:ab) was in the node's store; restoring, verify done");
  json pod = Placeholder();
  pod.merge_patch(ProgressPatch("pull: 1 of 2"));
  EXPECT_EQ(pod["metadata"]["annotations"]["gpusnap.io/restore-progress"], "pull: 1 of 2");
  // The result's record takes it away.
  pod.merge_patch(RecordPatch({std::string(k8s::kRestoreStatusRestored), "job-2222222222222222", ""}));
  EXPECT_FALSE(pod["metadata"]["annotations"].contains("gpusnap.io/restore-progress"));
}

TEST(DecidePod, MissingContainerFails) {
  json pod = Placeholder();
  pod["metadata"]["annotations"].erase("gpusnap.io/mutation");
  pod["metadata"]["annotations"]["gpusnap.io/restore-container"] = "nope";
  PodDecision d = Decide(pod);
  EXPECT_EQ(d.step, PodStep::kFail);
  EXPECT_NE(d.reason.find("no container `nope`"), std::string::npos);
}

TEST(DecidePod, ContainerIdTheAgentCannotFindFails) {
  json pod = Placeholder();
  pod["status"]["containerStatuses"][1]["containerID"] = "containerd://NOT-HEX";
  PodDecision d = Decide(pod);
  EXPECT_EQ(d.step, PodStep::kFail);
  EXPECT_NE(d.reason.find("containerd://NOT-HEX"), std::string::npos);
}

TEST(RecordPatch, ClaimCarriesThePreconditionAndClearsOldResults) {
  json pod = WithAnnotation(WithAnnotation(Placeholder(), "gpusnap.io/restore-error", "old"), "gpusnap.io/restore-job",
                            "job-1111111111111111");
  json patch = RecordPatch({std::string(k8s::kRestoreStatusRestoring), "", ""}, "4711");
  EXPECT_EQ(patch["metadata"]["resourceVersion"], "4711");
  pod.merge_patch(patch);
  const json& a = pod["metadata"]["annotations"];
  EXPECT_EQ(a["gpusnap.io/restore-status"], "restoring");
  EXPECT_FALSE(a.contains("gpusnap.io/restore-error"));
  EXPECT_FALSE(a.contains("gpusnap.io/restore-job"));
  EXPECT_EQ(a["gpusnap.io/restore-from"], "vllm-warm");  // the rest untouched
}

TEST(RecordPatch, ResultWithoutPrecondition) {
  json pod = Placeholder();
  json patch = RecordPatch({std::string(k8s::kRestoreStatusFailed), "job-2222222222222222", "no snapshot `x`"});
  EXPECT_FALSE(patch["metadata"].contains("resourceVersion"));
  pod.merge_patch(patch);
  const json& a = pod["metadata"]["annotations"];
  EXPECT_EQ(a["gpusnap.io/restore-status"], "failed");
  EXPECT_EQ(a["gpusnap.io/restore-job"], "job-2222222222222222");
  EXPECT_EQ(a["gpusnap.io/restore-error"], "no snapshot `x`");
}

TEST(RecordPatch, ARootfsRestoreSaysSoAndWhy) {
  json pod = Placeholder();
  RestoreRecord restored{std::string(k8s::kRestoreStatusRestored), "job-2222222222222222", ""};
  restored.path = "rootfs";
  restored.fallback_reason = "process restore refused: the snapshot needs driver 580, this node has 570";
  pod.merge_patch(RecordPatch(restored));
  const json& a = pod["metadata"]["annotations"];
  EXPECT_EQ(a["gpusnap.io/restore-path"], "rootfs");
  EXPECT_EQ(a["gpusnap.io/restore-fallback-reason"], restored.fallback_reason);
  // A new attempt's claim clears them.
  pod.merge_patch(RecordPatch({std::string(k8s::kRestoreStatusRestoring), "", ""}, "4712"));
  EXPECT_FALSE(a.contains("gpusnap.io/restore-path"));
  EXPECT_FALSE(a.contains("gpusnap.io/restore-fallback-reason"));
}

TEST(RecordPatch, LongErrorsAreCut) {
  json patch = RecordPatch({std::string(k8s::kRestoreStatusFailed), "", std::string(10000, 'e')});
  EXPECT_EQ(patch["metadata"]["annotations"]["gpusnap.io/restore-error"].get<std::string>().size(), 4000u);
}

TEST(RestoreEvent, NamesThePodsContainer) {
  PodDecision d = Decide(Placeholder());
  json e = RestoreEvent(d.pod, true, "restored it", kNode, "2026-01-01T00:00:00Z", "18a2b3c4d5e6f708");
  EXPECT_EQ(e["kind"], "Event");
  EXPECT_EQ(e["metadata"]["name"], "vllm-0.18a2b3c4d5e6f708");
  EXPECT_EQ(e["metadata"]["namespace"], "ml");
  EXPECT_EQ(e["involvedObject"]["uid"], "3f2a9c1e-0b7d-4c11-9e2f-5b8a7d6c4e21");
  EXPECT_EQ(e["involvedObject"]["fieldPath"], "spec.containers{server}");
  EXPECT_EQ(e["reason"], "GpusnapRestored");
  EXPECT_EQ(e["type"], "Normal");
  EXPECT_EQ(e["source"]["host"], kNode);
  EXPECT_EQ(e["firstTimestamp"], "2026-01-01T00:00:00Z");
  json failed = RestoreEvent(d.pod, false, std::string(5000, 'x'), kNode, "t", "1");
  EXPECT_EQ(failed["reason"], "GpusnapRestoreFailed");
  EXPECT_EQ(failed["type"], "Warning");
  EXPECT_EQ(failed["message"].get<std::string>().size(), 1024u);
}

TEST(RestoreEvent, NameFitsWithALongPodName) {
  PlaceholderPod pod;
  pod.name = std::string(253, 'p');
  json e = RestoreEvent(pod, true, "m", kNode, "t", "18a2b3c4d5e6f708");
  EXPECT_EQ(e["metadata"]["name"].get<std::string>().size(), 253u);
}

TEST(WorkloadNameForPod, FitsTheWorkloadNameRules) {
  EXPECT_EQ(WorkloadNameForPod("vllm-0", "3f2a9c1e-0b7d"), "vllm-0-3f2a9c1e");
  std::string long_name = WorkloadNameForPod("a-very-long-deployment-name-7d9f8c6b5-xk2p9", "3f2a9c1e-0b7d");
  EXPECT_EQ(long_name, "a-very-long-deployment-name-7d9-3f2a9c1e");
  EXPECT_TRUE(IsValidWorkloadName(long_name));
  EXPECT_EQ(WorkloadNameForPod("abc" + std::string(40, '-') + "xyz", "12345678"), "abc-12345678");
  EXPECT_TRUE(IsValidWorkloadName(WorkloadNameForPod(std::string(300, 'x'), "")));
}

Job MakeJob(const std::string& id, const std::string& kind, const std::string& container, const std::string& created) {
  Job j;
  j.id = id;
  j.kind = kind;
  j.lock_key = "container:" + container;
  j.created = created;
  return j;
}

TEST(FindRestoreJob, ByAnnotationElseNewestIntoTheContainer) {
  Job old_restore = MakeJob("job-1000000000000000", "restore", kId, "2026-01-01T00:00:01.000Z");
  Job new_restore = MakeJob("job-2000000000000000", "restore", kId, "2026-01-01T00:00:02.000Z");
  Job checkpoint = MakeJob("job-3000000000000000", "checkpoint", kId, "2026-01-01T00:00:03.000Z");
  Job elsewhere = MakeJob("job-4000000000000000", "restore", std::string(64, 'c'), "2026-01-01T00:00:04.000Z");
  std::vector<Job> jobs = {old_restore, new_restore, checkpoint, elsewhere};
  PlaceholderPod pod = Decide(Placeholder()).pod;
  ASSERT_NE(FindRestoreJob(jobs, pod), nullptr);
  EXPECT_EQ(FindRestoreJob(jobs, pod)->id, new_restore.id);
  pod.restore_job = old_restore.id;
  EXPECT_EQ(FindRestoreJob(jobs, pod)->id, old_restore.id);
  pod.restore_job = "job-9999999999999999";  // unknown: by container
  EXPECT_EQ(FindRestoreJob(jobs, pod)->id, new_restore.id);
  pod.container_id = std::string(64, 'd');
  pod.restore_job.clear();
  EXPECT_EQ(FindRestoreJob(jobs, pod), nullptr);
}

TEST(PodPaths, NamespacedPaths) {
  PlaceholderPod pod = Decide(Placeholder()).pod;
  EXPECT_EQ(PodPath(pod), "/api/v1/namespaces/ml/pods/vllm-0");
  EXPECT_EQ(EventsPath(pod), "/api/v1/namespaces/ml/events");
}

}  // namespace
}  // namespace gpusnap::agent
