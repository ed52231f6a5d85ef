// The mutation is built as the wanted pod, from "ensure" edits that find
// their work already done on a second pass, and the patch is the RFC 6902
// difference between the pod received and the pod wanted. Idempotence thus
// rests on the edits alone, and the JSON Pointer escaping of keys such as
// gpusnap.io/mutation (gpusnap.io~1mutation) on nlohmann-json's diff.
#include "k8s/mutate.h"

#include <charconv>

#include "gpusnap/snapshot.h"
#include "k8s/pod_edit.h"
#include "store/registry_reference.h"
#include "store/snapshot_ref.h"

namespace gpusnap::k8s {

using nlohmann::json;

namespace {

constexpr int kMaxGpus = 1024;

json ReadOnlyMount(const std::string& volume, const std::string& path) {
  return {{"name", volume}, {"mountPath", path}, {"readOnly", true}};
}

HostPathVolume BundleVolume(const json& pod, const MutateConfig& config) {
  return ResolveVolume(pod, {"gpusnap-bundle", config.bundle_host_path, "Directory"});
}

// The first of `mounts` whose path another volume occupies, or null.
const json* Conflict(const json& container, const std::vector<json>& mounts) {
  for (const json& m : mounts)
    if (CheckMount(container, m) == MountState::kConflict) return &m;
  return nullptr;
}

std::string ConflictText(const json& container, const json& mount) {
  return fmt::format("container `{}`: mount path `{}` is taken by another volume", container.value("name", ""),
                     mount["mountPath"].get<std::string>());
}

int ParseGpuCount(const std::string& text) {
  int n = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 1 || n > kMaxGpus) return 0;
  return n;
}

// `reference`: the webhook cannot see into the registry, so only the pod's
// annotation can say more than 1.
int SnapshotGpuCount(const json& pod, const std::string& id, bool reference, const MutateConfig& config,
                     std::vector<std::string>& warnings) {
  if (std::string text = Annotation(pod, kAnnotationGpuCount); !text.empty()) {
    if (int n = ParseGpuCount(text)) return n;
    warnings.push_back(fmt::format("{}: `{}` is not a GPU count (1-{}); ignored", kAnnotationGpuCount, text, kMaxGpus));
  }
  if (reference) {
    warnings.push_back(fmt::format("GPU count of `{}` unknown (a registry reference: the webhook does not read the "
                                   "registry); requesting 1, unless {} says",
                                   id, kAnnotationGpuCount));
    return 1;
  }
  if (!config.snapshot_gpu_count) return 1;
  auto n = config.snapshot_gpu_count(id);
  if (n.ok() && *n >= 1 && *n <= kMaxGpus) return *n;
  std::string why = n.ok() ? fmt::format("got {}", *n) : n.status().ToString();
  warnings.push_back(fmt::format("GPU count of snapshot `{}` unknown ({}); requesting 1", id, why));
  return 1;
}

// The container the snapshot is restored into.
Result<json*> RestoreTarget(json& pod) {
  json& containers = pod["spec"]["containers"];
  std::string want = Annotation(pod, kAnnotationRestoreContainer);
  if (want.empty()) {
    if (containers.empty()) return Status::Error(Code::kInvalidArgument, "pod has no containers");
    return &containers[0];
  }
  for (json& c : containers)
    if (c.value("name", "") == want) return &c;
  return Status::Error(Code::kInvalidArgument, "{}: pod has no container `{}`", kAnnotationRestoreContainer, want);
}

// Makes the pod a placeholder for the snapshot named by restore-from (an id
// in the node's store, or a registry reference the agent pulls). Returns the
// placeholder container's name; fills record["restore"].
Result<std::string> MakePlaceholder(json& pod, const MutateConfig& config, Mutation& out, json& record) {
  std::string id = Annotation(pod, kAnnotationRestoreFrom);
  auto source = ParseSnapshotRef(id);
  if (!source.ok()) return source.status().Wrap(std::string(kAnnotationRestoreFrom));
  bool reference = source->from_registry();
  GPUSNAP_ASSIGN_OR_RETURN(json * c, RestoreTarget(pod));
  std::string name = c->value("name", "");

  // The bundle only: the agent reads the snapshot from its store (or pulls
  // it) and hands CRIU its images; nothing of the store enters the pod.
  HostPathVolume bundle = BundleVolume(pod, config);
  json mount = ReadOnlyMount(bundle.name, config.bundle_mount_path);
  if (CheckMount(*c, mount) == MountState::kConflict)
    return Status::Error(Code::kInvalidArgument, "{}", ConflictText(*c, mount));
  int gpus = SnapshotGpuCount(pod, id, reference, config, out.warnings);

  json reaper = config.reaper_command;
  if (c->value("command", json()) != reaper) {
    json original = json::object();
    for (const char* k : {"command", "args"})
      if (c->contains(k)) original[k] = (*c)[k];
    SetAnnotation(pod, kAnnotationOriginalCommand, original.dump());
    (*c)["command"] = reaper;
  }
  c->erase("args");
  for (const char* probe : {"livenessProbe", "startupProbe"})
    if (c->contains(probe))
      out.warnings.push_back(fmt::format("container `{}`: its {} may restart the placeholder before the restore", name, probe));

  EnsureVolume(pod, bundle);
  EnsureMount(*c, mount);
  SetResourceCount(*c, kGpuResource, gpus);
  SetLabel(pod, kLabelPlaceholder, std::string(kLabelPlaceholderOn));
  record["restore"] = {{"container", name}, {"snapshot", id}, {"gpus", gpus}};
  return name;
}

// Gives every GPU container (but the placeholder's reaper) the shim; fills
// record["gpushare"] with the containers that have it.
void AddGpushare(json& pod, const MutateConfig& config, const std::string& placeholder, Mutation& out,
                 json& record) {
  HostPathVolume bundle = BundleVolume(pod, config);
  HostPathVolume store = ResolveVolume(pod, {"gpusnap-store", config.chunk_store_host_path, "DirectoryOrCreate"});
  std::vector<json> mounts = {ReadOnlyMount(bundle.name, config.bundle_mount_path),
                              {{"name", store.name},
                               {"mountPath", config.chunk_store_mount_path},
                               {"subPathExpr", fmt::format("$({})", kPodUidEnv)}}};
  json done = json::array();
  for (json* c : AllContainers(pod)) {
    if (!RequestsResource(*c, kGpuResource)) continue;
    std::string name = c->value("name", "");
    bool preload = name != placeholder;
    const json* ld = FindEnv(*c, "LD_PRELOAD");
    if (preload && ld != nullptr && ld->contains("valueFrom")) {
      out.warnings.push_back(fmt::format(
          "container `{}`: LD_PRELOAD comes from valueFrom, so the gpushare shim cannot be added; left unchanged", name));
      continue;
    }
    if (const json* m = Conflict(*c, mounts)) {
      out.warnings.push_back(ConflictText(*c, *m) + "; left unchanged");
      continue;
    }
    EnsureVolume(pod, bundle);
    EnsureVolume(pod, store);
    for (const json& m : mounts) EnsureMount(*c, m);
    // The pod's uid, never a value of the pod's own: it names the chunk store mounted.
    SetEnv(*c, {{"name", kPodUidEnv}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.uid"}}}}}});
    EnsureEnv(*c, {{"name", kChunkStoreEnv}, {"value", config.chunk_store_mount_path}});
    if (preload) AppendPreload(*c, config.shim_path);
    done.push_back(name);
  }
  record["gpushare"] = std::move(done);
}

std::string Summary(const json& record) {
  std::vector<std::string> parts;
  if (auto r = record.find("restore"); r != record.end())
    parts.push_back(fmt::format("restore: `{}` into `{}` with {} GPU(s)", (*r)["snapshot"].get<std::string>(),
                                (*r)["container"].get<std::string>(), (*r)["gpus"].get<int>()));
  if (auto g = record.find("gpushare"); g != record.end()) {
    std::vector<std::string> names = g->get<std::vector<std::string>>();
    parts.push_back(names.empty() ? "gpushare: no GPU container" : fmt::format("gpushare: {}", fmt::join(names, ", ")));
  }
  return parts.empty() ? "no gpusnap annotation" : fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace

Result<Mutation> MutatePod(const json& pod, const MutateConfig& config) {
  GPUSNAP_RETURN_IF_ERROR(ValidatePodShape(pod));
  try {
    Mutation out;
    json wanted = pod;
    json record = json::object();
    std::string placeholder;
    if (!Annotation(pod, kAnnotationRestoreFrom).empty()) {
      GPUSNAP_ASSIGN_OR_RETURN(placeholder, MakePlaceholder(wanted, config, out, record));
    }
    std::string gpushare = Annotation(pod, kAnnotationGpushare);
    if (gpushare == kGpushareOn) {
      AddGpushare(wanted, config, placeholder, out, record);
    } else if (!gpushare.empty()) {
      out.warnings.push_back(fmt::format("{}: `{}` is not \"true\"; ignored", kAnnotationGpushare, gpushare));
    }
    if (!record.empty()) SetAnnotation(wanted, kAnnotationMutation, record.dump());
    out.patch = json::diff(pod, wanted);
    out.summary = Summary(record);
    return out;
  } catch (const json::exception& e) {
    return Status::Error(Code::kInternal, "mutating pod: {}", e.what());
  }
}

}  // namespace gpusnap::k8s
