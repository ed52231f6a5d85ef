// Where the Kubernetes API server is and how to prove who we are: from a
// kubeconfig file (tests, a node outside the cluster) or from the pod's
// service account (in-cluster), as kubectl and client-go find them.
//
// What is read is enough for the agent: the server URL, the CA that signs the
// server's certificate, and a bearer token. Client certificates, exec and
// auth-provider plugins, proxies and insecure-skip-tls-verify are refused,
// naming the field, rather than ignored.
#pragma once

#include <string>
#include <string_view>

#include "gpusnap/status.h"

namespace gpusnap::k8s {

struct ApiServerConfig {
  std::string server;      // "https://host:port" (a path prefix is kept); "http://" only when no CA is given
  std::string ca_pem;      // PEM certificates that verify the server; empty with ca_file set until loaded
  std::string ca_file;     // where ca_pem comes from, if a file
  std::string token;       // a bearer token, or empty
  std::string token_file;  // or a file holding it, read at each request (service-account tokens rotate)
};

// The cluster and user of a kubeconfig's context (`context`, or
// current-context when empty). `dir` is the kubeconfig's directory, against
// which relative paths (certificate-authority, tokenFile) are resolved. Pure:
// files are named, not read. kInvalidArgument naming the field for a
// kubeconfig that is malformed or names what is not supported (see above).
Result<ApiServerConfig> ParseKubeconfig(std::string_view text, const std::string& dir, std::string_view context = "");

// ParseKubeconfig of the file at `path`, with the CA file read into ca_pem.
// kNotFound / kIoError for files that cannot be read.
Result<ApiServerConfig> LoadKubeconfig(const std::string& path, std::string_view context = "");

// What a pod gets: $KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT
// (`host`, `port`; an IPv6 host is bracketed), the CA and the token in
// `service_account_dir`. Pure.
inline constexpr const char* kServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount";
ApiServerConfig InClusterConfig(std::string_view host, std::string_view port,
                                const std::string& service_account_dir = kServiceAccountDir);

// InClusterConfig from the environment, with the CA read. kFailedPrecondition
// when the variables are not set (not in a pod), kNotFound for a missing file.
Result<ApiServerConfig> LoadInClusterConfig();

// Standard base64 (RFC 4648, padding optional) to bytes, as Kubernetes
// encodes []byte fields such as certificate-authority-data. kInvalidArgument
// for other characters.
Result<std::string> Base64Decode(std::string_view text);

}  // namespace gpusnap::k8s
