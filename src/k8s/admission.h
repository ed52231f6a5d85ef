// AdmissionReview (admission.k8s.io/v1) in, AdmissionReview out: the HTTP
// body of the webhook's POST /mutate, without any I/O.
//
// Contract with the API server:
//  - a body that is not an AdmissionReview v1 with a request and a uid
//    (or, for a pod CREATE, without the pod object) is malformed: HTTP 400
//    with a plain-text reason;
//  - anything else is answered 200 with response.uid = request.uid and
//    allowed = true: the webhook never blocks a pod. A request that is not a
//    pod CREATE is allowed unchanged. When the mutation has operations they
//    are sent as patchType "JSONPatch", patch = base64 of the JSON array;
//  - when the mutation fails (a pod of unexpected shape, a bad annotation, a
//    bug), the pod is allowed unchanged and the reason is a warning.
//
// Thread-safety: Admit is pure apart from calling config.snapshot_gpu_count.
#pragma once

#include <string>
#include <string_view>

#include "k8s/mutate.h"

namespace gpusnap::k8s {

struct AdmissionReply {
  int http_status = 200;  // 200 or 400; 500 only when not even an error reply can be built
  std::string content_type = "application/json";  // "text/plain" with 400
  std::string body;
  std::string log_line;  // "uid=... pod=ns/name: what was done (N ops, M warnings)"
};

// Never throws.
AdmissionReply Admit(std::string_view body, const MutateConfig& config) noexcept;

// Standard base64 (RFC 4648, with padding), as Kubernetes encodes []byte.
std::string Base64Encode(std::string_view data);

}  // namespace gpusnap::k8s
