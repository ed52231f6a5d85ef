// Kubeconfig files, written by hand and by the real kubectl, and the
// in-cluster configuration.
#include "k8s/kubeconfig.h"

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "k8s/admission.h"
#include "k8s/pod_testing.h"

namespace gpusnap::k8s {
namespace {

constexpr const char* kPem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

std::string Kubeconfig(const std::string& cluster_fields, const std::string& user_fields,
                       const std::string& current = "main") {
  return "apiVersion: v1\nkind: Config\ncurrent-context: " + current +
         "\nclusters:\n- name: c1\n  cluster:\n" + cluster_fields +
         "- name: c2\n  cluster:\n    server: https://other:443\n"
         "contexts:\n- name: main\n  context:\n    cluster: c1\n    user: u1\n    namespace: ml\n"
         "- name: second\n  context:\n    cluster: c2\n    user: u1\n"
         "users:\n- name: u1\n  user:\n" +
         user_fields;
}

ApiServerConfig Parsed(const std::string& text, std::string_view context = "") {
  auto r = ParseKubeconfig(text, "/etc/kube", context);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ApiServerConfig{};
}

std::string Refusal(const std::string& text) {
  auto r = ParseKubeconfig(text, "/etc/kube");
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.status().message();
}

TEST(Kubeconfig, ServerCaDataAndToken) {
  ApiServerConfig c = Parsed(Kubeconfig("    server: https://10.1.2.3:6443\n    certificate-authority-data: " +
                                            Base64Encode(kPem) + "\n",
                                        "    token: sekret\n"));
  EXPECT_EQ(c.server, "https://10.1.2.3:6443");
  EXPECT_EQ(c.ca_pem, kPem);
  EXPECT_EQ(c.ca_file, "");
  EXPECT_EQ(c.token, "sekret");
}

TEST(Kubeconfig, FilesResolvedAgainstTheKubeconfigsDirectory) {
  ApiServerConfig c = Parsed(Kubeconfig("    server: https://h\n    certificate-authority: pki/ca.crt\n",
                                        "    tokenFile: /var/run/token\n"));
  EXPECT_EQ(c.ca_file, "/etc/kube/pki/ca.crt");
  EXPECT_EQ(c.ca_pem, "");
  EXPECT_EQ(c.token, "");
  EXPECT_EQ(c.token_file, "/var/run/token");
}

TEST(Kubeconfig, NamedContextOverCurrentContext) {
  ApiServerConfig c = Parsed(Kubeconfig("    server: https://h\n", "    token: t\n"), "second");
  EXPECT_EQ(c.server, "https://other:443");
}

TEST(Kubeconfig, NoCurrentContextIsRefused) {
  EXPECT_NE(Refusal(Kubeconfig("    server: https://h\n", "    token: t\n", "''")).find("no current-context"),
            std::string::npos);
}

TEST(Kubeconfig, UnknownContextIsRefused) {
  EXPECT_NE(Refusal(Kubeconfig("    server: https://h\n", "    token: t\n", "nope")).find("`nope`"),
            std::string::npos);
}

TEST(Kubeconfig, ClientCertificateIsRefusedByName) {
  std::string why = Refusal(Kubeconfig("    server: https://h\n", "    client-certificate-data: AAAA\n"));
  EXPECT_NE(why.find("client-certificate-data"), std::string::npos) << why;
  EXPECT_NE(why.find("give it a token"), std::string::npos) << why;
}

TEST(Kubeconfig, ExecPluginIsRefused) {
  EXPECT_NE(Refusal(Kubeconfig("    server: https://h\n", "    exec:\n      command: aws\n")).find("`exec`"),
            std::string::npos);
}

TEST(Kubeconfig, InsecureSkipVerifyIsRefused) {
  EXPECT_NE(Refusal(Kubeconfig("    server: https://h\n    insecure-skip-tls-verify: true\n", "    token: t\n"))
                .find("insecure-skip-tls-verify"),
            std::string::npos);
}

TEST(Kubeconfig, ServerMustBeHttp) {
  EXPECT_NE(Refusal(Kubeconfig("    server: tcp://h\n", "    token: t\n")).find("not an http(s) URL"),
            std::string::npos);
}

TEST(Kubeconfig, BadCaDataIsRefused) {
  EXPECT_NE(Refusal(Kubeconfig("    server: https://h\n    certificate-authority-data: 'no base64!'\n",
                               "    token: t\n"))
                .find("certificate-authority-data"),
            std::string::npos);
}

TEST(Kubeconfig, JsonKubeconfig) {
  ApiServerConfig c = Parsed(R"({"current-context": "x", "clusters": [{"name": "k", "cluster": {"server":
      "https://127.0.0.1:4443", "certificate-authority-data": ")" + Base64Encode(kPem) + R"("}}],
      "users": [{"name": "u", "user": {"token": "tk"}}],
      "contexts": [{"name": "x", "context": {"cluster": "k", "user": "u"}}]})");
  EXPECT_EQ(c.server, "https://127.0.0.1:4443");
  EXPECT_EQ(c.ca_pem, kPem);
  EXPECT_EQ(c.token, "tk");
}

TEST(Kubeconfig, WrittenByKubectl) {
  if (std::string why = testing::KubectlMissing(); !why.empty()) GTEST_SKIP() << why;
  std::string dir = testing::ScratchDir() + "/kubeconfig-test";
  std::string file = dir + "/config";
  std::string ca = dir + "/ca.crt";
  ASSERT_EQ(testing::RunKubectl({"version", "--client"}).status, 0);
  std::filesystem::create_directories(dir);
  std::ofstream(ca) << kPem;
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"config", "set-cluster", "gpu-cluster", "--server=https://[fd00::1]:6443",
                                 "--certificate-authority=" + ca, "--embed-certs=true"},
        std::vector<std::string>{"config", "set-credentials", "agent", "--token=abc.def-123"},
        std::vector<std::string>{"config", "set-context", "agent@gpu", "--cluster=gpu-cluster", "--user=agent",
                                 "--namespace=gpusnap-system"},
        std::vector<std::string>{"config", "use-context", "agent@gpu"}}) {
    std::vector<std::string> full = args;
    full.push_back("--kubeconfig=" + file);
    auto run = testing::RunKubectl(full);
    ASSERT_EQ(run.status, 0) << run.output;
  }
  auto c = LoadKubeconfig(file);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->server, "https://[fd00::1]:6443");
  EXPECT_EQ(c->ca_pem, kPem);
  EXPECT_EQ(c->token, "abc.def-123");
}

TEST(Kubeconfig, LoadReadsTheCaFile) {
  std::string dir = testing::ScratchDir() + "/kubeconfig-ca-file";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/ca.pem") << kPem;
  std::ofstream(dir + "/config") << Kubeconfig("    server: https://h\n    certificate-authority: ca.pem\n",
                                               "    token: t\n");
  auto c = LoadKubeconfig(dir + "/config");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->ca_pem, kPem);
  EXPECT_EQ(LoadKubeconfig(dir + "/missing").status().code(), Code::kNotFound);
}

TEST(InCluster, FromServiceAccount) {
  ApiServerConfig c = InClusterConfig("10.96.0.1", "443", "/sa");
  EXPECT_EQ(c.server, "https://10.96.0.1:443");
  EXPECT_EQ(c.ca_file, "/sa/ca.crt");
  EXPECT_EQ(c.token_file, "/sa/token");
  EXPECT_EQ(InClusterConfig("fd00::1", "6443").server, "https://[fd00::1]:6443");
}

TEST(Base64, DecodesWithAndWithoutPadding) {
  for (const std::string& s : {std::string(), std::string("a"), std::string("ab"), std::string("abc"),
                               std::string("abcd"), std::string("\xff\x00\x10 binary", 10)}) {
    std::string encoded = Base64Encode(s);
    EXPECT_EQ(*Base64Decode(encoded), s);
    while (!encoded.empty() && encoded.back() == '=') encoded.pop_back();
    EXPECT_EQ(*Base64Decode(encoded), s);
  }
  EXPECT_FALSE(Base64Decode("ab*d").ok());
  EXPECT_FALSE(Base64Decode("abcde").ok());
}

}  // namespace
}  // namespace gpusnap::k8s
