// How the agent reaches registries (docs/AGENT.md, "Registries"): a restore
// of a reference pulls, a checkpoint with push-to pushes. The settings are
// the agent's own, given at start; a caller of the API names only the
// reference.
//
// Credentials are a docker config.json: a file on the node, or, on
// Kubernetes, the `.dockerconfigjson` of a Secret of type
// kubernetes.io/dockerconfigjson, read through the API server when the agent
// starts and again before each pull or push (a rotated Secret is taken up),
// and written to a file of mode 0600 in the agent's run directory, which the
// registry client reads. A read that fails after a first good one keeps the
// file as it was, and says so in the log. The credentials themselves are
// never logged nor put in an error.
//
// Those are the administrator's: they serve the API's callers, and a
// namespace only where the tenancy configuration maps them to it
// (tenancy/tenancy.h). A namespace's pods pull and push with the credentials
// of the namespace's own Secret `gpusnap`, which is also how a namespace opts
// in to gpusnap (docs/KUBERNETES.md, "A namespace opts in"): read through the
// API server at each use, its docker config written to
// <run dir>/agent/namespaces/<namespace>.json (mode 0600), which the registry
// client reads.
//
// A pod's gpusnap.io/push-to (k8s/annotations.h) is checked as a registry
// reference (agent/service/pod_annotations.h reads it with the pod's other settings).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "agent/service/namespace_keys.h"
#include "gpusnap/distribution.h"
#include "gpusnap/status.h"
#include "k8s/kube_client.h"

namespace gpusnap::agent {

struct RegistrySettings {
  RegistryAccess access;  // credentials_file, ca_file, plain_http, timeout_s, jobs
  std::string secret;     // NAMESPACE/NAME of a kubernetes.io/dockerconfigjson Secret; excludes credentials_file
};

// Pure. "NAMESPACE/NAME" of a Secret: kInvalidArgument naming the flag when
// either is not a DNS-1123 name.
Result<std::pair<std::string, std::string>> ParseSecretName(std::string_view text);

// Pure. The docker config.json a Secret holds: its type must be
// kubernetes.io/dockerconfigjson and its `.dockerconfigjson` base64 of a JSON
// object. Errors name the Secret (`name`), never its content.
Result<std::string> DockerConfigOfSecret(const nlohmann::json& secret, std::string_view name);

// The Secret a namespace creates to opt in, and whose credentials its pods'
// pulls and pushes use.
inline constexpr std::string_view kNamespaceSecret = "gpusnap";

// Pure. The docker config.json of a namespace's Secret: the
// `.dockerconfigjson` of one of type kubernetes.io/dockerconfigjson, or of an
// Opaque one, which may have none (the namespace opts in without
// credentials: `{"auths":{}}`). Errors name the Secret, never its content.
Result<std::string> NamespaceDockerConfig(const nlohmann::json& secret, std::string_view name);

// A namespace's credentials: its Secret's docker config, the file of mode
// 0600 that holds it for the registry client, and the keys the Secret holds
// (agent/service/namespace_keys.h).
struct NamespaceCredentials {
  std::string docker_config;
  std::string file;
  KeyMaterial keys;
};

// What ServiceOptions::namespace_credentials asks for: Secret
// <namespace>/gpusnap read through `kube` at each call, its keys parsed
// (KeysOfSecret), its docker config written to
// <run_dir>/namespaces/<namespace>.json (the directories made with mode
// 0700). kPermissionDenied when the namespace has none: it has not opted in.
// Thread-safe.
std::function<Result<NamespaceCredentials>(const std::string&)> MakeNamespaceCredentials(
    std::shared_ptr<const k8s::KubeClient> kube, const std::string& run_dir);

// Pure. A pod's gpusnap.io/push-to annotation: empty when it has none; a
// value that is not a registry reference is kInvalidArgument, quoting it.
Result<std::string> PushToOfPod(const nlohmann::json& pod);

// What ServiceOptions::registry asks for, from `settings`. With a Secret it
// needs `kube` (else kInvalidArgument) and reads the Secret once now, writing
// <run_dir>/registry-auth.json (the directory made with mode 0700): an error
// then refuses the agent's start. Thread-safe: the function may be called
// from several jobs at once.
Result<std::function<Result<RegistryAccess>()>> MakeRegistryAccess(
    const RegistrySettings& settings, std::shared_ptr<const k8s::KubeClient> kube, const std::string& run_dir,
    std::function<void(const std::string&)> log);

}  // namespace gpusnap::agent
