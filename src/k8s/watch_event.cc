#include "k8s/watch_event.h"

namespace gpusnap::k8s {

using nlohmann::json;

Result<WatchEvent> ParseWatchEvent(std::string_view line) {
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return Status::Error(Code::kInvalidArgument, "watch event is not a JSON object: `{}`", line.substr(0, 200));
  if (!j.contains("type") || !j["type"].is_string() || !j.contains("object") || !j["object"].is_object())
    return Status::Error(Code::kInvalidArgument, "watch event without a type or an object: `{}`",
                         line.substr(0, 200));
  WatchEvent e;
  std::string type = j["type"].get<std::string>();
  if (type == "ADDED") {
    e.type = WatchEventType::kAdded;
  } else if (type == "MODIFIED") {
    e.type = WatchEventType::kModified;
  } else if (type == "DELETED") {
    e.type = WatchEventType::kDeleted;
  } else if (type == "BOOKMARK") {
    e.type = WatchEventType::kBookmark;
  } else if (type == "ERROR") {
    e.type = WatchEventType::kError;
  } else {
    return Status::Error(Code::kInvalidArgument, "watch event of unknown type `{}`", type);
  }
  e.object = std::move(j["object"]);
  if (e.type == WatchEventType::kError) {
    const json& code = e.object.contains("code") ? e.object["code"] : json();
    e.error_code = code.is_number_integer() ? code.get<int>() : 0;
    return e;
  }
  const json& meta = e.object.contains("metadata") ? e.object["metadata"] : json();
  if (!meta.is_object() || !meta.contains("resourceVersion") || !meta["resourceVersion"].is_string())
    return Status::Error(Code::kInvalidArgument, "{} watch event whose object has no metadata.resourceVersion", type);
  e.resource_version = meta["resourceVersion"].get<std::string>();
  return e;
}

std::string StatusMessage(std::string_view body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    std::string reason = j.contains("reason") && j["reason"].is_string() ? j["reason"].get<std::string>() : "";
    std::string message = j["message"].get<std::string>();
    return reason.empty() ? message : reason + ": " + message;
  }
  std::string text(body.substr(0, 300));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace gpusnap::k8s
