#include "store/registry_reference.h"

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

TEST(RegistryReferenceTest, ParsesHostPortRepositoryAndTag) {
  auto r = ParseRegistryReference("127.0.0.1:5000/team/llama:v1");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->host, "127.0.0.1:5000");
  EXPECT_EQ(r->repository, "team/llama");
  EXPECT_EQ(r->tag, "v1");
  EXPECT_EQ(r->digest, "");
  EXPECT_EQ(r->ManifestName(), "v1");
  EXPECT_EQ(r->ToString(), "127.0.0.1:5000/team/llama:v1");
}

TEST(RegistryReferenceTest, DefaultsTheTagAndPrefersTheDigest) {
  auto plain = ParseRegistryReference("registry.example/snap");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->tag, "latest");
  std::string digest = "sha256:" + std::string(64, 'a');
  auto both = ParseRegistryReference("localhost:5000/a/b:v2@" + digest);
  ASSERT_TRUE(both.ok()) << both.status().message();
  EXPECT_EQ(both->tag, "v2");
  EXPECT_EQ(both->ManifestName(), digest);
  EXPECT_EQ(both->ToString(), "localhost:5000/a/b@" + digest);
  auto v6 = ParseRegistryReference("[::1]:5000/x");
  ASSERT_TRUE(v6.ok()) << v6.status().message();
  EXPECT_EQ(v6->host, "[::1]:5000");
}

TEST(RegistryReferenceTest, RefusesWhatTheGrammarForbidsNamingTheProblem) {
  struct Case {
    const char* text;
    const char* why;
  } cases[] = {
      {"", "empty"},
      {"snap", "no registry host"},
      {"host:5000/", "no repository"},
      {"host:5000/../etc:v1", "`..` path component"},
      {"host:5000/a/../b", "`..` path component"},
      {"host:5000/a//b", "empty path component"},
      {"host:5000/Team/x", "`Team`"},
      {"host:5000/a/b:-bad", "tag `-bad`"},
      {"host:5000/a@sha256:xyz", "digest `sha256:xyz`"},
      {"host:99999/a", "port 99999"},
      {"https://host/a", "no scheme"},
      {"host/a b", "space"},
      {"ho_st/a", "`ho_st` is not a host"},
  };
  for (const auto& c : cases) {
    auto r = ParseRegistryReference(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument) << c.text;
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << c.text << ": " << r.status().message();
  }
}

TEST(RegistryReferenceTest, OnlyASlashMakesAReference) {
  EXPECT_TRUE(LooksLikeRegistryReference("host/a"));
  EXPECT_FALSE(LooksLikeRegistryReference("ckpt-20261201-120000-abcd"));
}

}  // namespace
}  // namespace gpusnap
