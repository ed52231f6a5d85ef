// The agent's requests: JSON bodies and path ids, parsed and validated before
// anything is touched. Pure functions: no I/O, no process is looked at.
//
// Every refusal is an ApiError with the HTTP status to answer and a message
// that names the offending field or value. Unknown fields, wrong types and
// out-of-range values are refused, never ignored: a request the agent does not
// fully understand changes nothing.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "container/containers.h"
#include "gpusnap/status.h"

namespace gpusnap::agent {

// An answer other than success: the HTTP status and a one-line reason.
struct ApiError {
  int http_status = 500;
  std::string message;
};

// The HTTP status that reports a library failure of this code.
int HttpStatusFor(Code code);
ApiError FromStatus(const Status& status);

// A container of a pod, as the kubelet names it.
using container::PodRef;

// POST /v1/checkpoints. Exactly one of pid, container and pod is set.
struct CheckpointRequest {
  pid_t pid = 0;                // a host pid: the root of the tree to take
  std::string container;        // a container id: 12 to 64 lowercase hex digits (a unique prefix)
  std::optional<PodRef> pod;
  bool leave_running = false;
  std::string snapshot_id;      // empty: generated
};

// POST /v1/restores. An empty target_container means a fresh namespace.
struct RestoreRequest {
  std::string snapshot;         // a valid snapshot id
  std::string target_container; // restore into this container's namespaces (placeholder case)
  std::string gpu_map;          // "old=new,..." as RestoreOptions::gpu_map takes it
  std::string name;             // the restored workload's name; empty: the source's
};

// Bodies are JSON objects; these are the only ways they are read.
std::variant<CheckpointRequest, ApiError> ParseCheckpointRequest(std::string_view body);
std::variant<RestoreRequest, ApiError> ParseRestoreRequest(std::string_view body);

// A job id as the agent makes them: "job-" and 16 lowercase hex digits.
bool IsValidJobId(std::string_view id);

// A container id or a unique prefix of one: 12 to 64 lowercase hex digits.
bool IsValidContainerId(std::string_view id);

// "Bearer <token>" against the expected token, in time that depends only on
// the lengths (never on where the first difference is).
bool BearerMatches(std::string_view authorization_header, std::string_view expected_token);

}  // namespace gpusnap::agent
