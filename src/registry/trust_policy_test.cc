// The trust policy: parsing, the scope a reference falls in, the signed
// identities, and the judgement of signatures (trust_policy.h).
#include "registry/trust_policy.h"

#include <gtest/gtest.h>

#include "registry/auth.h"

namespace gpusnap::registry {
namespace {

constexpr const char* kKey = R"(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgBDCwhDax59JIkJqb
wXWF65AHBOBQJCwIxixNCg0m4/KhRANCAATpFvyRaveOBb3NY+do72z9CeJ1Mdy8
rwYolu8eA5zIc/EV8Jvu51wYxRpm3lApPPQU9znX7BgOxHWjl6RvZPiM
-----END PRIVATE KEY-----
)";
constexpr const char* kOtherPublicKey = R"(-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE08GXd80lP8YjeZYOQ0j1n7wDyZFl
D3gQD3Q3urKfgAB9pB9/lrC7zHa5fjPeU0xa4C+yROW2urgvSs0/Jt8dVg==
-----END PUBLIC KEY-----
)";
constexpr const char* kDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
constexpr const char* kOtherDigest = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

Reference Ref(const std::string& text) { return ParseRegistryReference(text).value(); }

Result<std::string> NoFiles(const std::string& path) {
  return Status::Error(Code::kNotFound, "no file `{}` in this test", path);
}

std::string PublicOf(const char* private_pem) { return SigningKey::Parse(private_pem, "").value().PublicKeyPem(); }

// A policy: unsigned anything by default, `scope` signed by `public_pem`.
std::string SignedScopePolicy(const std::string& scope, const std::string& public_pem,
                              const std::string& identity = "") {
  return R"({"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{")" + scope +
         R"(":[{"type":"sigstoreSigned","keyData":")" + Base64Encode(public_pem) + "\"" +
         (identity.empty() ? "" : R"(,"signedIdentity":)" + identity) + "}]}}}";
}

FetchedSignature SignatureOf(const std::string& reference, const std::string& digest) {
  auto key = SigningKey::Parse(kKey, "").value();
  std::string payload = SignaturePayload({reference, digest}, 1);
  return {payload, key.Sign(payload).value()};
}

TEST(TrustPolicy, TheMostSpecificScopeHoldsAReference) {
  auto p = ParseTrustPolicy(R"({"default":[{"type":"reject"}],"transports":{"docker":{
      "reg.example:5000/team/snap":[{"type":"insecureAcceptAnything"}],
      "reg.example:5000/team":[{"type":"reject"}],
      "reg.example:5000":[{"type":"reject"}],
      "*.example":[{"type":"reject"}],
      "":[{"type":"reject"}]}}})", "p.json", NoFiles);
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(RequirementsFor(*p, Ref("reg.example:5000/team/snap:v1")).scope, "reg.example:5000/team/snap");
  EXPECT_EQ(RequirementsFor(*p, Ref("reg.example:5000/team/other:v1")).scope, "reg.example:5000/team");
  EXPECT_EQ(RequirementsFor(*p, Ref("reg.example:5000/solo:v1")).scope, "reg.example:5000");
  EXPECT_EQ(RequirementsFor(*p, Ref("other.example/solo:v1")).scope, "*.example");
  EXPECT_EQ(RequirementsFor(*p, Ref("127.0.0.1:5000/solo:v1")).scope, "transports.docker[\"\"]");
  auto d = ParseTrustPolicy(R"({"default":[{"type":"reject"}]})", "p.json", NoFiles);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(RequirementsFor(*d, Ref("127.0.0.1:5000/solo:v1")).scope, "default");
}

TEST(TrustPolicy, MalformedPoliciesAreRefusedNamingThePlace) {
  auto refused = [](const std::string& text, const std::string& says) {
    auto p = ParseTrustPolicy(text, "p.json", NoFiles);
    ASSERT_FALSE(p.ok()) << text;
    EXPECT_NE(p.status().message().find(says), std::string::npos) << p.status().message();
    EXPECT_NE(p.status().message().find("p.json"), std::string::npos);
  };
  refused("{}", "no `default`");
  refused(R"({"default":[]})", "non-empty list");
  refused(R"({"default":[{"type":"acceptEverything"}]})", "unknown requirement type");
  refused(R"({"default":[{"type":"reject","keyPath":"/k"}]})", "unknown field `keyPath`");
  refused(R"({"default":[{"type":"sigstoreSigned"}]})", "needs a key");
  refused(R"({"default":[{"type":"sigstoreSigned","keyPath":"/k.pub"}]})", "no file `/k.pub`");
  refused(R"({"default":[{"type":"sigstoreSigned","keyData":"bm90IGEga2V5"}]})", "not a `PUBLIC KEY` PEM");
  refused(R"({"default":[{"type":"sigstoreSigned","fulcio":{}}]})", "`fulcio` is not supported");
  refused(R"({"default":[{"type":"signedBy","keyType":"GPGKeys"}]})", "GPG");
  refused(R"({"default":[{"type":"insecureAcceptAnything"}],"transports":{"docker":{"r/x":[{"type":"sigstoreSigned","keyData":"x","signedIdentity":{"type":"matchSomething"}}]}}})",
          "transports.docker");
}

TEST(TrustPolicy, SignedIdentities) {
  using K = SignedIdentity::Kind;
  Reference tag = Ref("reg.example/team/snap:v1");
  Reference digest = Ref(std::string("reg.example/team/snap@") + kDigest);
  SignedIdentity repo_digest_or_exact{K::kMatchRepoDigestOrExact, "", "", ""};
  EXPECT_TRUE(IdentityMatches(repo_digest_or_exact, tag, "reg.example/team/snap:v1"));
  EXPECT_FALSE(IdentityMatches(repo_digest_or_exact, tag, "reg.example/team/snap:v2"));
  EXPECT_FALSE(IdentityMatches(repo_digest_or_exact, tag, "reg.example/team/snap"));
  EXPECT_TRUE(IdentityMatches(repo_digest_or_exact, digest, "reg.example/team/snap:v2"));
  EXPECT_FALSE(IdentityMatches(repo_digest_or_exact, digest, "reg.example/team/other:v1"));
  SignedIdentity exact{K::kMatchExact, "", "", ""};
  EXPECT_TRUE(IdentityMatches(exact, tag, "reg.example/team/snap:v1"));
  EXPECT_FALSE(IdentityMatches(exact, digest, "reg.example/team/snap:v1"));
  SignedIdentity repository{K::kMatchRepository, "", "", ""};
  EXPECT_TRUE(IdentityMatches(repository, tag, "reg.example/team/snap:other"));
  EXPECT_FALSE(IdentityMatches(repository, tag, "reg.example/team/snapper:v1"));
  SignedIdentity exact_reference{K::kExactReference, "reg.example/release/snap:1", "", ""};
  EXPECT_TRUE(IdentityMatches(exact_reference, tag, "reg.example/release/snap:1"));
  EXPECT_FALSE(IdentityMatches(exact_reference, tag, "reg.example/team/snap:v1"));
  SignedIdentity exact_repository{K::kExactRepository, "reg.example/release/snap", "", ""};
  EXPECT_TRUE(IdentityMatches(exact_repository, tag, "reg.example/release/snap:any"));
  SignedIdentity remap{K::kRemapIdentity, "", "mirror.example/team", "reg.example/team"};
  EXPECT_TRUE(IdentityMatches(remap, Ref("mirror.example/team/snap:v1"), "reg.example/team/snap:v1"));
  EXPECT_FALSE(IdentityMatches(remap, Ref("mirror.example/teamx/snap:v1"), "reg.example/teamx/snap:v1"));
}

TEST(TrustPolicy, ASignatureByTheTrustedKeyForTheDigestAndReferenceIsAccepted) {
  auto p = ParseTrustPolicy(SignedScopePolicy("reg.example/team", PublicOf(kKey)), "p.json", NoFiles);
  ASSERT_TRUE(p.ok()) << p.status().message();
  Reference ref = Ref("reg.example/team/snap:v1");
  EXPECT_TRUE(NeedsSignatures(*RequirementsFor(*p, ref).requirements));
  EXPECT_TRUE(JudgeSignatures(*p, ref, kDigest, {SignatureOf("reg.example/team/snap:v1", kDigest)}).ok());
  // One good signature among bad ones is enough.
  EXPECT_TRUE(JudgeSignatures(*p, ref, kDigest,
                              {SignatureOf("reg.example/team/snap:v1", kOtherDigest),
                               SignatureOf("reg.example/team/snap:v1", kDigest)})
                  .ok());
  // Outside the scope, the default takes anything.
  EXPECT_TRUE(JudgeSignatures(*p, Ref("reg.example/elsewhere/snap:v1"), kDigest, {}).ok());
}

TEST(TrustPolicy, RefusalsNameTheReferenceTheDigestAndWhy) {
  Reference ref = Ref("reg.example/team/snap:v1");
  auto refusal = [&](const std::string& policy, const std::vector<FetchedSignature>& sigs) {
    auto p = ParseTrustPolicy(policy, "p.json", NoFiles);
    EXPECT_TRUE(p.ok()) << p.status().message();
    Status s = JudgeSignatures(*p, ref, kDigest, sigs);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("reg.example/team/snap:v1"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(kDigest), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find('\n'), std::string::npos);
    return s.message();
  };
  std::string signed_policy = SignedScopePolicy("reg.example/team", PublicOf(kKey));
  EXPECT_NE(refusal(signed_policy, {}).find("no signature"), std::string::npos);
  EXPECT_NE(refusal(SignedScopePolicy("reg.example/team", kOtherPublicKey),
                    {SignatureOf("reg.example/team/snap:v1", kDigest)})
                .find("no key the policy trusts"),
            std::string::npos);
  EXPECT_NE(refusal(signed_policy, {SignatureOf("reg.example/team/snap:v1", kOtherDigest)}).find("another digest"),
            std::string::npos);
  EXPECT_NE(refusal(signed_policy, {SignatureOf("reg.example/other/snap:v1", kDigest)})
                .find("reg.example/other/snap:v1"),
            std::string::npos);
  EXPECT_NE(refusal(R"({"default":[{"type":"reject"}]})", {}).find("rejects everything"), std::string::npos);
  // A payload altered after signing.
  FetchedSignature altered = SignatureOf("reg.example/team/snap:v1", kDigest);
  altered.payload[altered.payload.find("v1")] = 'w';
  EXPECT_NE(refusal(signed_policy, {altered}).find("no key the policy trusts"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap::registry
