#include "agent/service/pod_annotations.h"

#include <fmt/format.h>

#include <chrono>

#include "agent/service/registry_access.h"
#include "k8s/annotations.h"
#include "snapshot/capture_path.h"
#include "util/clock.h"

namespace gpusnap::agent {

namespace {

using nlohmann::json;

// The pod's annotation `key`: nullopt when absent; kInvalidArgument when it
// is not a string (the API server never sends one, a test may).
Result<std::optional<std::string>> Annotation(const json* pod, std::string_view key) {
  if (!pod || !pod->is_object()) return std::optional<std::string>();
  auto metadata = pod->find("metadata");
  if (metadata == pod->end() || !metadata->is_object()) return std::optional<std::string>();
  auto annotations = metadata->find("annotations");
  if (annotations == metadata->end() || !annotations->is_object()) return std::optional<std::string>();
  auto it = annotations->find(key);
  if (it == annotations->end()) return std::optional<std::string>();
  if (!it->is_string()) return Status::Error(Code::kInvalidArgument, "annotation {} is not a string", key);
  return std::optional<std::string>(it->get<std::string>());
}

std::string_view Trim(std::string_view s) {
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

// Annotation values are limited only by the object's size: what is written
// back stays short.
std::string Cut(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  return std::string(text.substr(0, max - 3)) + "...";
}

}  // namespace

bool AsksThePod(const CheckpointRequest& request) {
  return request.push_to.empty() || !request.capture_path || !request.caches || !request.exclude;
}

std::vector<std::string> SplitAnnotationList(std::string_view value) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= value.size()) {
    size_t comma = value.find(',', start);
    std::string_view item = Trim(value.substr(start, comma == std::string_view::npos ? comma : comma - start));
    if (!item.empty()) out.emplace_back(item);
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return out;
}

Result<CheckpointSettings> CheckpointSettingsFor(const CheckpointRequest& request, const json* pod) {
  CheckpointSettings s;
  s.image = request.image;

  if (request.capture_path) {
    s.capture_path = *request.capture_path;
    s.capture_path_from = "the request";
  } else {
    GPUSNAP_ASSIGN_OR_RETURN(auto value, Annotation(pod, k8s::kAnnotationCapturePath));
    if (value) {
      std::optional<CapturePath> path = ParseCapturePath(Trim(*value));
      if (!path)
        return Status::Error(Code::kInvalidArgument,
                             "annotation {} `{}` is not a capture path: expected auto, process, rootfs or both",
                             k8s::kAnnotationCapturePath, Printable(*value));
      s.capture_path = *path;
      s.capture_path_from = fmt::format("annotation {}", k8s::kAnnotationCapturePath);
    }
  }

  if (request.push_to.empty() && pod) {
    GPUSNAP_ASSIGN_OR_RETURN(s.push_to, PushToOfPod(*pod));
    s.push_to_from_pod = !s.push_to.empty();
  } else {
    s.push_to = request.push_to;
  }

  // The pod's lists are for its rootfs captures: a process capture leaves
  // them unread (and unchecked).
  bool rootfs = s.capture_path != CapturePath::kProcess;
  if (request.caches) {
    s.caches = *request.caches;
  } else if (rootfs) {
    GPUSNAP_ASSIGN_OR_RETURN(auto value, Annotation(pod, k8s::kAnnotationCaches));
    if (value) {
      s.caches = SplitAnnotationList(*value);
      GPUSNAP_RETURN_IF_ERROR(CheckCaches(fmt::format("annotation {}", k8s::kAnnotationCaches), s.caches));
    }
  }
  if (request.exclude) {
    s.exclude = *request.exclude;
  } else if (rootfs) {
    GPUSNAP_ASSIGN_OR_RETURN(auto value, Annotation(pod, k8s::kAnnotationRootfsExclude));
    if (value) {
      s.exclude = SplitAnnotationList(*value);
      GPUSNAP_RETURN_IF_ERROR(CheckExclusions(fmt::format("annotation {}", k8s::kAnnotationRootfsExclude), s.exclude));
    }
  }
  return s;
}

json CapturePathChosenPatch(CapturePath path, std::string_view reason) {
  json why = reason.empty() ? json(nullptr) : json(Cut(reason, 4000));
  return {{"metadata",
           {{"annotations",
             {{std::string(k8s::kAnnotationCapturePathChosen), std::string(CapturePathName(path))},
              {std::string(k8s::kAnnotationCapturePathReason), why}}}}}};
}

json PodEvent(const EventSubject& pod, std::string_view reason, bool warning, std::string_view action,
              const std::string& message, std::string_view node, std::string_view now, std::string_view name_suffix) {
  json involved = {{"apiVersion", "v1"}, {"kind", "Pod"}, {"namespace", pod.namespace_name},
                   {"name", pod.name},   {"uid", pod.uid}};
  if (!pod.container.empty()) involved["fieldPath"] = fmt::format("spec.containers{{{}}}", pod.container);
  // Object names are at most 253 characters.
  std::string name = fmt::format("{}.{}", pod.name.substr(0, 252 - name_suffix.size()), name_suffix);
  return {{"apiVersion", "v1"},
          {"kind", "Event"},
          {"metadata", {{"name", name}, {"namespace", pod.namespace_name}}},
          {"involvedObject", involved},
          {"reason", reason},
          {"message", Cut(message, 1024)},
          {"type", warning ? "Warning" : "Normal"},
          {"action", action},
          {"source", {{"component", "gpusnap-agent"}, {"host", node}}},
          {"reportingComponent", k8s::kEventReportingComponent},
          {"reportingInstance", node},
          {"firstTimestamp", now},
          {"lastTimestamp", now},
          {"count", 1}};
}

std::function<Result<std::optional<json>>(const container::PodRef&)> MakePodLookup(
    std::shared_ptr<const k8s::KubeClient> kube) {
  return [kube](const container::PodRef& pod) -> Result<std::optional<json>> {
    auto object = kube->Get(fmt::format("/api/v1/namespaces/{}/pods/{}", pod.namespace_name, pod.name));
    if (!object.ok() && object.status().code() == Code::kNotFound) return std::optional<json>();
    if (!object.ok()) return object.status();
    return std::optional<json>(std::move(*object));
  };
}

std::function<Status(const container::PodRef&, const json&)> MakePodPatcher(
    std::shared_ptr<const k8s::KubeClient> kube) {
  return [kube](const container::PodRef& pod, const json& patch) -> Status {
    return kube->MergePatch(fmt::format("/api/v1/namespaces/{}/pods/{}", pod.namespace_name, pod.name), patch)
        .status();
  };
}

std::function<void(const container::PodRef&, const std::string&, const std::string&)> MakePodWarner(
    std::shared_ptr<const k8s::KubeClient> kube, std::string node, std::function<void(const std::string&)> log) {
  return [kube, node, log](const container::PodRef& pod, const std::string& reason, const std::string& message) {
    std::string path = fmt::format("/api/v1/namespaces/{}/pods/{}", pod.namespace_name, pod.name);
    auto object = kube->Get(path);
    if (!object.ok()) {
      log(fmt::format("pod {}/{}: no {} Event: {}", pod.namespace_name, pod.name, reason, object.status().ToString()));
      return;
    }
    std::string uid = (*object)["metadata"].value("uid", "");
    auto now = std::chrono::system_clock::now().time_since_epoch();
    json event = PodEvent({pod.namespace_name, pod.name, uid, pod.container}, reason, true, "Checkpoint", message, node,
                          NowRfc3339(),
                          fmt::format("{:x}", std::chrono::duration_cast<std::chrono::nanoseconds>(now).count()));
    if (auto posted = kube->Post(fmt::format("/api/v1/namespaces/{}/events", pod.namespace_name), event); !posted.ok())
      log(fmt::format("pod {}/{}: no {} Event: {}", pod.namespace_name, pod.name, reason, posted.status().ToString()));
  };
}

}  // namespace gpusnap::agent
