#include "tenancy/tenancy.h"

#include <gtest/gtest.h>

namespace gpusnap::tenancy {
namespace {

constexpr std::string_view kSample = R"({"namespaces": {
  "team-a": {"repositories": ["registry.example:5000/team-a", "127.0.0.1:5000/shared/models"],
             "agentCredentials": true, "restoreFrom": ["shared-models"], "restoreUnowned": true},
  "team-b": {"repositories": ["registry.example:5000/team-b"],
             "decryptionKeys": ["/etc/gpusnap/keys/b.pem", "/etc/gpusnap/keys/b-old.pem"],
             "encryptionRecipients": ["/etc/gpusnap/keys/b.pub"],
             "encryptionSecretFile": "/etc/gpusnap/keys/b.secret", "requireEncryption": true},
  "ops": {"restoreFrom": ["*"]}}})";

TenancyConfig Sample() {
  auto parsed = ParseTenancyConfig(kSample, "tenancy.json");
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? *parsed : TenancyConfig{};
}

RegistryReference Ref(std::string_view text) {
  auto parsed = ParseRegistryReference(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
  return parsed.ok() ? *parsed : RegistryReference{};
}

std::string Refusal(std::string_view text) {
  auto parsed = ParseTenancyConfig(text, "/etc/gpusnap/tenancy.json");
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument);
  return parsed.status().message();
}

TEST(TenancyConfig, ParsesEveryMember) {
  TenancyConfig c = Sample();
  ASSERT_EQ(c.namespaces.size(), 3u);
  const NamespacePolicy& a = c.For("team-a");
  EXPECT_EQ(a.repositories, (std::vector<RepositoryPrefix>{{"registry.example:5000", "team-a"},
                                                            {"127.0.0.1:5000", "shared/models"}}));
  EXPECT_TRUE(a.agent_credentials);
  EXPECT_EQ(a.restore_from, (std::set<std::string>{"shared-models"}));
  EXPECT_FALSE(a.restore_from_any);
  EXPECT_TRUE(a.restore_unowned);
  EXPECT_TRUE(c.For("ops").restore_from_any);
  EXPECT_EQ(c.For("team-b").keys, (KeyFiles{{"/etc/gpusnap/keys/b.pem", "/etc/gpusnap/keys/b-old.pem"},
                                            {"/etc/gpusnap/keys/b.pub"},
                                            "/etc/gpusnap/keys/b.secret"}));
  EXPECT_TRUE(c.For("team-b").require_encryption);
  EXPECT_EQ(a.keys, KeyFiles{});
  EXPECT_FALSE(a.require_encryption);
  // Not listed: the defaults.
  const NamespacePolicy& other = c.For("elsewhere");
  EXPECT_TRUE(other.repositories.empty());
  EXPECT_FALSE(other.agent_credentials || other.restore_from_any || other.restore_unowned);
  EXPECT_TRUE(ParseTenancyConfig("{}", "f").ok());
  EXPECT_TRUE(ParseTenancyConfig(R"({"namespaces": {}})", "f").ok());
}

TEST(TenancyConfig, BadFilesAreRefusedNamingTheFileAndTheMember) {
  EXPECT_NE(Refusal("{").find("tenancy configuration `/etc/gpusnap/tenancy.json`: a JSON syntax error at byte 2"),
            std::string::npos)
      << Refusal("{");
  EXPECT_NE(Refusal("[]").find("is array, not a JSON object"), std::string::npos);
  EXPECT_NE(Refusal(R"({"namespace": {}})").find("`namespace` is not a member this gpusnap knows (namespaces)"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"namespaces": {"Team_A": {}}})").find("`Team_A` is not a namespace name"), std::string::npos);
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {"restoreFrom": "b"}}})")
                .find("`namespaces.a.restoreFrom` is \"b\", not an array of strings"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {"restoreFrom": ["b", "B!"]}}})")
                .find("`namespaces.a.restoreFrom[1]` is \"B!\", not a namespace name or \"*\""),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {"agentCredentials": "yes"}}})")
                .find("`namespaces.a.agentCredentials` is \"yes\", not true or false"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {"restoreUnowned": 1}}})").find("`namespaces.a.restoreUnowned`"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {"repository": []}}})")
                .find("`namespaces.a.repository` is not a member this gpusnap knows"),
            std::string::npos);
  // A prefix is a repository without tag or digest, in the references' grammar.
  for (const std::string& bad : std::vector<std::string>{"registry.example:5000/team-a:v1", "team-a", "registry.example:5000/Team",
                               "registry.example:5000/team-a/", "registry.example:5000/a@sha256:" +
                                                                    std::string(64, '0')})
    EXPECT_NE(Refusal(fmt::format(R"({{"namespaces": {{"a": {{"repositories": ["{}"]}}}}}})", bad))
                  .find("`namespaces.a.repositories[0]`"),
              std::string::npos)
        << bad;
  // Key files by absolute paths only: the file holds no key, and a relative
  // path would depend on the agent's working directory.
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {"decryptionKeys": ["keys/a.pem"]}}})")
                .find("`namespaces.a.decryptionKeys[0]` is \"keys/a.pem\", not an absolute path"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {"encryptionRecipients": "/a.pub"}}})")
                .find("`namespaces.a.encryptionRecipients` is \"/a.pub\", not an array of absolute paths"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {"encryptionSecretFile": ["/s"]}}})")
                .find("`namespaces.a.encryptionSecretFile` is [\"/s\"], not an absolute path"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {"requireEncryption": "yes"}}})")
                .find("`namespaces.a.requireEncryption` is \"yes\", not true or false"),
            std::string::npos);
  // A member given twice would let the second silently win.
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {"restoreUnowned": false, "restoreUnowned": true}}})")
                .find("member `restoreUnowned` is given twice"),
            std::string::npos);
  EXPECT_NE(Refusal(R"({"namespaces": {"a": {}, "a": {"restoreFrom": ["*"]}}})").find("member `a` is given twice"),
            std::string::npos);
}

TEST(MayRestore, OwnNamespaceAlwaysOthersOnlyAsTheAdministratorSays) {
  TenancyConfig c = Sample();
  SnapshotOwner of_a{"team-a", "vllm-0"}, of_b{"team-b", "vllm-0"}, shared{"shared-models", "llama-0"};
  EXPECT_TRUE(MayRestore(of_a, "team-a", c).ok());
  EXPECT_TRUE(MayRestore(of_b, "team-b", TenancyConfig{}).ok());  // no configuration at all
  EXPECT_TRUE(MayRestore(shared, "team-a", c).ok());
  EXPECT_TRUE(MayRestore(of_b, "ops", c).ok());  // "*"

  Status st = MayRestore(of_a, "team-b", c);
  EXPECT_EQ(st.code(), Code::kPermissionDenied);
  EXPECT_NE(st.message().find("belongs to namespace `team-a`"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("namespace `team-b` restore its snapshots (restoreFrom)"), std::string::npos)
      << st.message();
  EXPECT_EQ(MayRestore(of_b, "team-a", c).code(), Code::kPermissionDenied);  // restoreFrom names shared-models only
  EXPECT_EQ(MayRestore(shared, "team-b", c).code(), Code::kPermissionDenied);
  EXPECT_EQ(MayRestore(of_a, "elsewhere", c).code(), Code::kPermissionDenied);
}

TEST(MayRestore, ASnapshotOfNoNamespaceOnlyWithRestoreUnowned) {
  TenancyConfig c = Sample();
  EXPECT_TRUE(MayRestore(std::nullopt, "team-a", c).ok());
  Status st = MayRestore(std::nullopt, "team-b", c);
  EXPECT_EQ(st.code(), Code::kPermissionDenied);
  EXPECT_NE(st.message().find("belongs to no namespace"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("namespace `team-b`"), std::string::npos) << st.message();
  // "*" is about namespaces: a snapshot of none is not among them.
  EXPECT_EQ(MayRestore(std::nullopt, "ops", c).code(), Code::kPermissionDenied);
  EXPECT_EQ(MayRestore(std::nullopt, "team-a", TenancyConfig{}).code(), Code::kPermissionDenied);
}

TEST(RepositoryAllowed, UnderAPrefixOnAPathComponentBoundary) {
  TenancyConfig c = Sample();
  for (const std::string& ok : std::vector<std::string>{"registry.example:5000/team-a:v1", "registry.example:5000/team-a/llama:v1",
                              "registry.example:5000/team-a/x/y@sha256:" + std::string(64, 'a'),
                              "127.0.0.1:5000/shared/models/llama"})
    EXPECT_TRUE(RepositoryAllowed(Ref(ok), "team-a", c).ok()) << ok;
  for (const std::string& refused : std::vector<std::string>{"registry.example:5000/team-ab:v1", "registry.example:5000/team-b/llama",
                                   "registry.example/team-a:v1", "other.example:5000/team-a:v1",
                                   "127.0.0.1:5000/shared/modelsx", "127.0.0.1:5000/shared"}) {
    Status st = RepositoryAllowed(Ref(refused), "team-a", c);
    EXPECT_EQ(st.code(), Code::kPermissionDenied) << refused;
    EXPECT_NE(st.message().find("gives it registry.example:5000/team-a, 127.0.0.1:5000/shared/models"),
              std::string::npos)
        << st.message();
  }
  Status none = RepositoryAllowed(Ref("registry.example:5000/ops/x"), "ops", c);
  EXPECT_EQ(none.code(), Code::kPermissionDenied);
  EXPECT_NE(none.message().find("namespace `ops` may not use repository `registry.example:5000/ops/x`: the "
                                "administrator's tenancy configuration gives it no registry"),
            std::string::npos)
      << none.message();
  EXPECT_EQ(RepositoryAllowed(Ref("registry.example:5000/team-a:v1"), "team-b", c).code(), Code::kPermissionDenied);
}

TEST(MayPush, InTheClearOnlyWhereEncryptionIsNotRequired) {
  TenancyConfig c = Sample();
  EXPECT_TRUE(MayPush(Ref("registry.example:5000/team-a:v1"), false, "team-a", c).ok());
  EXPECT_TRUE(MayPush(Ref("registry.example:5000/team-b:v1"), true, "team-b", c).ok());
  Status st = MayPush(Ref("registry.example:5000/team-b:v1"), false, "team-b", c);
  EXPECT_EQ(st.code(), Code::kPermissionDenied);
  EXPECT_EQ(st.message(),
            "namespace `team-b` must encrypt what it pushes (requireEncryption), and has no recipients to push "
            "`registry.example:5000/team-b:v1` for: give them in its Secret `gpusnap`, or as encryptionRecipients in "
            "the administrator's tenancy configuration");
}

TEST(CredentialsToUse, TheNamespacesOwnElseTheAgentsOnlyWhereAllowed) {
  TenancyConfig c = Sample();
  const std::string own = R"({"auths": {"registry.example:5000": {"auth": "dGVhbS1hOnNlY3JldA=="}}})";
  const std::string empty = R"({"auths": {}})";
  auto use = [&](std::string_view ref, std::string_view ns, const std::string& config) {
    return CredentialsToUse(Ref(ref), ns, config, "Secret team-a/gpusnap", c);
  };
  EXPECT_EQ(*use("registry.example:5000/team-a:v1", "team-a", own), CredentialsSource::kNamespace);
  // None of its own for that registry: the agent's, as agentCredentials allows.
  EXPECT_EQ(*use("127.0.0.1:5000/shared/models:v1", "team-a", own), CredentialsSource::kAgent);
  EXPECT_EQ(*use("registry.example:5000/team-a:v1", "team-a", empty), CredentialsSource::kAgent);
  // team-b may not have the agent's: its own (none: anonymous).
  EXPECT_EQ(*use("registry.example:5000/team-b:v1", "team-b", empty), CredentialsSource::kNamespace);
  EXPECT_EQ(*use("registry.example:5000/team-b:v1", "team-b", "{}"), CredentialsSource::kNamespace);
  // A repository the namespace may not use is refused before any credentials.
  EXPECT_EQ(use("registry.example:5000/team-a:v1", "team-b", own).status().code(), Code::kPermissionDenied);
  auto broken = use("registry.example:5000/team-a:v1", "team-a", "{\"auths\": {\"registry.example:5000\": "
                                                                  "{\"auth\": \"not base64 of a pair\"}}}");
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("Secret team-a/gpusnap"), std::string::npos)
      << broken.status().message();
  EXPECT_EQ(broken.status().message().find("not base64 of a pair\""), std::string::npos);
}

}  // namespace
}  // namespace gpusnap::tenancy
