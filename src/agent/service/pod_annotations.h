// What a pod's annotations ask of the agent's checkpoints of it, and what
// the agent writes back (docs/KUBERNETES.md, "Capturing"; the names are
// k8s/annotations.h's):
//
//   gpusnap.io/push-to          a registry reference the snapshot is pushed to
//   gpusnap.io/capture-path     auto | process | rootfs | both
//   gpusnap.io/caches           comma-separated container paths of cache directories
//   gpusnap.io/rootfs-exclude   comma-separated patterns the rootfs capture leaves out
//
// A request's own field wins over the annotation; with neither, the capture
// path is auto. An annotation is read only when the request leaves it to the
// pod, so a bad one refuses only the checkpoints that would use it.
//
// Once the checkpoint has chosen, the pod is annotated
//   gpusnap.io/capture-path-chosen   process | rootfs | both
//   gpusnap.io/capture-path-reason   why (removed when the checkpoint gives none)
//
// Pure, but for the Make* functions, which reach the API server.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/api/request.h"
#include "container/containers.h"
#include "gpusnap/status.h"
#include "k8s/kube_client.h"

namespace gpusnap::agent {

// The agent's capture path when neither the request nor the pod names one.
inline constexpr CapturePath kDefaultCapturePath = CapturePath::kAuto;

// What one checkpoint takes, all sources merged.
struct CheckpointSettings {
  CapturePath capture_path = kDefaultCapturePath;
  std::string capture_path_from = "the agent's default";  // or "the request", or the annotation's name
  std::vector<std::string> caches;
  std::vector<std::string> exclude;
  std::string image;
  std::string push_to;
  bool push_to_from_pod = false;  // the pod's annotation named it: its namespace's rules govern it
};

// True when `request` leaves one of the settings above to its pod.
bool AsksThePod(const CheckpointRequest& request);

// The request's fields, else `pod`'s annotations (a v1 Pod; null when there
// is none, or none the API server knows), else the defaults. The request is
// taken as ParseCheckpointRequest checked it; an annotation that is used is
// checked as the request's field would be, and refused (kInvalidArgument)
// naming the annotation and quoting the value. A `process` capture takes no
// caches or exclusions: those of the pod are then left out.
Result<CheckpointSettings> CheckpointSettingsFor(const CheckpointRequest& request, const nlohmann::json* pod);

// The items of a comma-separated annotation, each trimmed of blanks; empty
// items are dropped.
std::vector<std::string> SplitAnnotationList(std::string_view value);

// The merge patch that records the checkpoint's choice on its pod.
nlohmann::json CapturePathChosenPatch(CapturePath path, std::string_view reason);

// The reason of the Warning Event on a pod whose gpusnap.io/push-to its
// namespace may not use (docs/SECURITY.md).
inline constexpr std::string_view kReasonPushRefused = "GpusnapPushRefused";

// A core v1 Event the agent on `node` posts about a pod (its container
// `container`, if named): `reason`, Normal or Warning. `now` is RFC 3339;
// `name_suffix` makes the Event's name unique (hex digits).
struct EventSubject {
  std::string namespace_name, name, uid, container;
};
nlohmann::json PodEvent(const EventSubject& pod, std::string_view reason, bool warning, std::string_view action,
                        const std::string& message, std::string_view node, std::string_view now,
                        std::string_view name_suffix);

// What ServiceOptions::pod asks for: the pod as the API server has it;
// nullopt for a pod it does not know (a static pod's mirror, a test's
// container), which asks for nothing.
std::function<Result<std::optional<nlohmann::json>>(const container::PodRef&)> MakePodLookup(
    std::shared_ptr<const k8s::KubeClient> kube);
// What ServiceOptions::warn_pod asks for: a Warning Event on the pod (its
// uid read first), from the agent on `node`; best effort, what fails is logged.
std::function<void(const container::PodRef&, const std::string&, const std::string&)> MakePodWarner(
    std::shared_ptr<const k8s::KubeClient> kube, std::string node, std::function<void(const std::string&)> log);
// What ServiceOptions::patch_pod asks for: a merge patch of the pod.
std::function<Status(const container::PodRef&, const nlohmann::json&)> MakePodPatcher(
    std::shared_ptr<const k8s::KubeClient> kube);

}  // namespace gpusnap::agent
