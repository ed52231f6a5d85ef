#include "agent/api/request.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <limits>
#include <set>
#include <utility>
#include <vector>

#include "gpusnap/snapshot.h"
#include "gpusnap/workload.h"
#include "rootfs/exclusions.h"
#include "snapshot/capture_path.h"
#include "store/registry_reference.h"

namespace gpusnap::agent {

namespace {

using Json = nlohmann::json;

ApiError Bad(std::string message) { return ApiError{400, std::move(message)}; }

// Where the parser is, as a dotted path of keys: one entry per open object
// or array, holding the key that opened it (empty at the top and in arrays).
// The first key met twice in one object is kept.
class DuplicateKeys {
 public:
  bool Event(Json::parse_event_t event, const Json& parsed) {
    using E = Json::parse_event_t;
    switch (event) {
      case E::object_start:
      case E::array_start:
        frames_.push_back({std::exchange(pending_key_, ""), {}});
        break;
      case E::object_end:
      case E::array_end:
        if (!frames_.empty()) frames_.pop_back();
        break;
      case E::key: {
        std::string key = parsed.get<std::string>();
        if (!frames_.empty() && !frames_.back().keys.insert(key).second && first_.empty()) first_ = Path(key);
        pending_key_ = std::move(key);
        break;
      }
      case E::value:
        pending_key_.clear();
        break;
    }
    return true;  // keep everything: the refusal comes after the parse
  }
  const std::string& first() const { return first_; }

 private:
  struct Frame {
    std::string key;  // the key this object or array is the value of
    std::set<std::string> keys;
  };
  std::string Path(const std::string& key) const {
    std::string out;
    for (const auto& f : frames_)
      if (!f.key.empty()) out += f.key + ".";
    return out + key;
  }
  std::vector<Frame> frames_;
  std::string pending_key_;
  std::string first_;
};

// Parses a body that must be one JSON object.
std::variant<Json, ApiError> ParseObject(std::string_view body) {
  if (body.empty()) return Bad("empty body: expected a JSON object");
  // Checked first: the parser's own message would quote the bad bytes.
  if (auto at = FirstInvalidUtf8(body))
    return Bad(fmt::format("the body is not valid UTF-8 (byte {:#04x} at offset {})",
                           static_cast<unsigned char>(body[*at]), *at));
  DuplicateKeys duplicates;
  Json doc;
  try {
    doc = Json::parse(body.begin(), body.end(), [&duplicates](int, Json::parse_event_t event, Json& parsed) {
      return duplicates.Event(event, parsed);
    });
  } catch (const Json::exception& e) {
    return Bad(std::string("malformed JSON: ") + e.what());
  }
  if (!duplicates.first().empty()) return Bad(fmt::format("duplicate key `{}` in the body", duplicates.first()));
  if (!doc.is_object()) return Bad(std::string("expected a JSON object, got ") + doc.type_name());
  return doc;
}

std::optional<ApiError> OnlyKnownFields(const Json& obj, std::initializer_list<std::string_view> known,
                                        std::string_view where) {
  for (const auto& [key, value] : obj.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end())
      return Bad(fmt::format("unknown field `{}{}`", where, key));
  }
  return std::nullopt;
}

std::optional<ApiError> GetString(const Json& obj, const char* key, std::string_view where, std::string& out) {
  auto it = obj.find(key);
  if (it == obj.end()) return std::nullopt;
  if (!it->is_string()) return Bad(fmt::format("field `{}{}` must be a string, got {}", where, key, it->type_name()));
  out = it->get<std::string>();
  return std::nullopt;
}

std::variant<PodRef, ApiError> ParsePod(const Json& pod) {
  if (!pod.is_object()) return Bad(fmt::format("field `pod` must be an object, got {}", pod.type_name()));
  if (auto e = OnlyKnownFields(pod, {"namespace", "name", "container"}, "pod.")) return *e;
  PodRef ref;
  if (auto e = GetString(pod, "namespace", "pod.", ref.namespace_name)) return *e;
  if (auto e = GetString(pod, "name", "pod.", ref.name)) return *e;
  if (auto e = GetString(pod, "container", "pod.", ref.container)) return *e;
  if (!IsDns1123Label(ref.namespace_name))
    return Bad(fmt::format("`pod.namespace` `{}` is not a Kubernetes namespace name", ref.namespace_name));
  if (!IsDns1123Subdomain(ref.name)) return Bad(fmt::format("`pod.name` `{}` is not a Kubernetes pod name", ref.name));
  if (!IsDns1123Label(ref.container))
    return Bad(fmt::format("`pod.container` `{}` is not a Kubernetes container name", ref.container));
  return ref;
}

// The GPU map as an object {"<snapshot GPU index or UUID>": "<this node's>"}.
// Each side a token of its own (no `,` or `=` to make two entries of one),
// then the map's one grammar (cuda/gpu_map.h).
std::variant<cuda::GpuMapSpec, ApiError> ParseGpuMap(const Json& map) {
  if (!map.is_object()) return Bad(fmt::format("field `gpuMap` must be an object, got {}", map.type_name()));
  auto ok_token = [](const std::string& s) {
    auto allowed = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-'; };
    return !s.empty() && s.size() <= 64 && std::all_of(s.begin(), s.end(), allowed);
  };
  std::string text;
  for (const auto& [from, to] : map.items()) {
    if (!to.is_string()) return Bad(fmt::format("`gpuMap.{}` must be a string, got {}", from, to.type_name()));
    std::string target = to.get<std::string>();
    if (!ok_token(from)) return Bad(fmt::format("`gpuMap` key `{}` is not a GPU index or UUID", from));
    if (!ok_token(target)) return Bad(fmt::format("`gpuMap.{}` value `{}` is not a GPU index or UUID", from, target));
    text += (text.empty() ? "" : ",") + from + "=" + target;
  }
  if (text.empty()) return cuda::GpuMapSpec{};
  auto spec = cuda::MakeGpuMapSpec(text, {});
  if (!spec.ok()) return Bad("`gpuMap`: " + spec.status().message());
  return *spec;
}

// `gpuMap` or `gpus` (the snapshot's GPUs in order onto these indices), at most one.
std::variant<cuda::GpuMapSpec, ApiError> ParseGpuChoice(const Json& doc) {
  if (doc.contains("gpuMap") && doc.contains("gpus")) return Bad("give at most one of `gpuMap` and `gpus`");
  if (auto it = doc.find("gpuMap"); it != doc.end()) return ParseGpuMap(*it);
  auto it = doc.find("gpus");
  if (it == doc.end()) return cuda::GpuMapSpec{};
  if (!it->is_array()) return Bad(fmt::format("field `gpus` must be an array of GPU indices, got {}", it->type_name()));
  std::vector<int> indices;
  for (const auto& g : *it) {
    if (!g.is_number_integer() || g.get<int64_t>() < 0 || g.get<int64_t>() > 1023)
      return Bad(fmt::format("`gpus` holds {}, not a GPU index", g.dump()));
    indices.push_back(static_cast<int>(g.get<int64_t>()));
  }
  auto spec = cuda::MakeGpuMapSpec("", std::move(indices));
  if (!spec.ok()) return Bad("`gpus`: " + spec.status().message());
  return *spec;
}

// The body's form of a GpuMapSpec, as ParseGpuChoice reads it.
void PutGpuChoice(const cuda::GpuMapSpec& spec, Json& body) {
  if (!spec.entries.empty()) {
    Json map = Json::object();
    for (const auto& e : spec.entries) map[e.from.text] = e.to.text;
    body["gpuMap"] = map;
  }
  if (!spec.gpus.empty()) body["gpus"] = spec.gpus;
}


// A registry reference in field `field`: 400 quoting the parser's reason.
std::optional<ApiError> CheckReference(std::string_view field, const std::string& text) {
  auto ref = ParseRegistryReference(text);
  if (!ref.ok()) return Bad(fmt::format("`{}`: {}", field, ref.status().message()));
  return std::nullopt;
}

// An array of strings in field `key`; nullopt when absent.
std::variant<std::optional<std::vector<std::string>>, ApiError> GetStrings(const Json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) return std::nullopt;
  if (!it->is_array())
    return Bad(fmt::format("field `{}` must be an array of strings, got {}", key, it->type_name()));
  std::vector<std::string> out;
  for (const auto& v : *it) {
    if (!v.is_string()) return Bad(fmt::format("`{}` holds {}, not a string", key, v.dump()));
    out.push_back(v.get<std::string>());
  }
  return out;
}

std::optional<ApiError> BadOf(const Status& st) {
  if (st.ok()) return std::nullopt;
  return Bad(st.message());
}

// The checks both lists share: how many, control characters, a path twice.
Status CheckList(std::string_view where, const std::vector<std::string>& items, std::string_view what) {
  if (items.size() > kMaxRootfsPaths)
    return Status::Error(Code::kInvalidArgument, "{}: {} {}, at most {} are taken", where, items.size(), what,
                         kMaxRootfsPaths);
  std::set<std::string_view> seen;
  for (const auto& item : items) {
    if (item.size() > 4096) return Status::Error(Code::kInvalidArgument, "{}: a path over 4096 bytes", where);
    auto control = [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; };
    if (std::any_of(item.begin(), item.end(), control))
      return Status::Error(Code::kInvalidArgument, "{}: `{}` holds a control character", where, Printable(item));
    if (!seen.insert(item).second)
      return Status::Error(Code::kInvalidArgument, "{}: `{}` is given twice", where, item);
  }
  return Status::Ok();
}

bool IsHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

}  // namespace

Status CheckCaches(std::string_view where, const std::vector<std::string>& caches) {
  GPUSNAP_RETURN_IF_ERROR(CheckList(where, caches, "caches"));
  for (const auto& path : caches) {
    auto refuse = [&](std::string_view why) {
      return Status::Error(Code::kInvalidArgument, "{}: `{}` {}", where, path, why);
    };
    if (path.empty() || path[0] != '/') return refuse("is not an absolute container path");
    bool below_root = false;
    size_t start = 0;
    while (start < path.size()) {
      size_t slash = path.find('/', start);
      std::string_view part = std::string_view(path).substr(start, slash == std::string::npos ? slash : slash - start);
      if (part == "." || part == "..") return refuse("holds a `.` or `..` component");
      if (!part.empty()) below_root = true;
      if (slash == std::string::npos) break;
      start = slash + 1;
    }
    if (!below_root) return refuse("is the root: a cache is a directory under it");
  }
  return Status::Ok();
}

Status CheckExclusions(std::string_view where, const std::vector<std::string>& patterns) {
  GPUSNAP_RETURN_IF_ERROR(CheckList(where, patterns, "patterns"));
  // The capture's own rule, so that what is taken here is taken there.
  if (auto matcher = rootfs::PathMatcher::Make(patterns); !matcher.ok())
    return Status::Error(Code::kInvalidArgument, "{}: {}", where, matcher.status().message());
  return Status::Ok();
}

bool BodyBuffer::Append(const char* data, size_t size) {
  if (too_large_ || size > max_bytes_ - text_.size()) {
    too_large_ = true;
    return false;
  }
  text_.append(data, size);
  return true;
}

ApiError BodyTooLarge(size_t max_bytes) {
  return ApiError{413, fmt::format("request body too large (over {} bytes, --max-body-bytes)", max_bytes)};
}

std::optional<ApiError> RefusedBeforeTheBody(std::string_view method, std::string_view path,
                                             std::string_view content_type, bool has_body) {
  if (method != "GET" && method != "HEAD" && method != "POST" && method != "DELETE")
    return ApiError{405, fmt::format("method {} is not served: the API takes GET, POST and DELETE", method)};
  if (method != "POST" && has_body) return Bad(fmt::format("{} {} takes no body", method, path));
  if (content_type.substr(0, 10) == "multipart/")
    return ApiError{415, fmt::format("Content-Type `{}`: bodies are JSON", content_type)};
  return std::nullopt;
}

std::optional<size_t> FirstInvalidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    unsigned char lead = byte(i);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    // The sequence's length and the range its second byte may take (RFC
    // 3629 §4): the narrow ranges are what exclude overlong forms, the
    // surrogates and code points past U+10FFFF.
    size_t length = 0;
    unsigned char low = 0x80, high = 0xbf;
    if (lead >= 0xc2 && lead <= 0xdf) {
      length = 2;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3;
      if (lead == 0xe0) low = 0xa0;
      if (lead == 0xed) high = 0x9f;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4;
      if (lead == 0xf0) low = 0x90;
      if (lead == 0xf4) high = 0x8f;
    } else {
      return i;
    }
    if (text.size() - i < length) return i;
    if (byte(i + 1) < low || byte(i + 1) > high) return i;
    for (size_t k = 2; k < length; ++k)
      if (byte(i + k) < 0x80 || byte(i + k) > 0xbf) return i;
    i += length;
  }
  return std::nullopt;
}

std::string Printable(std::string_view text) {
  std::string out;
  while (!text.empty()) {
    size_t valid = FirstInvalidUtf8(text).value_or(text.size());
    for (char c : text.substr(0, valid)) {
      auto byte = static_cast<unsigned char>(c);
      if (byte < 0x20 || byte == 0x7f)
        out += fmt::format("\\x{:02x}", byte);
      else
        out += c;
    }
    if (valid == text.size()) break;
    out += fmt::format("\\x{:02x}", static_cast<unsigned char>(text[valid]));
    text.remove_prefix(valid + 1);
  }
  return out;
}

int HttpStatusFor(Code code) {
  switch (code) {
    case Code::kOk: return 200;
    case Code::kInvalidArgument: return 400;
    case Code::kPermissionDenied: return 403;
    case Code::kNotFound: return 404;
    case Code::kAlreadyExists: return 409;
    case Code::kFailedPrecondition: return 409;
    case Code::kCorruption: return 422;
    case Code::kNotSupported: return 501;
    case Code::kTimeout: return 504;
    case Code::kIoError:
    case Code::kExternal:
    case Code::kInternal: return 500;
  }
  return 500;
}

ApiError FromStatus(const Status& status) { return ApiError{HttpStatusFor(status.code()), status.message()}; }

std::variant<CheckpointRequest, ApiError> ParseCheckpointRequest(std::string_view body) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& doc = std::get<Json>(parsed);
  if (auto e = OnlyKnownFields(doc,
                               {"pid", "container", "pod", "leaveRunning", "snapshotId", "pushTo", "capturePath",
                                "caches", "exclude", "image"},
                               ""))
    return *e;

  CheckpointRequest req;
  int targets = 0;
  if (auto it = doc.find("pid"); it != doc.end()) {
    ++targets;
    if (!it->is_number_integer()) return Bad(fmt::format("field `pid` must be an integer, got {}", it->type_name()));
    // Linux pids are at most 2^22 (pid_max's ceiling).
    auto in_range = [](auto v) { return v >= 1 && v <= (1 << 22); };
    bool ok = it->is_number_unsigned() ? in_range(it->get<uint64_t>()) : in_range(it->get<int64_t>());
    if (!ok) return Bad(fmt::format("field `pid` {} is not a pid", it->dump()));
    req.pid = static_cast<pid_t>(it->get<int64_t>());
  }
  if (doc.contains("container")) {
    ++targets;
    if (auto e = GetString(doc, "container", "", req.container)) return *e;
    if (!IsValidContainerId(req.container))
      return Bad(fmt::format("`container` `{}` is not a container id (12 to 64 lowercase hex digits)", req.container));
  }
  if (auto it = doc.find("pod"); it != doc.end()) {
    ++targets;
    auto pod = ParsePod(*it);
    if (auto* e = std::get_if<ApiError>(&pod)) return *e;
    req.pod = std::get<PodRef>(pod);
  }
  if (targets != 1) return Bad("give exactly one of `pid`, `container` and `pod`");
  if (auto it = doc.find("leaveRunning"); it != doc.end()) {
    if (!it->is_boolean())
      return Bad(fmt::format("field `leaveRunning` must be a boolean, got {}", it->type_name()));
    req.leave_running = it->get<bool>();
  }
  if (auto e = GetString(doc, "snapshotId", "", req.snapshot_id)) return *e;
  if (doc.contains("snapshotId") && !IsValidSnapshotId(req.snapshot_id))
    return Bad(fmt::format("`snapshotId` `{}` is not a snapshot id ([A-Za-z0-9._-], 1-64, no leading '.')",
                           req.snapshot_id));
  if (auto e = GetString(doc, "pushTo", "", req.push_to)) return *e;
  if (doc.contains("pushTo"))
    if (auto e = CheckReference("pushTo", req.push_to)) return *e;
  std::string capture_path;
  if (auto e = GetString(doc, "capturePath", "", capture_path)) return *e;
  if (doc.contains("capturePath")) {
    req.capture_path = ParseCapturePath(capture_path);
    if (!req.capture_path)
      return Bad(fmt::format("`capturePath` `{}` is not a capture path: expected auto, process, rootfs or both",
                             Printable(capture_path)));
  }
  for (auto [key, list] : {std::pair{"caches", &req.caches}, std::pair{"exclude", &req.exclude}}) {
    auto got = GetStrings(doc, key);
    if (auto* e = std::get_if<ApiError>(&got)) return *e;
    *list = std::get<0>(std::move(got));
  }
  if (req.caches)
    if (auto e = BadOf(CheckCaches("`caches`", *req.caches))) return *e;
  if (req.exclude)
    if (auto e = BadOf(CheckExclusions("`exclude`", *req.exclude))) return *e;
  if (auto e = GetString(doc, "image", "", req.image)) return *e;
  if (doc.contains("image")) {
    auto space = [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; };
    if (req.image.empty() || req.image.size() > 1024 || std::any_of(req.image.begin(), req.image.end(), space))
      return Bad(fmt::format("`image` `{}` is not an image reference (1-1024 characters, no spaces)",
                             Printable(req.image)));
  }
  // The rootfs capture's settings with a capture that takes no rootfs say
  // two things at once.
  auto some = [](const std::optional<std::vector<std::string>>& list) { return list && !list->empty(); };
  if (req.capture_path == CapturePath::kProcess && (some(req.caches) || some(req.exclude) || !req.image.empty()))
    return Bad("`caches`, `exclude` and `image` are for the rootfs capture: `capturePath` `process` takes none");
  return req;
}

std::variant<RestoreRequest, ApiError> ParseRestoreRequest(std::string_view body) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& doc = std::get<Json>(parsed);
  if (auto e = OnlyKnownFields(doc, {"snapshot", "target", "gpuMap", "gpus", "name", "standby"}, "")) return *e;

  RestoreRequest req;
  if (!doc.contains("snapshot")) return Bad("missing field `snapshot`");
  std::string snapshot;
  if (auto e = GetString(doc, "snapshot", "", snapshot)) return *e;
  auto source = ParseSnapshotRef(snapshot);
  if (!source.ok()) return Bad("`snapshot`: " + source.status().message());
  req.source = std::move(source).value();
  if (auto it = doc.find("target"); it != doc.end()) {
    if (it->is_string()) {
      if (it->get<std::string>() != "new")
        return Bad(fmt::format("`target` `{}`: expected \"new\" or {{\"container\": ID}}", it->get<std::string>()));
    } else if (it->is_object()) {
      if (auto e = OnlyKnownFields(*it, {"container"}, "target.")) return *e;
      if (!it->contains("container")) return Bad("missing field `target.container`");
      if (auto e = GetString(*it, "container", "target.", req.target_container)) return *e;
      if (!IsValidContainerId(req.target_container))
        return Bad(fmt::format("`target.container` `{}` is not a container id", req.target_container));
    } else {
      return Bad(fmt::format("field `target` must be \"new\" or an object, got {}", it->type_name()));
    }
  }
  auto gpus = ParseGpuChoice(doc);
  if (auto* e = std::get_if<ApiError>(&gpus)) return *e;
  req.gpus = std::get<cuda::GpuMapSpec>(gpus);
  if (auto e = GetString(doc, "name", "", req.name)) return *e;
  if (doc.contains("name"))
    if (Status st = CheckWorkloadName(req.name); !st.ok()) return Bad("`name`: " + st.message());
  if (auto it = doc.find("standby"); it != doc.end()) {
    if (!it->is_boolean()) return Bad(fmt::format("field `standby` must be a boolean, got {}", it->type_name()));
    req.standby = it->get<bool>();
  }
  if (req.standby && !req.target_container.empty())
    return Bad("`standby` restores into a fresh namespace only: give no `target.container` with it");
  if (req.standby && !req.gpus.empty())
    return Bad("a standby's GPUs are chosen when it is woken: give `gpuMap` or `gpus` to the wake, not with `standby`");
  return req;
}

std::variant<WakeRequest, ApiError> ParseWakeRequest(std::string_view name, std::string_view body) {
  WakeRequest req;
  if (Status st = CheckWorkloadName(Printable(name)); !st.ok()) return Bad(st.message());
  req.name = std::string(name);
  if (body.empty()) return req;
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& doc = std::get<Json>(parsed);
  if (auto e = OnlyKnownFields(doc, {"gpuMap", "gpus"}, "")) return *e;
  auto gpus = ParseGpuChoice(doc);
  if (auto* e = std::get_if<ApiError>(&gpus)) return *e;
  req.gpus = std::get<cuda::GpuMapSpec>(gpus);
  return req;
}

std::variant<InPlaceRequest, ApiError> ParseInPlaceRequest(std::string_view name, std::string_view body) {
  if (Status st = CheckWorkloadName(Printable(name)); !st.ok()) return Bad(st.message());
  if (!body.empty()) {
    auto parsed = ParseObject(body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
    if (auto e = OnlyKnownFields(std::get<Json>(parsed), {}, "")) return *e;
  }
  return InPlaceRequest{std::string(name)};
}

std::variant<SwapRequest, ApiError> ParseSwapRequest(std::string_view body) {
  auto parsed = ParseObject(body);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const Json& doc = std::get<Json>(parsed);
  if (auto e = OnlyKnownFields(doc, {"suspend", "resume"}, "")) return *e;
  SwapRequest req;
  for (auto [key, out] : {std::pair{"suspend", &req.suspend}, std::pair{"resume", &req.resume}}) {
    if (!doc.contains(key)) return Bad(fmt::format("`{}` is required: the workload to {}", key, key));
    if (auto e = GetString(doc, key, "", *out)) return *e;
    if (Status st = CheckWorkloadName(*out); !st.ok()) return Bad(fmt::format("`{}`: {}", key, st.message()));
  }
  if (req.suspend == req.resume)
    return Bad(fmt::format("`suspend` and `resume` name the same workload `{}`: a swap takes two", req.suspend));
  return req;
}

std::string CheckpointRequestBody(const CheckpointRequest& request) {
  Json body = {{"leaveRunning", request.leave_running}};
  if (request.pod)
    body["pod"] = {{"namespace", request.pod->namespace_name}, {"name", request.pod->name},
                   {"container", request.pod->container}};
  else if (!request.container.empty())
    body["container"] = request.container;
  else
    body["pid"] = request.pid;
  if (!request.snapshot_id.empty()) body["snapshotId"] = request.snapshot_id;
  if (!request.push_to.empty()) body["pushTo"] = request.push_to;
  if (request.capture_path) body["capturePath"] = CapturePathName(*request.capture_path);
  if (request.caches) body["caches"] = *request.caches;
  if (request.exclude) body["exclude"] = *request.exclude;
  if (!request.image.empty()) body["image"] = request.image;
  return body.dump();
}

std::string RestoreRequestBody(const RestoreRequest& request) {
  Json body = {{"snapshot", request.source.ToString()}};
  if (!request.name.empty()) body["name"] = request.name;
  if (!request.target_container.empty()) body["target"] = {{"container", request.target_container}};
  if (request.standby) body["standby"] = true;
  PutGpuChoice(request.gpus, body);
  return body.dump();
}

std::string WakeRequestBody(const WakeRequest& request) {
  Json body = Json::object();
  PutGpuChoice(request.gpus, body);
  return body.dump();
}

std::string SwapRequestBody(const SwapRequest& request) {
  return Json{{"suspend", request.suspend}, {"resume", request.resume}}.dump();
}

bool IsValidJobId(std::string_view id) {
  return id.size() == 20 && id.substr(0, 4) == "job-" && IsHex(id.substr(4));
}

bool IsValidContainerId(std::string_view id) { return id.size() >= 12 && id.size() <= 64 && IsHex(id); }

bool BearerMatches(std::string_view header, std::string_view expected) {
  constexpr std::string_view kScheme = "Bearer ";
  if (expected.empty() || header.size() < kScheme.size() || header.substr(0, kScheme.size()) != kScheme) return false;
  std::string_view given = header.substr(kScheme.size());
  // Every byte of the expected token is looked at whatever `given` holds.
  unsigned diff = given.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= g ^ static_cast<unsigned char>(expected[i]);
  }
  return diff == 0;
}

}  // namespace gpusnap::agent
