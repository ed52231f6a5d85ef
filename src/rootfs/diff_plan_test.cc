#include "rootfs/diff_plan.h"

#include <gtest/gtest.h>

namespace gpusnap::rootfs {
namespace {

UpperEntry E(std::string path, FileKind kind, uint64_t size = 0, std::map<std::string, std::string> xattrs = {}) {
  UpperEntry e;
  e.path = std::move(path);
  e.kind = kind;
  e.size = size;
  e.xattrs = std::move(xattrs);
  return e;
}

UpperEntry Whiteout(std::string path) { return E(std::move(path), FileKind::kCharDevice); }

PathMatcher Excluding(const std::vector<std::string>& patterns) {
  auto m = PathMatcher::Make(patterns);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? *m : PathMatcher();
}

// A writable layer after a first start: a download, a compile cache, a
// deleted file, a re-made directory, a socket.
UpperTree FirstStart() {
  UpperTree t;
  t.entries = {E("root", FileKind::kDirectory),
               E("root/.cache", FileKind::kDirectory),
               E("root/.cache/model.bin", FileKind::kRegular, 4096),
               E("etc", FileKind::kDirectory),
               Whiteout("etc/motd"),
               E("etc/hosts", FileKind::kRegular, 0),
               E("var", FileKind::kDirectory),
               E("var/cache", FileKind::kDirectory, 0, {{"trusted.overlay.opaque", "y"}}),
               E("var/cache/fresh", FileKind::kRegular, 10),
               E("run", FileKind::kDirectory),
               E("run/app.sock", FileKind::kSocket),
               E("usr", FileKind::kDirectory),
               E("usr/lib", FileKind::kDirectory),
               E("usr/lib/libx.so", FileKind::kSymlink)};
  t.children = {{"var/cache", {"fresh"}}};
  return t;
}

TEST(RootfsDiffPlan, WhatGoesWhere) {
  UpperTree t = FirstStart();
  EXPECT_EQ(OpaqueDirectories(t), (std::vector<std::string>{"var/cache"}));
  auto plan = DiffPlanOf(t, Excluding({"/etc/hosts"}), {{"var/cache", {"fresh", "apt", "debconf"}}});
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  std::vector<std::string> archived;
  for (size_t i : plan->archived) archived.push_back(t.entries[i].path);
  EXPECT_EQ(archived, (std::vector<std::string>{"root", "root/.cache", "root/.cache/model.bin", "etc", "var",
                                                "var/cache", "var/cache/fresh", "run", "usr", "usr/lib",
                                                "usr/lib/libx.so"}));
  EXPECT_EQ(plan->deleted, (std::vector<std::string>{"/etc/motd", "/var/cache/apt", "/var/cache/debconf"}));
  EXPECT_EQ(plan->excluded, (std::vector<std::string>{"/etc/hosts"}));
  EXPECT_EQ(plan->opaque, (std::vector<std::string>{"/var/cache"}));
  ASSERT_EQ(plan->skipped.size(), 1u);
  EXPECT_EQ(plan->skipped[0].path, "/run/app.sock");
  EXPECT_EQ(plan->archived_bytes, 4106u);
}

TEST(RootfsDiffPlan, AnExcludedDirectoryIsListedOnceAndTakesItsWhiteoutsAlong) {
  UpperTree t;
  t.entries = {E("tmp", FileKind::kDirectory), E("tmp/a", FileKind::kRegular, 7), Whiteout("tmp/gone"),
               E("keep", FileKind::kRegular, 1)};
  auto plan = DiffPlanOf(t, Excluding({"/tmp"}));
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->excluded, (std::vector<std::string>{"/tmp"}));
  EXPECT_TRUE(plan->deleted.empty());
  ASSERT_EQ(plan->archived.size(), 1u);
  EXPECT_EQ(t.entries[plan->archived[0]].path, "keep");
}

TEST(RootfsDiffPlan, ARefusedEntryFailsThePlanUnlessExcluded) {
  UpperTree t;
  UpperEntry dev = E("dev2/tty9", FileKind::kCharDevice);
  dev.rdev_major = 4;
  dev.rdev_minor = 9;
  t.entries = {dev, E("bin/tool", FileKind::kRegular, 3, {{"trusted.overlay.metacopy", ""}})};
  auto plan = DiffPlanOf(t, PathMatcher());
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(plan.status().message().find("`/dev2/tty9` is a character device (4:9)"), std::string::npos)
      << plan.status().message();
  EXPECT_NE(plan.status().message().find("1 more entries are refused"), std::string::npos) << plan.status().message();
  auto excluded = DiffPlanOf(t, Excluding({"/dev2", "/bin/tool"}));
  ASSERT_TRUE(excluded.ok()) << excluded.status().ToString();
  EXPECT_TRUE(excluded->archived.empty());
}

TEST(RootfsDiffPlan, TheStoreMustHoldIt) {
  EXPECT_TRUE(CheckFits(100, 300, 200, "/store").ok());
  Status st = CheckFits(101, 300, 200, "/store");
  EXPECT_EQ(st.code(), Code::kFailedPrecondition);
  EXPECT_NE(st.message().find("needs 101 bytes in `/store`, which has 300 free (200 kept in reserve)"),
            std::string::npos)
      << st.message();
  EXPECT_FALSE(CheckFits(0, 10, 20, "/store").ok());
}

TEST(RootfsDiffPlan, TheArchiveBoundCoversHeadersAndData) {
  UpperTree t = FirstStart();
  auto plan = DiffPlanOf(t, PathMatcher());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  uint64_t bound = ArchiveBytesBound(t, *plan);
  // The data rounded to blocks, and at least one header block per entry.
  EXPECT_GE(bound, 4096u + 512u + plan->archived.size() * 512u + 1024u);
  EXPECT_EQ(bound % 512, 0u);
}

TEST(RootfsDiffPlan, ACachePlanKeepsWhatACacheHolds) {
  UpperTree t;
  t.entries = {E("models", FileKind::kDirectory), E("models/w.bin", FileKind::kRegular, 100),
               E("models/lock", FileKind::kFifo), E("models/latest", FileKind::kSymlink)};
  t.excluded = {"/root/.triton/tmp"};
  auto plan = CachePlanOf(t, "/root/.triton");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ(plan->archived, (std::vector<size_t>{0, 1, 3}));
  EXPECT_EQ(plan->archived_bytes, 100u);
  ASSERT_EQ(plan->skipped.size(), 1u);
  EXPECT_EQ(plan->skipped[0].path, "/root/.triton/models/lock");
  EXPECT_EQ(plan->excluded, t.excluded);
  EXPECT_TRUE(plan->deleted.empty());
  EXPECT_GE(ArchiveBytesBound(t, *plan), 512u + 3 * 512u + 1024u);

  // A 0/0 device is no whiteout in a cache: refused, like any device.
  t.entries.push_back(Whiteout("models/old"));
  t.entries.push_back(E("models/dev", FileKind::kBlockDevice));
  auto refused = CachePlanOf(t, "/root/.triton");
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("the cache `/root/.triton` cannot be captured: `/root/.triton/models/old` "
                                            "is a character device (0:0)"),
            std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("1 more entries are refused"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap::rootfs
