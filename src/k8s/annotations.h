// The pod contract: the gpusnap.io/ annotations and labels a pod carries,
// who writes each and what its values mean (docs/WEBHOOK.md,
// docs/KUBERNETES.md). The webhook (k8s/mutate.h) and the agent
// (agent/kube/, agent/service/pod_annotations.h) read and write pods by these
// names only.
#pragma once

#include <string_view>

namespace gpusnap::k8s {

// ---- asked by the pod's author, read by the webhook ------------------------

// "true": the GPU containers get the gpushare shim, the node's bundle and a
// per-pod chunk store. Any other value is ignored, with a warning.
inline constexpr std::string_view kAnnotationGpushare = "gpusnap.io/gpushare";
inline constexpr std::string_view kGpushareOn = "true";
// A snapshot id of the node's store, or a registry reference (it holds a
// `/`; store/snapshot_ref.h): the pod becomes a placeholder the agent on its
// node restores into. Read by the agent too.
inline constexpr std::string_view kAnnotationRestoreFrom = "gpusnap.io/restore-from";
// The name of the placeholder's target container; unset: the first. Read by
// the agent too, after gpusnap.io/mutation's record.
inline constexpr std::string_view kAnnotationRestoreContainer = "gpusnap.io/restore-container";
// The placeholder's GPU count, 1 to the webhook's maximum; unset: the
// snapshot's, else 1.
inline constexpr std::string_view kAnnotationGpuCount = "gpusnap.io/gpu-count";

// ---- written by the webhook ------------------------------------------------

// The target container's original command and args, as JSON.
inline constexpr std::string_view kAnnotationOriginalCommand = "gpusnap.io/original-command";
// What the mutation did, as JSON (the agent reads the target container from it).
inline constexpr std::string_view kAnnotationMutation = "gpusnap.io/mutation";
// The label of a placeholder pod, valued "true": what the agent's watch selects.
inline constexpr std::string_view kLabelPlaceholder = "gpusnap.io/placeholder";
inline constexpr std::string_view kLabelPlaceholderOn = "true";

// ---- asked by the pod's author, read by the agent's checkpoints of it ------
// (a request's own field wins over the annotation)

// A registry reference the snapshot is pushed to.
inline constexpr std::string_view kAnnotationPushTo = "gpusnap.io/push-to";
// auto | process | rootfs | both (docs/CAPTURE-PATHS.md); unset: auto.
inline constexpr std::string_view kAnnotationCapturePath = "gpusnap.io/capture-path";
// Comma-separated container paths of cache directories.
inline constexpr std::string_view kAnnotationCaches = "gpusnap.io/caches";
// Comma-separated patterns the rootfs capture leaves out.
inline constexpr std::string_view kAnnotationRootfsExclude = "gpusnap.io/rootfs-exclude";

// ---- written by the agent ----------------------------------------------------

// A checkpoint's choice: process | rootfs | both.
inline constexpr std::string_view kAnnotationCapturePathChosen = "gpusnap.io/capture-path-chosen";
// Why it chose so (removed when the checkpoint gives none).
inline constexpr std::string_view kAnnotationCapturePathReason = "gpusnap.io/capture-path-reason";

// A placeholder's restore: restoring | restored | failed. A pod with any
// status is never restored again; removing it asks for a new attempt.
inline constexpr std::string_view kAnnotationRestoreStatus = "gpusnap.io/restore-status";
inline constexpr std::string_view kRestoreStatusRestoring = "restoring";
inline constexpr std::string_view kRestoreStatusRestored = "restored";
inline constexpr std::string_view kRestoreStatusFailed = "failed";
// The agent's job id (GET /v1/jobs/<id> on its node).
inline constexpr std::string_view kAnnotationRestoreJob = "gpusnap.io/restore-job";
// Why it failed (failed only).
inline constexpr std::string_view kAnnotationRestoreError = "gpusnap.io/restore-error";
// While a reference is pulled and restored: how far; removed with the result.
inline constexpr std::string_view kAnnotationRestoreProgress = "gpusnap.io/restore-progress";
// Restored only: process, or rootfs (a cold start with warm caches).
inline constexpr std::string_view kAnnotationRestorePath = "gpusnap.io/restore-path";
// Why a `both` snapshot was not restored as a process.
inline constexpr std::string_view kAnnotationRestoreFallbackReason = "gpusnap.io/restore-fallback-reason";

// The reportingComponent of the agent's Events on a pod.
inline constexpr std::string_view kEventReportingComponent = "gpusnap.io/agent";

}  // namespace gpusnap::k8s
