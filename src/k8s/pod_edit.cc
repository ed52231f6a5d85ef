#include "k8s/pod_edit.h"

#include <algorithm>

namespace gpusnap::k8s {

using nlohmann::json;

namespace {

const char* TypeName(json::value_t t) {
  switch (t) {
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    default: return "of another type";
  }
}

// Checks parent[key], when present (or always, with `required`), for `type`.
Status Expect(const json& parent, const char* key, json::value_t type, const std::string& where, bool required = false) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) {
    if (!required) return Status::Ok();
    return Status::Error(Code::kInvalidArgument, "pod has no `{}{}`", where, key);
  }
  if (it->type() != type) return Status::Error(Code::kInvalidArgument, "pod field `{}{}` is not {}", where, key, TypeName(type));
  return Status::Ok();
}

// Every element of parent[key] (an array, if present) is an object whose
// `string_keys` are strings when present.
Status ExpectObjects(const json& parent, const char* key, const std::string& where,
                     std::initializer_list<const char*> string_keys) {
  GPUSNAP_RETURN_IF_ERROR(Expect(parent, key, json::value_t::array, where));
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return Status::Ok();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    std::string at = fmt::format("{}{}[{}]", where, key, i);
    if (!e.is_object()) return Status::Error(Code::kInvalidArgument, "pod field `{}` is not an object", at);
    for (const char* k : string_keys) GPUSNAP_RETURN_IF_ERROR(Expect(e, k, json::value_t::string, at + "."));
  }
  return Status::Ok();
}

Status ValidateContainer(const json& c, const std::string& at) {
  GPUSNAP_RETURN_IF_ERROR(Expect(c, "name", json::value_t::string, at, true));
  GPUSNAP_RETURN_IF_ERROR(ExpectObjects(c, "env", at, {"name", "value"}));
  GPUSNAP_RETURN_IF_ERROR(ExpectObjects(c, "volumeMounts", at, {"name", "mountPath"}));
  GPUSNAP_RETURN_IF_ERROR(Expect(c, "command", json::value_t::array, at));
  GPUSNAP_RETURN_IF_ERROR(Expect(c, "args", json::value_t::array, at));
  GPUSNAP_RETURN_IF_ERROR(Expect(c, "resources", json::value_t::object, at));
  if (auto r = c.find("resources"); r != c.end() && r->is_object()) {
    GPUSNAP_RETURN_IF_ERROR(Expect(*r, "limits", json::value_t::object, at + "resources."));
    GPUSNAP_RETURN_IF_ERROR(Expect(*r, "requests", json::value_t::object, at + "resources."));
  }
  return Status::Ok();
}

bool IsNonZeroQuantity(const json& q) {
  if (q.is_number()) return q.get<double>() != 0;
  if (!q.is_string()) return false;
  const auto& s = q.get_ref<const std::string&>();
  // A quantity is zero when all its digits are ("0", "00", "0.0"); a suffix
  // does not change that.
  return std::any_of(s.begin(), s.end(), [](char ch) { return ch >= '1' && ch <= '9'; });
}

json& Child(json& parent, const char* key, json empty) {
  json& c = parent[key];
  if (c.is_null()) c = std::move(empty);
  return c;
}

}  // namespace

Status ValidatePodShape(const json& pod) {
  if (!pod.is_object()) return Status::Error(Code::kInvalidArgument, "pod is not a JSON object");
  GPUSNAP_RETURN_IF_ERROR(Expect(pod, "metadata", json::value_t::object, ""));
  if (auto m = pod.find("metadata"); m != pod.end() && m->is_object()) {
    GPUSNAP_RETURN_IF_ERROR(Expect(*m, "annotations", json::value_t::object, "metadata."));
    GPUSNAP_RETURN_IF_ERROR(Expect(*m, "labels", json::value_t::object, "metadata."));
  }
  GPUSNAP_RETURN_IF_ERROR(Expect(pod, "spec", json::value_t::object, "", true));
  const json& spec = pod["spec"];
  GPUSNAP_RETURN_IF_ERROR(Expect(spec, "containers", json::value_t::array, "spec.", true));
  GPUSNAP_RETURN_IF_ERROR(ExpectObjects(spec, "volumes", "spec.", {"name"}));
  for (const char* list : {"containers", "initContainers"}) {
    GPUSNAP_RETURN_IF_ERROR(ExpectObjects(spec, list, "spec.", {}));
    auto it = spec.find(list);
    if (it == spec.end() || it->is_null()) continue;
    for (size_t i = 0; i < it->size(); ++i)
      GPUSNAP_RETURN_IF_ERROR(ValidateContainer((*it)[i], fmt::format("spec.{}[{}].", list, i)));
  }
  return Status::Ok();
}

std::string Annotation(const json& pod, std::string_view key) {
  auto m = pod.find("metadata");
  if (m == pod.end() || !m->is_object()) return "";
  auto a = m->find("annotations");
  if (a == m->end() || !a->is_object()) return "";
  auto v = a->find(std::string(key));
  return v != a->end() && v->is_string() ? v->get<std::string>() : "";
}

void SetAnnotation(json& pod, std::string_view key, const std::string& value) {
  Child(Child(pod, "metadata", json::object()), "annotations", json::object())[std::string(key)] = value;
}

void SetLabel(json& pod, std::string_view key, const std::string& value) {
  Child(Child(pod, "metadata", json::object()), "labels", json::object())[std::string(key)] = value;
}

bool RequestsResource(const json& container, std::string_view resource) {
  auto r = container.find("resources");
  if (r == container.end() || !r->is_object()) return false;
  for (const char* kind : {"limits", "requests"}) {
    auto k = r->find(kind);
    if (k == r->end() || !k->is_object()) continue;
    auto q = k->find(std::string(resource));
    if (q != k->end() && IsNonZeroQuantity(*q)) return true;
  }
  return false;
}

void SetResourceCount(json& container, std::string_view resource, int count) {
  json& res = Child(container, "resources", json::object());
  Child(res, "limits", json::object())[std::string(resource)] = std::to_string(count);
  auto req = res.find("requests");
  if (req != res.end() && req->is_object() && req->contains(std::string(resource)))
    (*req)[std::string(resource)] = std::to_string(count);
}

HostPathVolume ResolveVolume(const json& pod, HostPathVolume wanted) {
  const json& spec = pod.at("spec");
  auto vols = spec.find("volumes");
  if (vols == spec.end() || !vols->is_array()) return wanted;
  auto taken = [&](const std::string& name) {
    return std::any_of(vols->begin(), vols->end(), [&](const json& v) { return v.value("name", "") == name; });
  };
  for (const json& v : *vols) {
    auto hp = v.find("hostPath");
    if (hp != v.end() && hp->is_object() && hp->value("path", "") == wanted.path) {
      wanted.name = v.value("name", "");
      return wanted;
    }
  }
  std::string base = wanted.name;
  for (int i = 2; taken(wanted.name); ++i) wanted.name = fmt::format("{}-{}", base, i);
  return wanted;
}

void EnsureVolume(json& pod, const HostPathVolume& volume) {
  json& vols = Child(pod["spec"], "volumes", json::array());
  for (const json& v : vols)
    if (v.value("name", "") == volume.name) return;
  vols.push_back({{"name", volume.name}, {"hostPath", {{"path", volume.path}, {"type", volume.type}}}});
}

MountState CheckMount(const json& container, const json& mount) {
  auto mounts = container.find("volumeMounts");
  if (mounts == container.end() || !mounts->is_array()) return MountState::kFree;
  for (const json& m : *mounts) {
    if (m.value("mountPath", "") != mount["mountPath"].get<std::string>()) continue;
    return m.value("name", "") == mount["name"].get<std::string>() ? MountState::kPresent : MountState::kConflict;
  }
  return MountState::kFree;
}

void EnsureMount(json& container, const json& mount) {
  if (CheckMount(container, mount) == MountState::kFree) Child(container, "volumeMounts", json::array()).push_back(mount);
}

const json* FindEnv(const json& container, std::string_view name) {
  auto env = container.find("env");
  if (env == container.end() || !env->is_array()) return nullptr;
  for (const json& e : *env)
    if (e.value("name", "") == name) return &e;
  return nullptr;
}

void EnsureEnv(json& container, const json& entry) {
  if (FindEnv(container, entry["name"].get<std::string>()) == nullptr)
    Child(container, "env", json::array()).push_back(entry);
}

void SetEnv(json& container, const json& entry) {
  json& env = Child(container, "env", json::array());
  std::string name = entry["name"].get<std::string>();
  bool kept = false;
  json wanted = json::array();
  for (json& e : env) {
    if (e.value("name", "") != name) {
      wanted.push_back(std::move(e));
    } else if (e == entry && !kept) {
      wanted.push_back(std::move(e));
      kept = true;
    }
  }
  if (!kept) wanted.push_back(entry);
  env = std::move(wanted);
}

void AppendPreload(json& container, const std::string& lib) {
  json& env = Child(container, "env", json::array());
  for (json& e : env) {
    if (e.value("name", "") != "LD_PRELOAD") continue;
    std::string value = e.value("value", "");
    size_t pos = 0;
    while (pos <= value.size()) {
      size_t end = value.find_first_of(": ", pos);
      if (end == std::string::npos) end = value.size();
      if (value.compare(pos, end - pos, lib) == 0) return;
      pos = end + 1;
    }
    e["value"] = value.empty() ? lib : value + ":" + lib;
    return;
  }
  env.push_back({{"name", "LD_PRELOAD"}, {"value", lib}});
}

std::vector<json*> AllContainers(json& pod) {
  std::vector<json*> out;
  json& spec = pod["spec"];
  for (const char* list : {"containers", "initContainers"}) {
    auto it = spec.find(list);
    if (it == spec.end() || !it->is_array()) continue;
    for (json& c : *it) out.push_back(&c);
  }
  return out;
}

}  // namespace gpusnap::k8s
