#include "registry/auth.h"

#include <gtest/gtest.h>

#include <vector>

namespace gpusnap::registry {
namespace {

TEST(AuthTest, Base64RoundTripsAndRefusesGarbage) {
  for (const std::string& s : std::vector<std::string>{"", "a", "ab", "abc", "user:pa:ss", std::string("\0\xff", 2)})
    EXPECT_EQ(Base64Decode(Base64Encode(s)).value_or("<none>"), s);
  EXPECT_EQ(Base64Encode("user:pass"), "dXNlcjpwYXNz");
  EXPECT_FALSE(Base64Decode("dXN!").has_value());
  EXPECT_FALSE(Base64Decode("dX=N").has_value());
}

TEST(AuthTest, FindsTheHostsCredentialsWhateverFormTheKeyTakes) {
  std::string json = R"({"auths": {
    "https://other:5000/v1/": {"auth": "b3RoZXI6eA=="},
    "https://reg.example:5000/v2/": {"auth": "dXNlcjpwYXNz"},
    "plain:5000": {"username": "u", "password": "p"},
    "tok:5000": {"identitytoken": "refresh"}}})";
  auto c = CredentialsFor(json, "reg.example:5000", "config.json");
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE(c->has_value());
  EXPECT_EQ((*c)->username, "user");
  EXPECT_EQ((*c)->password, "pass");
  auto p = CredentialsFor(json, "plain:5000", "config.json");
  ASSERT_TRUE(p.ok() && p->has_value());
  EXPECT_EQ((*p)->password, "p");
  auto t = CredentialsFor(json, "tok:5000", "config.json");
  ASSERT_TRUE(t.ok() && t->has_value());
  EXPECT_EQ((*t)->identity_token, "refresh");
  auto none = CredentialsFor(json, "nowhere:1", "config.json");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
}

TEST(AuthTest, AMalformedFileIsNamedButNeverQuoted) {
  auto bad_json = CredentialsFor("{\"auths\": {\"h\": {\"auth\": \"s3cret", "h", "/etc/cfg.json");
  ASSERT_FALSE(bad_json.ok());
  EXPECT_NE(bad_json.status().message().find("/etc/cfg.json"), std::string::npos);
  EXPECT_EQ(bad_json.status().message().find("s3cret"), std::string::npos);
  auto bad_auth = CredentialsFor(R"({"auths": {"h": {"auth": "bm9jb2xvbg=="}}})", "h", "cfg");  // "nocolon"
  ASSERT_FALSE(bad_auth.ok());
  EXPECT_NE(bad_auth.status().message().find("not base64 of user:password"), std::string::npos);
  EXPECT_EQ(bad_auth.status().message().find("nocolon"), std::string::npos);
}

TEST(AuthTest, ParsesBearerAndBasicChallenges) {
  auto b = ParseChallenge(
      R"(Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push")");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->scheme, "bearer");
  EXPECT_EQ(b->params["realm"], "https://auth.example/token");
  EXPECT_EQ(b->params["service"], "registry.example");
  EXPECT_EQ(b->params["scope"], "repository:a/b:pull,push");
  auto basic = ParseChallenge(R"(Basic realm="Registry Realm")");
  ASSERT_TRUE(basic.ok());
  EXPECT_EQ(basic->scheme, "basic");
  EXPECT_EQ(basic->params["realm"], "Registry Realm");
  EXPECT_FALSE(ParseChallenge("Bearer service=\"x\"").ok());
  EXPECT_FALSE(ParseChallenge("Bearer realm=\"unterminated").ok());
  EXPECT_FALSE(ParseChallenge("").ok());
}

}  // namespace
}  // namespace gpusnap::registry
