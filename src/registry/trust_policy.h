// The trust policy of a pull, in the containers-policy.json format that
// skopeo and podman read (docs/DISTRIBUTION.md, "Trust policy"): a
// `default` list of requirements and, under `transports.docker`, lists for
// scopes (a reference, a repository, a namespace, a host, `*.domain`, or ""
// for the transport). The most specific scope that names a reference holds
// its requirements, all of which must accept it. Requirements:
// insecureAcceptAnything, reject, and sigstoreSigned with public keys
// (keyPath, keyPaths, keyData, keyDatas) and a signedIdentity.
//
// Parsed once where it enters (LoadTrustPolicy); the evaluation is pure.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"
#include "registry/reference.h"
#include "registry/sigstore.h"

namespace gpusnap::registry {

inline constexpr const char* kDefaultPolicyPath = "/etc/containers/policy.json";

struct SignedIdentity {
  enum class Kind { kMatchRepoDigestOrExact, kMatchExact, kMatchRepository, kExactReference, kExactRepository,
                    kRemapIdentity };
  Kind kind = Kind::kMatchRepoDigestOrExact;
  std::string reference;      // exactReference's dockerReference, exactRepository's dockerRepository
  std::string prefix;         // remapIdentity
  std::string signed_prefix;  // remapIdentity
};

struct PolicyRequirement {
  enum class Kind { kInsecureAcceptAnything, kReject, kSigstoreSigned };
  Kind kind = Kind::kReject;
  std::vector<std::shared_ptr<const VerifyingKey>> keys;  // sigstoreSigned: any of them
  SignedIdentity identity;                                // sigstoreSigned
};

struct TrustPolicy {
  std::string source;  // the file, for messages
  std::vector<PolicyRequirement> default_requirements;
  std::map<std::string, std::vector<PolicyRequirement>> docker_scopes;
};

// Pure but for `read_key_file`, which gives a keyPath's content. Refuses
// (kInvalidArgument, naming `source` and the place) unknown requirement
// types and fields, a sigstoreSigned without keys or with keys that are not
// ECDSA P-256 public keys, Fulcio and Rekor settings (not supported), and a
// missing or empty `default`.
Result<TrustPolicy> ParseTrustPolicy(std::string_view json, const std::string& source,
                                     const std::function<Result<std::string>(const std::string&)>& read_key_file);

// The policy of a file (empty path: kDefaultPolicyPath), its keyPaths read.
Result<TrustPolicy> LoadTrustPolicy(const std::string& path);

// Pure. The scope that holds `ref`'s requirements ("default" for the
// policy's default list) and the requirements.
struct ScopedRequirements {
  std::string scope;
  const std::vector<PolicyRequirement>* requirements = nullptr;
};
ScopedRequirements RequirementsFor(const TrustPolicy& policy, const Reference& ref);

// Pure. Whether any requirement needs signatures fetched.
bool NeedsSignatures(const std::vector<PolicyRequirement>& requirements);

// Pure. Whether a signature naming `signed_reference` is accepted for the
// reference the user named, under `identity`.
bool IdentityMatches(const SignedIdentity& identity, const Reference& intended, std::string_view signed_reference);

// A signature as fetched: its payload's bytes (checked against their
// digest) and the base64 signature.
struct FetchedSignature {
  std::string payload;
  std::string signature_base64;
};

// Pure. OK when every requirement accepts the manifest `manifest_digest` of
// `ref`; otherwise kFailedPrecondition, one line naming the reference, the
// digest, why (reject, no signature, no trusted key, another digest, another
// identity) and the policy's file and scope.
Status JudgeSignatures(const TrustPolicy& policy, const Reference& ref, std::string_view manifest_digest,
                       const std::vector<FetchedSignature>& signatures);

}  // namespace gpusnap::registry
