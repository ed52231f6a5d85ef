#include "agent/service/registry_access.h"

#include <gtest/gtest.h>

#include "k8s/admission.h"

namespace gpusnap::agent {
namespace {

using nlohmann::json;

json Secret(std::string type, std::string data) {
  return {{"apiVersion", "v1"},
          {"kind", "Secret"},
          {"metadata", {{"name", "pull"}, {"namespace", "gpusnap-system"}}},
          {"type", type},
          {"data", {{".dockerconfigjson", k8s::Base64Encode(data)}}}};
}

TEST(AgentRegistryAccess, SecretNames) {
  auto ok = ParseSecretName("gpusnap-system/registry-pull");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->first, "gpusnap-system");
  EXPECT_EQ(ok->second, "registry-pull");
  for (const char* bad : {"registry-pull", "/x", "ns/", "NS/x", "ns/x/y", "ns/../x"}) {
    auto r = ParseSecretName(bad);
    EXPECT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("NAMESPACE/NAME"), std::string::npos) << bad;
  }
}

TEST(AgentRegistryAccess, TheDockerConfigOfASecret) {
  std::string config = R"({"auths": {"127.0.0.1:5000": {"auth": "dTpw"}}})";
  auto r = DockerConfigOfSecret(Secret("kubernetes.io/dockerconfigjson", config), "Secret ns/pull");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, config);
}

TEST(AgentRegistryAccess, SecretsThatAreNoDockerConfigAreRefusedWithoutTheirContent) {
  std::string secret_text = "hunter2-very-secret";
  auto opaque = DockerConfigOfSecret(Secret("Opaque", secret_text), "Secret ns/pull");
  ASSERT_FALSE(opaque.ok());
  EXPECT_NE(opaque.status().message().find("has type `Opaque`, not kubernetes.io/dockerconfigjson"),
            std::string::npos);
  auto not_json = DockerConfigOfSecret(Secret("kubernetes.io/dockerconfigjson", secret_text), "Secret ns/pull");
  ASSERT_FALSE(not_json.ok());
  EXPECT_NE(not_json.status().message().find("not a JSON object"), std::string::npos);
  EXPECT_EQ(not_json.status().message().find(secret_text), std::string::npos);
  json no_data = Secret("kubernetes.io/dockerconfigjson", "{}");
  no_data.erase("data");
  EXPECT_NE(DockerConfigOfSecret(no_data, "S").status().message().find("has no data `.dockerconfigjson`"),
            std::string::npos);
  json not_base64 = Secret("kubernetes.io/dockerconfigjson", "{}");
  not_base64["data"][".dockerconfigjson"] = "%%%";
  EXPECT_NE(DockerConfigOfSecret(not_base64, "S").status().message().find("not base64"), std::string::npos);
}

TEST(AgentRegistryAccess, ANamespacesOptInSecretOfEitherTypeWithOrWithoutCredentials) {
  std::string config = R"({"auths": {"127.0.0.1:5000": {"auth": "dTpw"}}})";
  auto docker = NamespaceDockerConfig(Secret("kubernetes.io/dockerconfigjson", config), "Secret ml/gpusnap");
  ASSERT_TRUE(docker.ok()) << docker.status().message();
  EXPECT_EQ(*docker, config);
  auto opaque = NamespaceDockerConfig(Secret("Opaque", config), "Secret ml/gpusnap");
  ASSERT_TRUE(opaque.ok()) << opaque.status().message();
  EXPECT_EQ(*opaque, config);
  // An Opaque Secret without a docker config opts in with no credentials.
  json bare = {{"apiVersion", "v1"}, {"kind", "Secret"}, {"type", "Opaque"}};
  auto none = NamespaceDockerConfig(bare, "Secret ml/gpusnap");
  ASSERT_TRUE(none.ok()) << none.status().message();
  EXPECT_EQ(json::parse(*none), json({{"auths", json::object()}}));
  // A dockerconfigjson needs its data; other types, and data that is no config, are refused unquoted.
  json no_data = Secret("kubernetes.io/dockerconfigjson", "{}");
  no_data.erase("data");
  EXPECT_NE(NamespaceDockerConfig(no_data, "S").status().message().find("has no data `.dockerconfigjson`"),
            std::string::npos);
  auto tls = NamespaceDockerConfig(Secret("kubernetes.io/tls", config), "Secret ml/gpusnap");
  ASSERT_FALSE(tls.ok());
  EXPECT_NE(tls.status().message().find("has type `kubernetes.io/tls`, not kubernetes.io/dockerconfigjson or Opaque"),
            std::string::npos)
      << tls.status().message();
  std::string secret_text = "hunter2-very-secret";
  auto not_json = NamespaceDockerConfig(Secret("Opaque", secret_text), "Secret ml/gpusnap");
  ASSERT_FALSE(not_json.ok());
  EXPECT_EQ(not_json.status().message().find(secret_text), std::string::npos);
}

TEST(AgentRegistryAccess, APodsPushTo) {
  json pod = {{"metadata", {{"name", "p"}, {"annotations", {{"gpusnap.io/push-to", "127.0.0.1:5000/ml/p:warm"}}}}}};
  auto r = PushToOfPod(pod);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, "127.0.0.1:5000/ml/p:warm");
  EXPECT_EQ(*PushToOfPod({{"metadata", {{"name", "p"}}}}), "");
  pod["metadata"]["annotations"]["gpusnap.io/push-to"] = "not a reference";
  auto bad = PushToOfPod(pod);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("annotation gpusnap.io/push-to"), std::string::npos);
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
}

TEST(AgentRegistryAccess, WithoutASecretTheSettingsAreTakenAsTheyAre) {
  RegistrySettings s;
  s.access.credentials_file = "/etc/gpusnap/config.json";
  s.access.plain_http = true;
  auto access = MakeRegistryAccess(s, nullptr, "/nonexistent", [](const std::string&) {});
  ASSERT_TRUE(access.ok()) << access.status().message();
  auto a = (*access)();
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->credentials_file, "/etc/gpusnap/config.json");
  EXPECT_TRUE(a->plain_http);
}

TEST(AgentRegistryAccess, ASecretNeedsTheApiServerAndExcludesAFile) {
  RegistrySettings s;
  s.secret = "gpusnap-system/pull";
  auto no_kube = MakeRegistryAccess(s, nullptr, "/nonexistent", [](const std::string&) {});
  ASSERT_FALSE(no_kube.ok());
  EXPECT_NE(no_kube.status().message().find("--registry-secret needs --kube"), std::string::npos);
  s.access.credentials_file = "/etc/config.json";
  auto both = MakeRegistryAccess(s, nullptr, "/nonexistent", [](const std::string&) {});
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("exclude each other"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap::agent
