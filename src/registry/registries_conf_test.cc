// registries.conf: what is read and what is refused, and the places a pull
// reads a reference from (registries_conf.h).
#include "registry/registries_conf.h"

#include <gtest/gtest.h>

namespace gpusnap::registry {
namespace {

constexpr const char* kDigest = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

Reference Ref(const std::string& text) { return ParseRegistryReference(text).value(); }

RegistriesConf Conf(const std::string& toml) {
  auto conf = ParseRegistriesConf(toml, "r.conf");
  EXPECT_TRUE(conf.ok()) << conf.status().message();
  return conf.ok() ? *conf : RegistriesConf{};
}

// The places, each as "host/repository[:tag|@digest]", "+plain" when insecure.
std::vector<std::string> Places(const RegistriesConf& conf, const std::string& ref) {
  auto sources = SourcesFor(conf, Ref(ref));
  EXPECT_TRUE(sources.ok()) << sources.status().message();
  std::vector<std::string> out;
  if (!sources.ok()) return out;
  for (const PullSource& s : *sources)
    out.push_back((s.mirror ? "mirror " : "") + s.reference.ToString() + (s.insecure ? " +plain" : ""));
  return out;
}

std::string Refusal(const std::string& toml) {
  auto conf = ParseRegistriesConf(toml, "r.conf");
  EXPECT_FALSE(conf.ok()) << toml;
  if (conf.ok()) return "";
  EXPECT_EQ(conf.status().code(), Code::kInvalidArgument);
  EXPECT_NE(conf.status().message().find("registries.conf `r.conf`"), std::string::npos) << conf.status().message();
  return conf.status().message();
}

TEST(RegistriesConf, ReadsRegistriesAndTheirMirrorsAndLeavesShortNamesAlone) {
  RegistriesConf c = Conf(R"(
unqualified-search-registries = ["docker.io"]
short-name-mode = "enforcing"
credential-helpers = ["containers-auth.json"]

[aliases]
"fedora" = "registry.fedoraproject.org/fedora"

[[registry]]
prefix = "reg.example:5000/team"
location = "reg.example:5000/team"
insecure = true

[[registry.mirror]]
location = "cache.local:5001/team"
pull-from-mirror = "digest-only"

[[registry.mirror]]
location = "peer.local"
insecure = true

[[registry]]
location = "blocked.example"
blocked = true
)");
  ASSERT_EQ(c.registries.size(), 2u);
  EXPECT_EQ(c.source, "r.conf");
  const RegistryEntry& team = c.registries[0];
  EXPECT_EQ(team.prefix, "reg.example:5000/team");
  EXPECT_TRUE(team.insecure);
  EXPECT_FALSE(team.blocked);
  EXPECT_EQ(team.line, 9);
  ASSERT_EQ(team.mirrors.size(), 2u);
  EXPECT_EQ(team.mirrors[0].location, "cache.local:5001/team");
  EXPECT_EQ(team.mirrors[0].use, MirrorUse::kDigestOnly);
  EXPECT_FALSE(team.mirrors[0].insecure);
  EXPECT_EQ(team.mirrors[1].use, MirrorUse::kAll);
  EXPECT_TRUE(team.mirrors[1].insecure);
  // No prefix: the location is the prefix.
  EXPECT_EQ(c.registries[1].prefix, "blocked.example");
  EXPECT_TRUE(c.registries[1].blocked);
  EXPECT_TRUE(Conf("").registries.empty());
}

TEST(RegistriesConf, MirrorByDigestOnlyMakesEveryMirrorDigestOnly) {
  RegistriesConf c = Conf(R"(
[[registry]]
location = "reg.example"
mirror-by-digest-only = true
mirror = [{location = "a.local"}, {location = "b.local"}]
)");
  ASSERT_EQ(c.registries[0].mirrors.size(), 2u);
  for (const auto& m : c.registries[0].mirrors) EXPECT_EQ(m.use, MirrorUse::kDigestOnly);
  EXPECT_NE(Refusal(R"(
[[registry]]
location = "reg.example"
mirror-by-digest-only = true
[[registry.mirror]]
location = "a.local"
pull-from-mirror = "all"
)").find("`pull-from-mirror` cannot be set"), std::string::npos);
}

TEST(RegistriesConf, RefusesWhatItDoesNotReadNamingTheFileTheTableAndTheKey) {
  struct Case {
    std::string toml, says;
  };
  for (const Case& c : std::vector<Case>{
           {"mirrors = 1\n", "line 1: unknown key `mirrors`"},
           {"[registries.search]\nregistries = [\"docker.io\"]\n", "the version 1 format is not read"},
           {"registry = 3\n", "`registry` must be an array of tables"},
           {"[[registry]]\nlocation = \"r.example\"\nmirrors = []\n", "[[registry]] 1 (line 1): unknown key `mirrors`"},
           {"[[registry]]\nlocation = \"r.example\"\ninsecure = \"yes\"\n", "`insecure` must be true or false"},
           {"[[registry]]\nlocation = 5\n", "`location` must be a string"},
           {"[[registry]]\ninsecure = true\n", "it needs a `prefix` or a `location`"},
           {"[[registry]]\nlocation = \"r.example\"\n[[registry.mirror]]\ninsecure = true\n",
            "mirror 1 (line 3): a mirror needs a `location`"},
           {"[[registry]]\nlocation = \"r.example\"\n[[registry.mirror]]\nlocation = \"m.local\"\nauth = \"x\"\n",
            "unknown key `auth`"},
           {"[[registry]]\nlocation = \"r.example\"\n[[registry.mirror]]\nlocation = \"m.local\"\n"
            "pull-from-mirror = \"sometimes\"\n",
            "`pull-from-mirror` is `sometimes`, not all, digest-only or tag-only"},
           {"[[registry]]\nprefix = \"example.*.com\"\nlocation = \"r.example\"\n", "`prefix` `example.*.com` is not"},
           {"[[registry]]\nprefix = \"*.example.com/foo\"\n", "`prefix` `*.example.com/foo` is not *.domain"},
           {"[[registry]]\nprefix = \"*.example.com\"\nlocation = \"*.other.com\"\n", "`location` `*.other.com` is not"},
           {"[[registry]]\nlocation = \"https://r.example\"\n", "`location` `https://r.example` is not"},
           {"[[registry]]\nlocation = \"R.example/Team\"\n", "is not host[:port][/namespace...]"},
           {"[[registry]]\nlocation = \"r.example\"\n[[registry]]\nprefix = \"r.example\"\nlocation = \"s.example\"\n",
            "[[registry]] 2 (line 3): prefix `r.example` is given already at line 1"},
           {"[[registry]\nlocation = \"r.example\"\n", "line 1: "},
       }) {
    std::string message = Refusal(c.toml);
    EXPECT_NE(message.find(c.says), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(SourcesFor, WithoutARegistryForItTheReferenceAlone) {
  EXPECT_EQ(Places(RegistriesConf{}, "reg.example/team/snap:v1"), std::vector<std::string>{"reg.example/team/snap:v1"});
  RegistriesConf c = Conf("[[registry]]\nlocation = \"other.example\"\nmirror = [{location = \"m.local\"}]\n");
  EXPECT_EQ(Places(c, "reg.example/team/snap:v1"), std::vector<std::string>{"reg.example/team/snap:v1"});
}

TEST(SourcesFor, MirrorsInOrderThenThePrimaryEachWithThePathAfterThePrefix) {
  RegistriesConf c = Conf(R"(
[[registry]]
prefix = "reg.example:5000/team"
location = "internal.example/mirror-of-team"
[[registry.mirror]]
location = "cache.local:5001/team-cache"
insecure = true
[[registry.mirror]]
location = "peer.local"
)");
  EXPECT_EQ(Places(c, "reg.example:5000/team/llm/snap:v1"),
            (std::vector<std::string>{"mirror cache.local:5001/team-cache/llm/snap:v1 +plain",
                                      "mirror peer.local/llm/snap:v1", "internal.example/mirror-of-team/llm/snap:v1"}));
  EXPECT_EQ(Places(c, std::string("reg.example:5000/team/snap@") + kDigest),
            (std::vector<std::string>{"mirror cache.local:5001/team-cache/snap@" + std::string(kDigest) + " +plain",
                                      "mirror peer.local/snap@" + std::string(kDigest),
                                      "internal.example/mirror-of-team/snap@" + std::string(kDigest)}));
}

TEST(SourcesFor, DigestOnlyMirrorsServeReferencesByDigestTagOnlyByTag) {
  RegistriesConf c = Conf(R"(
[[registry]]
location = "reg.example"
[[registry.mirror]]
location = "digests.local"
pull-from-mirror = "digest-only"
[[registry.mirror]]
location = "tags.local"
pull-from-mirror = "tag-only"
)");
  EXPECT_EQ(Places(c, "reg.example/team/snap:v1"),
            (std::vector<std::string>{"mirror tags.local/team/snap:v1", "reg.example/team/snap:v1"}));
  std::string by_digest = std::string("reg.example/team/snap@") + kDigest;
  EXPECT_EQ(Places(c, by_digest), (std::vector<std::string>{"mirror digests.local/team/snap@" + std::string(kDigest),
                                                            by_digest}));
}

TEST(SourcesFor, TheLongestPrefixHoldingTheReferenceWins) {
  RegistriesConf c = Conf(R"(
[[registry]]
location = "reg.example"
mirror = [{location = "host.local"}]
[[registry]]
prefix = "reg.example/team/snap"
location = "reg.example/team/snap"
mirror = [{location = "snap.local/s"}]
[[registry]]
prefix = "reg.example/team"
location = "reg.example/team"
mirror = [{location = "team.local/t"}]
[[registry]]
prefix = "reg.example/team/snap:v2"
location = "reg.example/team/snap:v2"
mirror = [{location = "tag.local/v:two"}]
)");
  EXPECT_EQ(Places(c, "reg.example/team/snap:v1")[0], "mirror snap.local/s:v1");
  EXPECT_EQ(Places(c, "reg.example/team/snap:v2")[0], "mirror tag.local/v:two");
  EXPECT_EQ(Places(c, "reg.example/team/other:v1")[0], "mirror team.local/t/other:v1");
  // A prefix holds a reference only at a boundary: `team` does not hold `teams`.
  EXPECT_EQ(Places(c, "reg.example/teams/x:v1")[0], "mirror host.local/teams/x:v1");
  EXPECT_EQ(Places(c, "reg.example/team/snapshot:v1")[0], "mirror team.local/t/snapshot:v1");
  // A host does not hold the same name on another port.
  EXPECT_EQ(Places(c, "reg.example:5000/team/snap:v1"), std::vector<std::string>{"reg.example:5000/team/snap:v1"});
}

TEST(SourcesFor, AWildcardHoldsEveryHostUnderItsDomain) {
  RegistriesConf c = Conf(R"(
[[registry]]
prefix = "*.example.com"
insecure = true
mirror = [{location = "cache.local/all"}]
)");
  EXPECT_EQ(Places(c, "a.example.com/team/snap:v1"),
            (std::vector<std::string>{"mirror cache.local/all/team/snap:v1", "a.example.com/team/snap:v1 +plain"}));
  EXPECT_EQ(Places(c, "b.a.example.com:5000/snap:v1"),
            (std::vector<std::string>{"mirror cache.local/all/snap:v1", "b.a.example.com:5000/snap:v1 +plain"}));
  for (const char* outside : {"example.com/snap:v1", "notexample.com/snap:v1", "example.com.evil/snap:v1"})
    EXPECT_EQ(Places(c, outside).size(), 1u) << outside;
}

TEST(SourcesFor, ABlockedPrefixRefusesThePull) {
  RegistriesConf c = Conf("[[registry]]\nprefix = \"reg.example/secret\"\nlocation = \"reg.example/secret\"\n"
                          "blocked = true\nmirror = [{location = \"m.local\"}]\n");
  auto sources = SourcesFor(c, Ref("reg.example/secret/snap:v1"));
  ASSERT_FALSE(sources.ok());
  EXPECT_EQ(sources.status().code(), Code::kPermissionDenied);
  EXPECT_EQ(sources.status().message(),
            "`reg.example/secret/snap:v1` is blocked by registries.conf `r.conf`, [[registry]] prefix "
            "`reg.example/secret` (line 1)");
  EXPECT_EQ(Places(c, "reg.example/open/snap:v1").size(), 1u);
}

TEST(SourcesFor, DescribesMirrorsAsSuch) {
  PullSource mirror{Ref("m.local:5001/team/snap:v1"), false, true};
  PullSource primary{Ref("reg.example/team/snap:v1"), false, false};
  EXPECT_EQ(mirror.Describe(), "mirror `m.local:5001/team/snap`");
  EXPECT_EQ(primary.Describe(), "`reg.example/team/snap`");
}

}  // namespace
}  // namespace gpusnap::registry
