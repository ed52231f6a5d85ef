// The cluster administrator's rules for tenants (docs/SECURITY.md): which
// namespace's snapshots a pod may restore, which registry repositories a
// namespace's pods may name, and whose credentials serve their pulls and
// pushes. Tenants are namespaces; what a tenant writes (a pod's
// gpusnap.io/restore-from and gpusnap.io/push-to) goes through these rules,
// what an administrator asks the agent through its API does not.
//
// The configuration is the agent's `--tenancy FILE` (in the cluster a
// ConfigMap), a JSON object:
//
//   {"namespaces": {
//      "team-a": {"repositories": ["registry.example:5000/team-a"],
//                 "agentCredentials": false,
//                 "restoreFrom": ["shared-models"],
//                 "restoreUnowned": false,
//                 "decryptionKeys": ["/etc/gpusnap/keys/team-a.pem"],
//                 "encryptionRecipients": ["/etc/gpusnap/keys/team-a.pub"],
//                 "encryptionSecretFile": "/etc/gpusnap/keys/team-a.secret",
//                 "requireEncryption": true}}}
//
//   repositories      the repository prefixes, `host[:port]/path`, the
//                     namespace's pods may push to and restore from, matched
//                     on a path-component boundary (team-a holds team-a and
//                     team-a/llama, not team-ab); none: no registry
//   agentCredentials  the agent's own credentials may serve those
//                     repositories when the namespace's Secret has none for
//                     their registry; default false
//   restoreFrom       namespaces whose snapshots its pods may restore besides
//                     its own, or "*" for any
//   restoreUnowned    its pods may restore snapshots of no namespace (taken
//                     outside Kubernetes); default false
//   decryptionKeys    PEM private keys (files) that open the encrypted
//                     artifacts its pods restore, besides those of its Secret
//   encryptionRecipients  PEM public keys (files) its pods' pushes are
//                     encrypted for, besides those of its Secret
//   encryptionSecretFile  the tenant secret its blobs' keys derive from (a
//                     file), where its Secret has none
//   requireEncryption its pods' pushes must be encrypted; default false
//
// Key files are named by absolute paths and read at each use by the agent
// (agent/service/namespace_keys.h); this file holds no key.
//
// Every member is optional; a namespace not listed gets every default: its
// own snapshots only, no registry. An unknown member, a member given twice or
// a value of the wrong type is refused, naming it.
//
// Pure; thread-safe.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/snapshot.h"
#include "gpusnap/status.h"
#include "store/registry_reference.h"

namespace gpusnap::tenancy {

// A repository prefix of the configuration.
struct RepositoryPrefix {
  std::string host;  // "registry.example:5000"
  std::string path;  // "team-a/models": whole components
  std::string ToString() const { return host + "/" + path; }
  bool operator==(const RepositoryPrefix&) const = default;
};

// Files of keys for a namespace's encrypted artifacts: absolute paths.
struct KeyFiles {
  std::vector<std::string> decryption_keys;
  std::vector<std::string> encryption_recipients;
  std::string encryption_secret;  // empty: none
  bool operator==(const KeyFiles&) const = default;
};

struct NamespacePolicy {
  std::vector<RepositoryPrefix> repositories;
  bool agent_credentials = false;
  std::set<std::string> restore_from;  // namespaces
  bool restore_from_any = false;       // "*"
  bool restore_unowned = false;
  KeyFiles keys;
  bool require_encryption = false;
};

struct TenancyConfig {
  std::map<std::string, NamespacePolicy> namespaces;
  // The policy of namespace `ns`: its entry, else the defaults.
  const NamespacePolicy& For(std::string_view ns) const;
};

// The configuration `text` holds. kInvalidArgument naming `source` (the
// file) and the member at fault, quoting its value.
Result<TenancyConfig> ParseTenancyConfig(std::string_view text, std::string_view source);

// Whether a pod of `pod_namespace` may restore a snapshot that `owner`
// captured: its own namespace's always, another's only as restoreFrom says,
// one of no namespace only with restoreUnowned. kPermissionDenied naming
// both namespaces (or saying the snapshot has none).
Status MayRestore(const std::optional<SnapshotOwner>& owner, std::string_view pod_namespace,
                  const TenancyConfig& config);

// Whether a pod of `ns` may name `reference` (push-to, restore-from): it is
// under one of the namespace's repositories. kPermissionDenied naming the
// repository and what the namespace may use.
Status RepositoryAllowed(const RegistryReference& reference, std::string_view ns, const TenancyConfig& config);

// Whether a pod of `ns` may push to `reference` in the clear
// (`encrypted` false): not where requireEncryption is set. kPermissionDenied
// naming the namespace, the reference and where keys are given.
Status MayPush(const RegistryReference& reference, bool encrypted, std::string_view ns, const TenancyConfig& config);

// Whose docker config serves a pull or push for a pod.
enum class CredentialsSource {
  kNamespace,  // the namespace's own Secret (which may hold none for the registry: anonymous)
  kAgent,      // the agent's own credentials, as agentCredentials allows
};
// RepositoryAllowed, then: the namespace's Secret (`namespace_config`, a
// docker config.json) where it holds credentials for the reference's
// registry, else the agent's where agentCredentials allows, else the
// namespace's (no credentials: anonymous). Never the agent's otherwise.
// kInvalidArgument for a namespace_config that does not parse (naming
// `config_source`, never its content).
Result<CredentialsSource> CredentialsToUse(const RegistryReference& reference, std::string_view ns,
                                           std::string_view namespace_config, std::string_view config_source,
                                           const TenancyConfig& config);

}  // namespace gpusnap::tenancy
