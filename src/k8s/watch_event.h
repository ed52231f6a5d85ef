// One event of a Kubernetes watch stream: the API server writes one JSON
// object per line, {"type": ..., "object": ...}.
//
//  ADDED, MODIFIED, DELETED  the object as it is now (as it was last, for DELETED)
//  BOOKMARK                  only metadata.resourceVersion: where to resume from
//  ERROR                     a Status; code 410 (reason Expired or Gone) means the
//                            resourceVersion is too old: list again
//
// Pure; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpusnap/status.h"

namespace gpusnap::k8s {

enum class WatchEventType { kAdded, kModified, kDeleted, kBookmark, kError };

struct WatchEvent {
  WatchEventType type = WatchEventType::kAdded;
  nlohmann::json object;         // the object, or the Status of an ERROR
  std::string resource_version;  // object.metadata.resourceVersion; empty for ERROR
  int error_code = 0;            // ERROR: the Status's code (410: list again)
};

// kInvalidArgument naming what is wrong for a line that is not a watch
// event (not JSON, an unknown type, an object without metadata).
Result<WatchEvent> ParseWatchEvent(std::string_view line);

// An ERROR that asks the client to list again (HTTP 410: Expired or Gone).
inline bool IsExpired(const WatchEvent& e) { return e.type == WatchEventType::kError && e.error_code == 410; }

// The message of a Kubernetes Status object (or of any JSON body), for
// errors: "<reason>: <message>", or the text itself when it is no Status.
std::string StatusMessage(std::string_view body);

}  // namespace gpusnap::k8s
