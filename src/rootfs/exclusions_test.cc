#include "rootfs/exclusions.h"

#include <gtest/gtest.h>

namespace gpusnap::rootfs {
namespace {

PathMatcher M(const std::vector<std::string>& patterns) {
  auto m = PathMatcher::Make(patterns);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? *m : PathMatcher();
}

TEST(RootfsExclusions, APathExcludesItselfAndWhatIsUnderIt) {
  PathMatcher m = M({"/tmp"});
  EXPECT_TRUE(m.Excludes("/tmp"));
  EXPECT_TRUE(m.Excludes("/tmp/a"));
  EXPECT_TRUE(m.Excludes("/tmp/a/b/"));
  EXPECT_FALSE(m.Excludes("/tmpfile"));
  EXPECT_FALSE(m.Excludes("/var/tmp"));
  EXPECT_FALSE(m.Excludes("/"));
}

TEST(RootfsExclusions, AStarStaysInsideOneComponent) {
  PathMatcher m = M({"/root/.cache/*.lock"});
  EXPECT_TRUE(m.Excludes("/root/.cache/x.lock"));
  EXPECT_TRUE(m.Excludes("/root/.cache/.hidden.lock"));
  EXPECT_TRUE(m.Excludes("/root/.cache/x.lock/inner"));
  EXPECT_FALSE(m.Excludes("/root/.cache/d/x.lock"));
  EXPECT_FALSE(m.Excludes("/root/.cache"));
  PathMatcher q = M({"/var/log/app-?.txt", "/opt/[ab]*"});
  EXPECT_TRUE(q.Excludes("/var/log/app-1.txt"));
  EXPECT_FALSE(q.Excludes("/var/log/app-12.txt"));
  EXPECT_TRUE(q.Excludes("/opt/bin"));
  EXPECT_FALSE(q.Excludes("/opt/cbin"));
}

TEST(RootfsExclusions, DoubleStarSpansAnyNumberOfComponents) {
  PathMatcher m = M({"/**/__pycache__"});
  EXPECT_TRUE(m.Excludes("/__pycache__"));
  EXPECT_TRUE(m.Excludes("/usr/lib/python3/x/__pycache__"));
  EXPECT_TRUE(m.Excludes("/usr/lib/python3/x/__pycache__/m.pyc"));
  EXPECT_FALSE(m.Excludes("/usr/lib/python3/x/m.py"));
  PathMatcher logs = M({"/var/log/**/*.log"});
  EXPECT_TRUE(logs.Excludes("/var/log/a.log"));
  EXPECT_TRUE(logs.Excludes("/var/log/nginx/access.log"));
  EXPECT_FALSE(logs.Excludes("/var/log/nginx/access.txt"));
  EXPECT_FALSE(logs.Excludes("/var/a.log"));
}

TEST(RootfsExclusions, TheFirstMatchingPatternIsNamed) {
  PathMatcher m = M({"/a/b", "/a"});
  EXPECT_EQ(m.Match("/a/b/c"), "/a/b");
  EXPECT_EQ(m.Match("/a/c"), "/a");
  EXPECT_EQ(m.Match("/c"), std::nullopt);
  EXPECT_EQ(M({}).Match("/anything"), std::nullopt);
}

TEST(RootfsExclusions, PatternsThatCannotMeanAPathAreRefused) {
  for (std::string bad : {"", "tmp", "/", "//", "/**", "/**/**", "/a/../b", "/a/./b", "/a**b"}) {
    auto m = PathMatcher::Make({"/ok", bad});
    ASSERT_FALSE(m.ok()) << "`" << bad << "`";
    EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
    EXPECT_NE(m.status().message().find("`" + bad + "`"), std::string::npos) << m.status().message();
  }
}

TEST(RootfsExclusions, TheDefaultsLeaveOutWhatTheRuntimeProvides) {
  auto m = PathMatcher::Make(DefaultExclusions());
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->Excludes("/etc/hosts"));
  EXPECT_TRUE(m->Excludes("/etc/resolv.conf"));
  EXPECT_TRUE(m->Excludes("/var/run/secrets/kubernetes.io/serviceaccount/token"));
  EXPECT_TRUE(m->Excludes("/dev/shm"));
  EXPECT_FALSE(m->Excludes("/etc/app.conf"));
  EXPECT_FALSE(m->Excludes("/root/.cache/huggingface/hub/model.bin"));
}

TEST(RootfsPaths, AtOrUnderGoesByWholeComponents) {
  EXPECT_TRUE(IsAtOrUnder("/a", "/a"));
  EXPECT_TRUE(IsAtOrUnder("/a/b/c", "/a"));
  EXPECT_FALSE(IsAtOrUnder("/ab", "/a"));
  EXPECT_FALSE(IsAtOrUnder("/a", "/a/b"));
  EXPECT_TRUE(IsAtOrUnder("/x", "/"));
  EXPECT_TRUE(IsAtOrUnder("/", "/"));
  EXPECT_FALSE(IsAtOrUnder("", "/"));
}

}  // namespace
}  // namespace gpusnap::rootfs
