// The admission webhook's mutation: a pure function, pod in, JSONPatch out.
//
// Two opt-in annotations (docs/WEBHOOK.md says why each change is made; the
// names and values of the pod contract are k8s/annotations.h's):
//
//  gpusnap.io/gpushare: "true"
//    Every container and init container that requests nvidia.com/gpu gets the
//    node's gpusnap bundle read-only at /gpusnap, the shim appended to
//    LD_PRELOAD (an existing literal value is kept in front of it) and a
//    per-pod chunk store: a hostPath mounted with
//    subPathExpr $(GPUSNAP_POD_UID), that variable coming from the downward
//    API (metadata.uid) whatever the pod set it to: a value of its own would
//    let it mount another pod's chunk store, or all of them (an empty one).
//    A container whose LD_PRELOAD comes from valueFrom is left unchanged,
//    with a warning; so is one whose mount path is taken by another volume.
//
//  gpusnap.io/restore-from: <snapshot id> | <registry reference>
//    The pod becomes a placeholder: the target container (the one named by
//    gpusnap.io/restore-container, else the first) keeps its image, runs the
//    reaper as pid 1 (command replaced, args removed, the originals recorded
//    in gpusnap.io/original-command), gets the bundle mounted read-only and
//    requests the snapshot's GPU count; the pod is labelled
//    gpusnap.io/placeholder: "true" so the agent on its node restores into it.
//    The GPU count is gpusnap.io/gpu-count if given, else what
//    MutateConfig::snapshot_gpu_count says, else 1.
//    A value with a `/` is a registry reference (store/registry_reference.h),
//    checked for its syntax only: the webhook does not reach the registry.
//    The agent of whatever node the pod lands on pulls it; the GPU count is
//    gpusnap.io/gpu-count, else 1 (warned).
//    No snapshot, and no part of the store, is ever mounted into a pod: the
//    agent reads the store itself and hands CRIU the images, so a pod can
//    read no snapshot's memory, its own namespace's or another's
//    (docs/SECURITY.md).
//
// Both may be combined; the placeholder's reaper never gets LD_PRELOAD (the
// restored process brings its own environment). Whatever was done is recorded
// as JSON in the annotation gpusnap.io/mutation.
//
// Idempotent: mutating an already mutated pod yields an empty patch. Volumes
// already present (same hostPath) are reused under their own name.
// Containers without GPUs are never touched.
//
// Thread-safety: MutatePod is pure; it calls config.snapshot_gpu_count, which
// must be safe to call from several threads if the caller mutates in parallel.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpusnap/status.h"
#include "k8s/annotations.h"

namespace gpusnap::k8s {

inline constexpr std::string_view kGpuResource = "nvidia.com/gpu";
inline constexpr std::string_view kPodUidEnv = "GPUSNAP_POD_UID";
inline constexpr std::string_view kChunkStoreEnv = "GPUSNAP_CHUNK_STORE";

// Where things are on the node and inside the container. Host paths are
// absolute; mount paths are absolute and distinct.
struct MutateConfig {
  std::string bundle_host_path = "/var/lib/gpusnap/bundle";
  std::string bundle_mount_path = "/gpusnap";
  std::string shim_path = "/gpusnap/lib/libgpusnap_gpushare.so";  // inside the container
  std::string chunk_store_host_path = "/var/lib/gpusnap/pods";   // one subdirectory per pod uid
  std::string chunk_store_mount_path = "/gpusnap-store";
  std::vector<std::string> reaper_command = {"/gpusnap/bin/gpusnap", "__placeholder"};
  // The GPU count recorded for a snapshot id; empty, or an error (which
  // becomes a warning), falls back to 1.
  std::function<Result<int>(const std::string& snapshot_id)> snapshot_gpu_count;
};

struct Mutation {
  nlohmann::json patch = nlohmann::json::array();  // RFC 6902 operations; empty: nothing to do
  std::vector<std::string> warnings;               // for AdmissionReview's response.warnings
  std::string summary;                             // one line for the log ("gpushare: a, b; restore: ...")
};

// Computes the patch for `pod` (a v1 Pod as the API server sends it).
// Errors (the pod is then to be admitted unchanged, with a warning):
//   kInvalidArgument: the pod's JSON does not have a Pod's shape (naming the
//     field), the restore annotation names an invalid snapshot id or a
//     malformed registry reference, or the restore container does not exist.
Result<Mutation> MutatePod(const nlohmann::json& pod, const MutateConfig& config);

}  // namespace gpusnap::k8s
