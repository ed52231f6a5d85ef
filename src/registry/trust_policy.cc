#include "registry/trust_policy.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

#include "registry/auth.h"
#include "util/files.h"

namespace gpusnap::registry {

namespace {

using nlohmann::json;

Status Bad(const std::string& source, const std::string& where, const std::string& why) {
  return Status::Error(Code::kInvalidArgument, "trust policy `{}`: {}: {}", source, where, why);
}

Status OnlyFields(const json& j, const std::set<std::string>& allowed, const std::string& source,
                  const std::string& where) {
  for (const auto& [k, _] : j.items())
    if (!allowed.contains(k)) return Bad(source, where, fmt::format("unknown field `{}`", k));
  return Status::Ok();
}

Result<std::string> StringField(const json& j, const char* key, const std::string& source, const std::string& where) {
  if (!j.contains(key) || !j[key].is_string() || j[key].get<std::string>().empty())
    return Bad(source, where, fmt::format("`{}` must be a non-empty string", key));
  return j[key].get<std::string>();
}

Result<SignedIdentity> ParseIdentity(const json& j, const std::string& source, const std::string& where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    return Bad(source, where, "signedIdentity needs a `type`");
  std::string type = j["type"];
  SignedIdentity id;
  if (type == "matchRepoDigestOrExact" || type == "matchExact" || type == "matchRepository") {
    GPUSNAP_RETURN_IF_ERROR(OnlyFields(j, {"type"}, source, where));
    id.kind = type == "matchExact" ? SignedIdentity::Kind::kMatchExact
              : type == "matchRepository" ? SignedIdentity::Kind::kMatchRepository
                                          : SignedIdentity::Kind::kMatchRepoDigestOrExact;
  } else if (type == "exactReference") {
    GPUSNAP_RETURN_IF_ERROR(OnlyFields(j, {"type", "dockerReference"}, source, where));
    id.kind = SignedIdentity::Kind::kExactReference;
    GPUSNAP_ASSIGN_OR_RETURN(id.reference, StringField(j, "dockerReference", source, where));
  } else if (type == "exactRepository") {
    GPUSNAP_RETURN_IF_ERROR(OnlyFields(j, {"type", "dockerRepository"}, source, where));
    id.kind = SignedIdentity::Kind::kExactRepository;
    GPUSNAP_ASSIGN_OR_RETURN(id.reference, StringField(j, "dockerRepository", source, where));
  } else if (type == "remapIdentity") {
    GPUSNAP_RETURN_IF_ERROR(OnlyFields(j, {"type", "prefix", "signedPrefix"}, source, where));
    id.kind = SignedIdentity::Kind::kRemapIdentity;
    GPUSNAP_ASSIGN_OR_RETURN(id.prefix, StringField(j, "prefix", source, where));
    GPUSNAP_ASSIGN_OR_RETURN(id.signed_prefix, StringField(j, "signedPrefix", source, where));
  } else {
    return Bad(source, where, fmt::format("unknown signedIdentity type `{}`", type));
  }
  return id;
}

Result<std::vector<PolicyRequirement>> ParseRequirements(
    const json& list, const std::string& source, const std::string& where,
    const std::function<Result<std::string>(const std::string&)>& read_key_file) {
  if (!list.is_array() || list.empty()) return Bad(source, where, "must be a non-empty list of requirements");
  std::vector<PolicyRequirement> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& r = list[i];
    std::string at = fmt::format("{}[{}]", where, i);
    if (!r.is_object() || !r.contains("type") || !r["type"].is_string())
      return Bad(source, at, "a requirement needs a `type`");
    std::string type = r["type"];
    PolicyRequirement req;
    if (type == "insecureAcceptAnything" || type == "reject") {
      GPUSNAP_RETURN_IF_ERROR(OnlyFields(r, {"type"}, source, at));
      req.kind = type == "reject" ? PolicyRequirement::Kind::kReject : PolicyRequirement::Kind::kInsecureAcceptAnything;
    } else if (type == "sigstoreSigned") {
      for (const char* unsupported : {"fulcio", "rekorPublicKeyPath", "rekorPublicKeyData", "rekorPublicKeyPaths",
                                      "rekorPublicKeyDatas", "pki"})
        if (r.contains(unsupported))
          return Bad(source, at, fmt::format("`{}` is not supported: gpusnap verifies sigstoreSigned by public keys",
                                             unsupported));
      GPUSNAP_RETURN_IF_ERROR(
          OnlyFields(r, {"type", "keyPath", "keyPaths", "keyData", "keyDatas", "signedIdentity"}, source, at));
      req.kind = PolicyRequirement::Kind::kSigstoreSigned;
      std::vector<std::pair<std::string, std::string>> pems;  // (where, pem)
      auto strings = [&](const char* key, bool many) -> Result<std::vector<std::string>> {
        std::vector<std::string> v;
        if (!r.contains(key)) return v;
        const json& x = r[key];
        if (!many) {
          if (!x.is_string() || x.get<std::string>().empty())
            return Bad(source, at, fmt::format("`{}` must be a non-empty string", key));
          v.push_back(x);
          return v;
        }
        if (!x.is_array() || x.empty()) return Bad(source, at, fmt::format("`{}` must be a non-empty list", key));
        for (const json& e : x) {
          if (!e.is_string() || e.get<std::string>().empty())
            return Bad(source, at, fmt::format("`{}` must hold non-empty strings", key));
          v.push_back(e);
        }
        return v;
      };
      for (auto [key, many] : {std::pair{"keyPath", false}, {"keyPaths", true}}) {
        GPUSNAP_ASSIGN_OR_RETURN(auto paths, strings(key, many));
        for (const std::string& p : paths) {
          auto pem = read_key_file(p);
          if (!pem.ok()) return pem.status().Wrap(fmt::format("trust policy `{}`: {}: {}", source, at, key));
          pems.push_back({fmt::format("{} `{}`", key, p), *pem});
        }
      }
      for (auto [key, many] : {std::pair{"keyData", false}, {"keyDatas", true}}) {
        GPUSNAP_ASSIGN_OR_RETURN(auto datas, strings(key, many));
        for (const std::string& d : datas) {
          auto pem = Base64Decode(d);
          if (!pem) return Bad(source, at, fmt::format("`{}` is not base64", key));
          pems.push_back({key, *pem});
        }
      }
      if (pems.empty()) return Bad(source, at, "sigstoreSigned needs a key (keyPath, keyPaths, keyData or keyDatas)");
      for (const auto& [what, pem] : pems) {
        auto key = VerifyingKey::Parse(pem);
        if (!key.ok()) return Bad(source, at, fmt::format("{}: {}", what, key.status().message()));
        req.keys.push_back(std::make_shared<const VerifyingKey>(std::move(key).value()));
      }
      if (r.contains("signedIdentity")) {
        GPUSNAP_ASSIGN_OR_RETURN(req.identity, ParseIdentity(r["signedIdentity"], source, at + ".signedIdentity"));
      }
    } else if (type == "signedBy") {
      return Bad(source, at, "`signedBy` (GPG) is not supported: gpusnap verifies sigstoreSigned");
    } else {
      return Bad(source, at, fmt::format("unknown requirement type `{}`", type));
    }
    out.push_back(std::move(req));
  }
  return out;
}

// A docker reference's parts as the identity rules compare them.
struct DockerName {
  std::string name;    // host/repository
  std::string full;    // name:tag or name@digest
  bool name_only = true;
  bool has_digest = false;
};

std::optional<DockerName> ParseDockerName(std::string_view text) {
  auto ref = ParseRegistryReference(text);
  if (!ref.ok()) return std::nullopt;
  DockerName n;
  n.name = ref->host + "/" + ref->repository;
  std::string_view after_host = text.substr(ref->host.size());
  n.has_digest = !ref->digest.empty();
  n.name_only = !n.has_digest && after_host.find(':') == std::string_view::npos;
  n.full = n.name_only ? n.name : ref->ToString();
  return n;
}

DockerName Intended(const Reference& ref) {
  return {ref.host + "/" + ref.repository, ref.ToString(), false, !ref.digest.empty()};
}

bool RepoDigestOrExact(const DockerName& intended, const DockerName& signature) {
  if (signature.name_only) return false;
  if (intended.has_digest) return signature.name == intended.name;
  return signature.full == intended.full;
}

const char* KindName(SignedIdentity::Kind k) {
  switch (k) {
    case SignedIdentity::Kind::kMatchRepoDigestOrExact: return "matchRepoDigestOrExact";
    case SignedIdentity::Kind::kMatchExact: return "matchExact";
    case SignedIdentity::Kind::kMatchRepository: return "matchRepository";
    case SignedIdentity::Kind::kExactReference: return "exactReference";
    case SignedIdentity::Kind::kExactRepository: return "exactRepository";
    case SignedIdentity::Kind::kRemapIdentity: return "remapIdentity";
  }
  return "?";
}

// Why one signature is not accepted by `req`, or "" when it is.
std::string Rejection(const PolicyRequirement& req, const Reference& ref, std::string_view digest,
                      const FetchedSignature& sig) {
  bool signed_by_trusted_key = false;
  for (const auto& key : req.keys)
    if (key->Verifies(sig.payload, sig.signature_base64)) signed_by_trusted_key = true;
  if (!signed_by_trusted_key) return "a signature by no key the policy trusts";
  auto claim = ParseSignaturePayload(sig.payload);
  if (!claim.ok()) return claim.status().message();
  if (claim->manifest_digest != digest) return fmt::format("a signature for another digest, {}", claim->manifest_digest);
  if (!IdentityMatches(req.identity, ref, claim->docker_reference))
    return fmt::format("a signature for `{}`, which signedIdentity {} does not accept", claim->docker_reference,
                       KindName(req.identity.kind));
  return "";
}

}  // namespace

Result<TrustPolicy> ParseTrustPolicy(std::string_view text, const std::string& source,
                                     const std::function<Result<std::string>(const std::string&)>& read_key_file) {
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Bad(source, "the file", "not a JSON object");
  GPUSNAP_RETURN_IF_ERROR(OnlyFields(j, {"default", "transports"}, source, "the file"));
  TrustPolicy policy;
  policy.source = source;
  if (!j.contains("default")) return Bad(source, "the file", "it has no `default` list");
  GPUSNAP_ASSIGN_OR_RETURN(policy.default_requirements, ParseRequirements(j["default"], source, "default", read_key_file));
  if (j.contains("transports")) {
    const json& t = j["transports"];
    if (!t.is_object()) return Bad(source, "transports", "must be an object");
    // Other transports (containers-storage, oci, ...) never apply to a pull from a registry.
    if (t.contains("docker")) {
      if (!t["docker"].is_object()) return Bad(source, "transports.docker", "must be an object of scopes");
      for (const auto& [scope, list] : t["docker"].items()) {
        GPUSNAP_ASSIGN_OR_RETURN(policy.docker_scopes[scope],
                                 ParseRequirements(list, source, fmt::format("transports.docker[\"{}\"]", scope),
                                                   read_key_file));
      }
    }
  }
  return policy;
}

Result<TrustPolicy> LoadTrustPolicy(const std::string& path) {
  std::string file = path.empty() ? kDefaultPolicyPath : path;
  auto text = ReadFile(file);
  if (!text.ok())
    return text.status().Wrap(fmt::format("trust policy{}", path.empty() ? " (the default; name one with --policy)" : ""));
  return ParseTrustPolicy(*text, file, [](const std::string& key_path) { return ReadFile(key_path); });
}

ScopedRequirements RequirementsFor(const TrustPolicy& policy, const Reference& ref) {
  auto find = [&](const std::string& scope) -> const std::vector<PolicyRequirement>* {
    auto it = policy.docker_scopes.find(scope);
    return it == policy.docker_scopes.end() ? nullptr : &it->second;
  };
  std::vector<std::string> scopes = {ref.ToString()};
  for (std::string name = ref.host + "/" + ref.repository;;) {
    scopes.push_back(name);
    auto slash = name.rfind('/');
    if (slash == std::string::npos) break;
    name.resize(slash);
  }
  std::string host = ref.host.substr(0, ref.host.rfind(':') == std::string::npos || ref.host.back() == ']'
                                            ? ref.host.size()
                                            : ref.host.rfind(':'));
  for (size_t dot = host.find('.'); dot != std::string::npos; dot = host.find('.', dot + 1))
    scopes.push_back("*" + host.substr(dot));
  scopes.push_back("");
  for (const std::string& s : scopes)
    if (const auto* r = find(s)) return {s.empty() ? "transports.docker[\"\"]" : s, r};
  return {"default", &policy.default_requirements};
}

bool NeedsSignatures(const std::vector<PolicyRequirement>& requirements) {
  for (const auto& r : requirements)
    if (r.kind == PolicyRequirement::Kind::kSigstoreSigned) return true;
  return false;
}

bool IdentityMatches(const SignedIdentity& identity, const Reference& ref, std::string_view signed_reference) {
  auto signature = ParseDockerName(signed_reference);
  if (!signature) return false;
  DockerName intended = Intended(ref);
  switch (identity.kind) {
    case SignedIdentity::Kind::kMatchRepoDigestOrExact:
      return RepoDigestOrExact(intended, *signature);
    case SignedIdentity::Kind::kMatchExact:
      return !signature->name_only && signature->full == intended.full;
    case SignedIdentity::Kind::kMatchRepository:
      return signature->name == intended.name;
    case SignedIdentity::Kind::kExactReference: {
      auto wanted = ParseDockerName(identity.reference);
      return wanted && !wanted->name_only && !signature->name_only && signature->full == wanted->full;
    }
    case SignedIdentity::Kind::kExactRepository: {
      auto wanted = ParseDockerName(identity.reference);
      return wanted && signature->name == wanted->name;
    }
    case SignedIdentity::Kind::kRemapIdentity: {
      const std::string& p = identity.prefix;
      bool under = intended.name == p || (intended.name.starts_with(p) && intended.name.size() > p.size() &&
                                          intended.name[p.size()] == '/');
      if (under) {
        auto remapped = ParseDockerName(identity.signed_prefix + intended.full.substr(p.size()));
        if (!remapped) return false;
        remapped->name_only = false;
        remapped->has_digest = intended.has_digest;
        intended = *remapped;
      }
      return RepoDigestOrExact(intended, *signature);
    }
  }
  return false;
}

Status JudgeSignatures(const TrustPolicy& policy, const Reference& ref, std::string_view digest,
                       const std::vector<FetchedSignature>& signatures) {
  ScopedRequirements scoped = RequirementsFor(policy, ref);
  auto refuse = [&](const std::string& why) {
    return Status::Error(Code::kFailedPrecondition, "refusing `{}` ({}): {} (trust policy `{}`, scope `{}`)",
                         ref.ToString(), digest, why, policy.source, scoped.scope);
  };
  for (const PolicyRequirement& req : *scoped.requirements) {
    switch (req.kind) {
      case PolicyRequirement::Kind::kInsecureAcceptAnything:
        continue;
      case PolicyRequirement::Kind::kReject:
        return refuse("the policy rejects everything in this scope");
      case PolicyRequirement::Kind::kSigstoreSigned: {
        if (signatures.empty()) return refuse("it has no signature, and the policy requires one");
        std::vector<std::string> reasons;
        bool accepted = false;
        for (const FetchedSignature& sig : signatures) {
          std::string why = Rejection(req, ref, digest, sig);
          if (why.empty()) {
            accepted = true;
            break;
          }
          if (std::find(reasons.begin(), reasons.end(), why) == reasons.end()) reasons.push_back(why);
        }
        if (!accepted) return refuse(fmt::format("no signature is accepted: {}", fmt::join(reasons, "; ")));
        continue;
      }
    }
  }
  return Status::Ok();
}

}  // namespace gpusnap::registry
