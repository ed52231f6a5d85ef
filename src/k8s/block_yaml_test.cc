// The YAML subset kubeconfig files use: each construct, and each refusal.
#include "k8s/block_yaml.h"

#include <gtest/gtest.h>

namespace gpusnap::k8s {
namespace {

using nlohmann::json;

json Parse(std::string_view text) {
  auto r = ParseBlockYaml(text);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : json();
}

std::string Refusal(std::string_view text) {
  auto r = ParseBlockYaml(text);
  EXPECT_FALSE(r.ok()) << "accepted: " << (r.ok() ? r->dump() : "");
  return r.ok() ? "" : r.status().message();
}

TEST(BlockYaml, KubectlLayout) {
  // As `kubectl config view --raw` writes it: sequences at their key's indentation.
  json j = Parse(R"(apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: TFMwdA==
    server: https://10.0.0.1:6443
  name: prod
contexts:
- context:
    cluster: prod
    user: admin
  name: prod
current-context: prod
kind: Config
preferences: {}
users:
- name: admin
  user:
    token: abc.def
)");
  EXPECT_EQ(j["clusters"][0]["cluster"]["server"], "https://10.0.0.1:6443");
  EXPECT_EQ(j["clusters"][0]["name"], "prod");
  EXPECT_EQ(j["contexts"][0]["context"]["user"], "admin");
  EXPECT_EQ(j["preferences"], json::object());
  EXPECT_EQ(j["users"][0]["user"]["token"], "abc.def");
  EXPECT_EQ(j["current-context"], "prod");
}

TEST(BlockYaml, IndentedSequencesAndNestedItems) {
  json j = Parse(R"(
list:
  - a
  -   b: 1
      c: 2
  -
    d: 3
  - - x
    - y
)");
  EXPECT_EQ(j["list"][0], "a");
  EXPECT_EQ(j["list"][1], json({{"b", "1"}, {"c", "2"}}));
  EXPECT_EQ(j["list"][2], json({{"d", "3"}}));
  EXPECT_EQ(j["list"][3], json({"x", "y"}));
}

TEST(BlockYaml, ScalarsStayStrings) {
  json j = Parse("port: 6443\nflag: true\nnothing:\nnull-word: null\nempty: []\n");
  EXPECT_EQ(j["port"], "6443");
  EXPECT_EQ(j["flag"], "true");
  EXPECT_TRUE(j["nothing"].is_null());
  EXPECT_EQ(j["null-word"], "null");
  EXPECT_EQ(j["empty"], json::array());
}

TEST(BlockYaml, QuotedScalarsAndKeys) {
  json j = Parse(R"(a: "x: y # not a comment"
b: 'it''s'
"c d": "tab\there \"q\" \u00e9"
'e': plain: with colon
url: https://host:6443/path
)");
  EXPECT_EQ(j["a"], "x: y # not a comment");
  EXPECT_EQ(j["b"], "it's");
  EXPECT_EQ(j["c d"], "tab\there \"q\" \xc3\xa9");
  EXPECT_EQ(j["e"], "plain: with colon");
  EXPECT_EQ(j["url"], "https://host:6443/path");
}

TEST(BlockYaml, CommentsAndDocumentMarkers) {
  json j = Parse("# a kubeconfig\n---\nkey: value # said\n# between\nother: 'v' # too\n...\n");
  EXPECT_EQ(j, json({{"key", "value"}, {"other", "v"}}));
}

TEST(BlockYaml, JsonIsJson) {
  json j = Parse("  {\"clusters\": [{\"name\": \"x\"}], \"n\": 1}");
  EXPECT_EQ(j["clusters"][0]["name"], "x");
  EXPECT_EQ(j["n"], 1);
  EXPECT_NE(Refusal("{not json"), "");
}

TEST(BlockYaml, EmptyTextIsNull) { EXPECT_TRUE(Parse("# nothing\n\n").is_null()); }

TEST(BlockYaml, TabIndentationIsRefused) {
  EXPECT_NE(Refusal("a:\n\tb: c\n").find("line 2: a tab"), std::string::npos);
}

TEST(BlockYaml, BlockScalarIsRefused) {
  EXPECT_NE(Refusal("a: |\n  text\n").find("block scalars"), std::string::npos);
}

TEST(BlockYaml, FlowCollectionWithContentIsRefused) {
  EXPECT_NE(Refusal("a: {b: c}\n").find("flow collections"), std::string::npos);
}

TEST(BlockYaml, AnchorsAreRefused) { EXPECT_NE(Refusal("a: &x b\n").find("anchors"), std::string::npos); }

TEST(BlockYaml, DuplicateKeyIsRefused) {
  EXPECT_NE(Refusal("a: 1\nb: 2\na: 3\n").find("line 3: the key `a` appears twice"), std::string::npos);
}

TEST(BlockYaml, SecondDocumentIsRefused) {
  EXPECT_NE(Refusal("a: 1\n---\nb: 2\n").find("second document"), std::string::npos);
}

TEST(BlockYaml, ValueWithNestedLinesIsRefused) {
  EXPECT_NE(Refusal("a: 1\n  b: 2\n").find("line 2: indented under a value"), std::string::npos);
}

TEST(BlockYaml, TextThatIsNoEntryIsRefused) {
  EXPECT_NE(Refusal("a:\n  b: 1\n  just text\n").find("line 3: expected `key: value`"), std::string::npos);
}

TEST(BlockYaml, UnterminatedQuoteIsRefused) {
  EXPECT_NE(Refusal("a: \"open\n").find("unterminated"), std::string::npos);
}

TEST(BlockYaml, DedentBelowTheDocumentIsRefused) {
  EXPECT_NE(Refusal("  a: 1\nb: 2\n").find("line 2"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap::k8s
