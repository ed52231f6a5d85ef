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
#include <vector>

#include "container/containers.h"
#include "cuda/gpu_map.h"
#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"
#include "store/kube_names.h"  // IsDns1123Label, IsDns1123Subdomain: Kubernetes names
#include "store/snapshot_ref.h"

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
  std::string push_to;          // a registry reference the snapshot is pushed to once captured; empty: none
  // The capture path (docs/CAPTURE-PATHS.md, "The matrix") and what the
  // rootfs capture takes. Unset, each comes from the pod's annotation, else
  // the agent's default (auto; no caches, no exclusions beyond the defaults).
  std::optional<CapturePath> capture_path;  // `capturePath`; unset: the pod's annotation, else auto
  std::optional<std::vector<std::string>> caches;   // container paths of cache directories
  std::optional<std::vector<std::string>> exclude;  // patterns as rootfs::PathMatcher takes them
  std::string image;            // the container's image; empty: its OCI bundle's annotation
};

// How many caches, and how many exclusions, one checkpoint may name.
inline constexpr size_t kMaxRootfsPaths = 16;
// kInvalidArgument naming `where` and the value: more than kMaxRootfsPaths,
// a path twice, a cache that is not an absolute container path under the
// root without `.` and `..` components, a pattern rootfs::PathMatcher
// refuses, or control characters in either.
Status CheckCaches(std::string_view where, const std::vector<std::string>& caches);
Status CheckExclusions(std::string_view where, const std::vector<std::string>& patterns);

// POST /v1/restores. An empty target_container means a fresh namespace.
struct RestoreRequest {
  // `snapshot`: a snapshot id of the store, or a registry reference (it holds
  // a `/`), whose files are pulled and whose chunks arrive as it restores.
  SnapshotRef source;
  std::string target_container; // restore into this container's namespaces (placeholder case)
  cuda::GpuMapSpec gpus;        // `gpuMap`: {"<snapshot GPU index or UUID>": "<this node's>"}
  std::string name;             // the restored workload's name; empty: the source's
  bool standby = false;         // all but the GPU, stopped, for a later wake (docs/STANDBY.md)
};

// POST /v1/workloads/{name}/wake: a standby onto the GPUs chosen now. At
// most one of `gpuMap` and `gpus` is set; the body may be empty.
struct WakeRequest {
  std::string name;             // the standby's workload name (from the path)
  cuda::GpuMapSpec gpus;        // `gpuMap`, or `gpus`: the snapshot's GPUs in order onto these indices
};

// POST /v1/workloads/{name}/suspend and /v1/workloads/{name}/resume: a
// gpushare workload suspended or resumed in place (docs/GPUSHARE.md). The
// body is empty or `{}`.
struct InPlaceRequest {
  std::string name;             // from the path
};

// POST /v1/workloads/swap: {"suspend": NAME, "resume": NAME}, two names.
struct SwapRequest {
  std::string suspend;          // running: suspended first
  std::string resume;           // suspended: resumed after
};

// The bodies the CLI sends for these requests: what the Parse functions below
// read back as the same request (one codec for the agent's client and server).
std::string CheckpointRequestBody(const CheckpointRequest& request);
std::string RestoreRequestBody(const RestoreRequest& request);
std::string WakeRequestBody(const WakeRequest& request);
std::string SwapRequestBody(const SwapRequest& request);

// A request body as it arrives, kept up to `max_bytes` and no further: what
// the HTTP layer feeds while it reads, so that a body past the limit (sized
// or chunked) is refused without being held.
class BodyBuffer {
 public:
  explicit BodyBuffer(size_t max_bytes) : max_bytes_(max_bytes) {}
  // False once the body would pass the limit (then and ever after); what was
  // over it is dropped.
  bool Append(const char* data, size_t size);
  const std::string& text() const { return text_; }
  bool too_large() const { return too_large_; }

 private:
  size_t max_bytes_;
  std::string text_;
  bool too_large_ = false;
};

// 413, naming the limit.
ApiError BodyTooLarge(size_t max_bytes);

// What is refused from a request's line and headers alone, before any of its
// body is read: a method the API has no use for (405), a body on a GET,
// HEAD or DELETE (400), a multipart body (415; bodies are JSON). A body is
// only ever read for a POST, and then within the limit.
std::optional<ApiError> RefusedBeforeTheBody(std::string_view method, std::string_view path,
                                             std::string_view content_type, bool has_body);

// The offset of the first byte of `text` that does not belong to a
// well-formed UTF-8 sequence (RFC 3629: no overlong forms, no surrogates,
// nothing past U+10FFFF); nullopt when all of it is UTF-8.
std::optional<size_t> FirstInvalidUtf8(std::string_view text);

// `text` fit for one line of the agent's log: bytes that are not UTF-8, and
// control characters (a path's %0A), written as \xNN.
std::string Printable(std::string_view text);

// Bodies are JSON objects; these are the only ways they are read. A body
// that is not UTF-8, or has one key twice in an object, is refused (400).
std::variant<CheckpointRequest, ApiError> ParseCheckpointRequest(std::string_view body);
std::variant<RestoreRequest, ApiError> ParseRestoreRequest(std::string_view body);
// `name` is the path's; an empty body asks for no GPU map.
std::variant<WakeRequest, ApiError> ParseWakeRequest(std::string_view name, std::string_view body);
std::variant<InPlaceRequest, ApiError> ParseInPlaceRequest(std::string_view name, std::string_view body);
std::variant<SwapRequest, ApiError> ParseSwapRequest(std::string_view body);

// A job id as the agent makes them: "job-" and 16 lowercase hex digits.
bool IsValidJobId(std::string_view id);

// A container id or a unique prefix of one: 12 to 64 lowercase hex digits.
bool IsValidContainerId(std::string_view id);

// "Bearer <token>" against the expected token, in time that depends only on
// the lengths (never on where the first difference is).
bool BearerMatches(std::string_view authorization_header, std::string_view expected_token);

}  // namespace gpusnap::agent
