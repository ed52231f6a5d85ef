#include "tenancy/tenancy.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "registry/auth.h"
#include "store/kube_names.h"

namespace gpusnap::tenancy {

namespace {

using nlohmann::json;

constexpr const char* kNamespaces = "namespaces";
constexpr const char* kRepositories = "repositories";
constexpr const char* kAgentCredentials = "agentCredentials";
constexpr const char* kRestoreFrom = "restoreFrom";
constexpr const char* kRestoreUnowned = "restoreUnowned";
constexpr const char* kDecryptionKeys = "decryptionKeys";
constexpr const char* kEncryptionRecipients = "encryptionRecipients";
constexpr const char* kEncryptionSecretFile = "encryptionSecretFile";
constexpr const char* kRequireEncryption = "requireEncryption";
constexpr const char* kAnyNamespace = "*";

std::string Quote(const json& v) {
  std::string s = v.dump();
  return s.size() > 80 ? s.substr(0, 77) + "..." : s;
}

// Errors of one configuration text, each naming the member by its path.
class Reader {
 public:
  explicit Reader(std::string_view source) : source_(source) {}

  template <typename... Args>
  Status Bad(std::string_view where, fmt::format_string<Args...> f, Args&&... args) const {
    return Status::Error(Code::kInvalidArgument, "tenancy configuration `{}`: `{}` {}", source_, where,
                         fmt::format(f, std::forward<Args>(args)...));
  }

  Result<bool> Bool(const json& v, std::string_view where) const {
    if (!v.is_boolean()) return Bad(where, "is {}, not true or false", Quote(v));
    return v.get<bool>();
  }

  Result<std::vector<std::string>> Strings(const json& v, std::string_view where) const {
    if (!v.is_array()) return Bad(where, "is {}, not an array of strings", Quote(v));
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string()) return Bad(fmt::format("{}[{}]", where, i), "is {}, not a string", Quote(v[i]));
      out.push_back(v[i].get<std::string>());
    }
    return out;
  }

  Result<std::string> Path(const json& v, std::string_view where) const {
    if (!v.is_string() || !v.get<std::string>().starts_with("/"))
      return Bad(where, "is {}, not an absolute path", Quote(v));
    return v.get<std::string>();
  }

  Result<std::vector<std::string>> Paths(const json& v, std::string_view where) const {
    if (!v.is_array()) return Bad(where, "is {}, not an array of absolute paths", Quote(v));
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i) {
      GPUSNAP_ASSIGN_OR_RETURN(std::string path, Path(v[i], fmt::format("{}[{}]", where, i)));
      out.push_back(std::move(path));
    }
    return out;
  }

  Result<RepositoryPrefix> Prefix(const std::string& text, std::string_view where) const {
    // The references' own grammar; a prefix names no tag or digest.
    auto parsed = ParseRegistryReference(text);
    RepositoryPrefix prefix;
    if (parsed.ok()) prefix = {parsed->host, parsed->repository};
    if (!parsed.ok() || prefix.ToString() != text)
      return Bad(where, "is \"{}\", not a repository prefix host[:port]/path (without a tag or digest)", text);
    return prefix;
  }

  Result<NamespacePolicy> Policy(const json& v, const std::string& where) const {
    if (!v.is_object()) return Bad(where, "is {}, not an object", Quote(v));
    NamespacePolicy policy;
    for (const auto& [key, value] : v.items()) {
      std::string at = where + "." + key;
      if (key == kRepositories) {
        GPUSNAP_ASSIGN_OR_RETURN(auto texts, Strings(value, at));
        for (size_t i = 0; i < texts.size(); ++i) {
          GPUSNAP_ASSIGN_OR_RETURN(auto prefix, Prefix(texts[i], fmt::format("{}[{}]", at, i)));
          policy.repositories.push_back(std::move(prefix));
        }
      } else if (key == kAgentCredentials) {
        GPUSNAP_ASSIGN_OR_RETURN(policy.agent_credentials, Bool(value, at));
      } else if (key == kRestoreFrom) {
        GPUSNAP_ASSIGN_OR_RETURN(auto names, Strings(value, at));
        for (size_t i = 0; i < names.size(); ++i) {
          if (names[i] == kAnyNamespace) {
            policy.restore_from_any = true;
          } else if (IsDns1123Label(names[i])) {
            policy.restore_from.insert(names[i]);
          } else {
            return Bad(fmt::format("{}[{}]", at, i), "is \"{}\", not a namespace name or \"*\"", names[i]);
          }
        }
      } else if (key == kRestoreUnowned) {
        GPUSNAP_ASSIGN_OR_RETURN(policy.restore_unowned, Bool(value, at));
      } else if (key == kDecryptionKeys) {
        GPUSNAP_ASSIGN_OR_RETURN(policy.keys.decryption_keys, Paths(value, at));
      } else if (key == kEncryptionRecipients) {
        GPUSNAP_ASSIGN_OR_RETURN(policy.keys.encryption_recipients, Paths(value, at));
      } else if (key == kEncryptionSecretFile) {
        GPUSNAP_ASSIGN_OR_RETURN(policy.keys.encryption_secret, Path(value, at));
      } else if (key == kRequireEncryption) {
        GPUSNAP_ASSIGN_OR_RETURN(policy.require_encryption, Bool(value, at));
      } else {
        return Bad(at, "is not a member this gpusnap knows ({})",
                   fmt::join(std::vector<std::string_view>{kRepositories, kAgentCredentials, kRestoreFrom,
                                                           kRestoreUnowned, kDecryptionKeys, kEncryptionRecipients,
                                                           kEncryptionSecretFile, kRequireEncryption},
                             ", "));
      }
    }
    return policy;
  }

 private:
  std::string_view source_;
};

// The first key given twice in one object: a plain parse would keep the last
// and hide the other.
class RepeatedKey {
 public:
  bool Event(json::parse_event_t event, const json& parsed) {
    if (event == json::parse_event_t::object_start) open_.emplace_back();
    if (event == json::parse_event_t::object_end && !open_.empty()) open_.pop_back();
    if (event == json::parse_event_t::key && !open_.empty() && !open_.back().insert(parsed.get<std::string>()).second &&
        first_.empty())
      first_ = parsed.get<std::string>();
    return true;
  }
  const std::string& first() const { return first_; }

 private:
  std::vector<std::set<std::string>> open_;
  std::string first_;
};

bool Under(const RegistryReference& reference, const RepositoryPrefix& prefix) {
  if (reference.host != prefix.host) return false;
  const std::string& repo = reference.repository;
  return repo == prefix.path || (repo.size() > prefix.path.size() && repo.starts_with(prefix.path) &&
                                 repo[prefix.path.size()] == '/');
}

}  // namespace

const NamespacePolicy& TenancyConfig::For(std::string_view ns) const {
  static const NamespacePolicy kDefaults;
  auto it = namespaces.find(std::string(ns));
  return it == namespaces.end() ? kDefaults : it->second;
}

Result<TenancyConfig> ParseTenancyConfig(std::string_view text, std::string_view source) {
  Reader r(source);
  RepeatedKey repeated;
  json j;
  try {
    j = json::parse(text, [&repeated](int, json::parse_event_t event, json& parsed) {
      return repeated.Event(event, parsed);
    });
  } catch (const json::parse_error& e) {
    std::string why = e.what();
    if (auto pos = why.find("] "); pos != std::string::npos) why = why.substr(pos + 2);
    return Status::Error(Code::kInvalidArgument, "tenancy configuration `{}`: a JSON syntax error at byte {}: {}",
                         source, e.byte, why);
  }
  if (!repeated.first().empty())
    return Status::Error(Code::kInvalidArgument, "tenancy configuration `{}`: member `{}` is given twice", source,
                         repeated.first());
  if (!j.is_object())
    return Status::Error(Code::kInvalidArgument, "tenancy configuration `{}` is {}, not a JSON object", source,
                         j.type_name());
  TenancyConfig config;
  for (const auto& [key, value] : j.items()) {
    if (key != kNamespaces) return r.Bad(key, "is not a member this gpusnap knows ({})", kNamespaces);
    if (!value.is_object()) return r.Bad(key, "is {}, not an object of namespaces", Quote(value));
    for (const auto& [ns, policy] : value.items()) {
      std::string where = fmt::format("{}.{}", kNamespaces, ns);
      if (!IsDns1123Label(ns)) return r.Bad(where, "names no namespace: `{}` is not a namespace name", ns);
      GPUSNAP_ASSIGN_OR_RETURN(config.namespaces[ns], r.Policy(policy, where));
    }
  }
  return config;
}

Status MayRestore(const std::optional<SnapshotOwner>& owner, std::string_view pod_namespace,
                  const TenancyConfig& config) {
  const NamespacePolicy& policy = config.For(pod_namespace);
  if (!owner) {
    if (policy.restore_unowned) return Status::Ok();
    return Status::Error(Code::kPermissionDenied,
                         "the snapshot belongs to no namespace (it was taken outside Kubernetes), and the "
                         "administrator's tenancy configuration does not let namespace `{}` restore such snapshots "
                         "({})",
                         pod_namespace, kRestoreUnowned);
  }
  if (owner->namespace_name == pod_namespace || policy.restore_from_any ||
      policy.restore_from.count(owner->namespace_name) > 0)
    return Status::Ok();
  return Status::Error(Code::kPermissionDenied,
                       "the snapshot belongs to namespace `{}`, and the administrator's tenancy configuration does "
                       "not let namespace `{}` restore its snapshots ({})",
                       owner->namespace_name, pod_namespace, kRestoreFrom);
}

Status RepositoryAllowed(const RegistryReference& reference, std::string_view ns, const TenancyConfig& config) {
  const NamespacePolicy& policy = config.For(ns);
  for (const RepositoryPrefix& prefix : policy.repositories)
    if (Under(reference, prefix)) return Status::Ok();
  std::string repository = reference.host + "/" + reference.repository;
  if (policy.repositories.empty())
    return Status::Error(Code::kPermissionDenied,
                         "namespace `{}` may not use repository `{}`: the administrator's tenancy configuration "
                         "gives it no registry ({})",
                         ns, repository, kRepositories);
  std::vector<std::string> allowed;
  for (const RepositoryPrefix& prefix : policy.repositories) allowed.push_back(prefix.ToString());
  return Status::Error(Code::kPermissionDenied,
                       "namespace `{}` may not use repository `{}`: the administrator's tenancy configuration gives "
                       "it {}",
                       ns, repository, fmt::join(allowed, ", "));
}

Status MayPush(const RegistryReference& reference, bool encrypted, std::string_view ns, const TenancyConfig& config) {
  if (encrypted || !config.For(ns).require_encryption) return Status::Ok();
  return Status::Error(Code::kPermissionDenied,
                       "namespace `{}` must encrypt what it pushes ({}), and has no recipients to push `{}` for: "
                       "give them in its Secret `gpusnap`, or as {} in the administrator's tenancy configuration",
                       ns, kRequireEncryption, reference.ToString(), kEncryptionRecipients);
}

Result<CredentialsSource> CredentialsToUse(const RegistryReference& reference, std::string_view ns,
                                           std::string_view namespace_config, std::string_view config_source,
                                           const TenancyConfig& config) {
  GPUSNAP_RETURN_IF_ERROR(RepositoryAllowed(reference, ns, config));
  GPUSNAP_ASSIGN_OR_RETURN(auto own, registry::CredentialsFor(namespace_config, reference.host, config_source));
  if (own) return CredentialsSource::kNamespace;
  return config.For(ns).agent_credentials ? CredentialsSource::kAgent : CredentialsSource::kNamespace;
}

}  // namespace gpusnap::tenancy
