#include "rootfs/extract_plan.h"

#include <gtest/gtest.h>

namespace gpusnap::rootfs {
namespace {

ArchiveEntry Dir(std::string p) { return {std::move(p), FileKind::kDirectory, false, ""}; }
ArchiveEntry File(std::string p) { return {std::move(p), FileKind::kRegular, false, ""}; }
ArchiveEntry Sym(std::string p, std::string target) { return {std::move(p), FileKind::kSymlink, false, std::move(target)}; }
ArchiveEntry Hard(std::string p, std::string target) {
  return {std::move(p), FileKind::kRegular, true, std::move(target)};
}

// The refusal reasons, in order.
std::vector<std::string> Reasons(const ExtractionPlan& plan) {
  std::vector<std::string> out;
  for (const auto& r : plan.refused) out.push_back(r.reason);
  return out;
}

void ExpectOneRefusal(const std::vector<ArchiveEntry>& entries, const std::string& entry, const std::string& needle,
                      const std::vector<std::string>& deleted = {}) {
  ExtractionPlan plan = PlanExtraction(entries, deleted);
  ASSERT_EQ(plan.refused.size(), 1u) << ::testing::PrintToString(Reasons(plan));
  EXPECT_EQ(plan.refused[0].entry, entry);
  EXPECT_NE(plan.refused[0].reason.find(needle), std::string::npos) << plan.refused[0].reason;
  Status st = PlanStatus(plan, "rootfs-diff.tar");
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("`rootfs-diff.tar`: "), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("nothing was applied"), std::string::npos) << st.message();
}

TEST(RootfsNormalize, CleanRelativePaths) {
  EXPECT_EQ(*NormalizeArchivePath("./etc//app.conf"), "etc/app.conf");
  EXPECT_EQ(*NormalizeArchivePath("var/cache/"), "var/cache");
  EXPECT_EQ(*NormalizeArchivePath("a/./b"), "a/b");
  EXPECT_EQ(*NormalizeArchivePath("."), "");
  EXPECT_EQ(*NormalizeArchivePath("./"), "");
  EXPECT_EQ(NormalizeArchivePath("").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(NormalizeArchivePath("/etc/passwd").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(NormalizeArchivePath("a/../../b").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(NormalizeArchivePath("..").status().code(), Code::kInvalidArgument);
  // A name that merely starts with dots is a name.
  EXPECT_EQ(*NormalizeArchivePath("a/..b/..."), "a/..b/...");
}

TEST(RootfsPlan, AnOrdinaryDiffIsAcceptedLinksLast) {
  std::vector<ArchiveEntry> entries = {Dir("./"),          Dir("opt"),          Sym("opt/current", "/opt/v2"),
                                       Dir("opt/v2"),      File("opt/v2/bin"),  Hard("opt/v2/bin2", "opt/v2/bin"),
                                       File("etc/app.conf"), Sym("etc/alt", "../usr/share/alt")};
  ExtractionPlan plan = PlanExtraction(entries, {"/etc/old.conf", "/var/cache/apt"});
  EXPECT_TRUE(plan.refused.empty()) << ::testing::PrintToString(Reasons(plan));
  EXPECT_TRUE(PlanStatus(plan, "rootfs-diff.tar").ok());
  // The root entry is no step; files and directories in archive order, then
  // the symbolic links, then the hard links.
  EXPECT_EQ(plan.order, (std::vector<size_t>{1, 3, 4, 6, 2, 7, 5}));
  EXPECT_EQ(plan.normalized[0], "");
  EXPECT_EQ(plan.normalized[4], "opt/v2/bin");
  ASSERT_EQ(plan.entries.size(), entries.size());  // what the applier holds the archive to
  EXPECT_EQ(plan.entries[5].link_target, "opt/v2/bin");
  EXPECT_EQ(plan.deletions, (std::vector<std::string>{"etc/old.conf", "var/cache/apt"}));
}

TEST(RootfsPlan, AbsolutePathsAreRefused) {
  ExpectOneRefusal({File("etc/ok"), File("/etc/passwd")}, "/etc/passwd", "`/etc/passwd` is an absolute path");
}

TEST(RootfsPlan, DotDotComponentsAreRefused) {
  ExpectOneRefusal({File("a/../../etc/shadow"), File("b")}, "a/../../etc/shadow", "has a `..` component");
  ExpectOneRefusal({Dir("x"), File("x/..")}, "x/..", "has a `..` component");
}

TEST(RootfsPlan, AnEntryThroughASymlinkOfTheArchiveIsRefused) {
  // The classic escape: a link to the host's /etc, then a file written
  // through it. The order in the archive does not matter.
  ExpectOneRefusal({Sym("escape", "/etc"), File("escape/cron.d/evil")}, "escape/cron.d/evil",
                   "`escape/cron.d/evil` lies under `escape`, which the archive makes a symbolic link (to `/etc`)");
  ExpectOneRefusal({File("up/passwd"), Sym("up", "../../..")}, "up/passwd", "lies under `up`");
  // Through a relative link inside the root, too: the applier never follows one.
  ExpectOneRefusal({Dir("real"), Sym("alias", "real"), File("alias/f")}, "alias/f", "which the archive makes a symbolic link");
}

TEST(RootfsPlan, AnEntryUnderAFileIsRefused) {
  ExpectOneRefusal({File("a"), File("a/b")}, "a/b", "lies under `a`, which the archive makes a regular file");
  ExpectOneRefusal({File("t"), Hard("h", "t"), File("h/x")}, "h/x", "which the archive makes a hard link");
}

TEST(RootfsPlan, APathTwiceIsRefused) {
  ExpectOneRefusal({File("a"), Dir("b"), File("./a")}, "./a", "`./a` is in the archive twice (entries 1 and 3)");
  ExpectOneRefusal({Dir("."), Dir("./")}, "./", "twice");
}

TEST(RootfsPlan, KindsADiffNeverHoldsAreRefused) {
  ExpectOneRefusal({{"dev/evil", FileKind::kCharDevice, false, ""}}, "dev/evil", "`dev/evil` is a character device");
  ExpectOneRefusal({{"dev/sda9", FileKind::kBlockDevice, false, ""}}, "dev/sda9", "block device");
  ExpectOneRefusal({{"run/fifo", FileKind::kFifo, false, ""}}, "run/fifo", "FIFO");
  ExpectOneRefusal({Sym(".", "/")}, ".", "would make the root a symbolic link");
}

TEST(RootfsPlan, HardLinksNeedAnEarlierAcceptedNonDirectoryTarget) {
  ExpectOneRefusal({Hard("h", "t"), File("t")}, "h", "hard link `h` points at `t`, which no earlier entry");
  ExpectOneRefusal({Hard("h", "/etc/shadow")}, "h", "`/etc/shadow` is an absolute path");
  ExpectOneRefusal({Hard("h", "../outside")}, "h", "has a `..` component");
  ExpectOneRefusal({Dir("d"), Hard("h", "d")}, "h", "points at `d`, a directory");
  ExpectOneRefusal({Hard("h", "nowhere")}, "h", "which no earlier entry");
  // A target refused for its own sake takes its links with it.
  ExtractionPlan plan = PlanExtraction({Sym("l", "/etc"), File("l/x"), Hard("h", "l/x")});
  ASSERT_EQ(plan.refused.size(), 2u);
  EXPECT_EQ(plan.refused[1].entry, "h");
  EXPECT_NE(plan.refused[1].reason.find("which is refused"), std::string::npos) << plan.refused[1].reason;
  // A hard link to a symbolic link is a link to the link: accepted.
  plan = PlanExtraction({Sym("l", "/etc"), Hard("h", "l")});
  EXPECT_TRUE(plan.refused.empty()) << ::testing::PrintToString(Reasons(plan));
  EXPECT_EQ(plan.order, (std::vector<size_t>{0, 1}));
}

TEST(RootfsPlan, DeletionsNeverTheRootNorThroughALink) {
  ExpectOneRefusal({}, "/", "deleted path `/` is the root", {"/"});
  ExpectOneRefusal({}, "/a/../..", "deleted path `/a/../..` has a `..` component", {"/a/../.."});
  ExpectOneRefusal({Sym("data", "/var/lib")}, "/data/db", "deleted path `/data/db` lies under `data`", {"/data/db"});
  ExtractionPlan plan = PlanExtraction({Dir("d")}, {"/d/x", "relative/too"});
  EXPECT_TRUE(plan.refused.empty()) << ::testing::PrintToString(Reasons(plan));
  EXPECT_EQ(plan.deletions, (std::vector<std::string>{"d/x", "relative/too"}));
}

TEST(RootfsPlan, EveryRefusalIsListedTheFirstNamedInTheStatus) {
  ExtractionPlan plan = PlanExtraction({File("/abs"), File("ok"), File("../up"), Sym("s", "/"), File("s/x")}, {"/"});
  EXPECT_EQ(plan.refused.size(), 4u) << ::testing::PrintToString(Reasons(plan));
  EXPECT_EQ(plan.order, (std::vector<size_t>{1, 3}));
  Status st = PlanStatus(plan, "rootfs-diff.tar");
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("`/abs` is an absolute path; also refused: `../up`, `s/x`, `/`; nothing was applied"),
            std::string::npos)
      << st.message();
  ExtractionPlan many = PlanExtraction({File("/a"), File("/b"), File("/c"), File("/d"), File("/e"), File("/f")});
  EXPECT_NE(PlanStatus(many, "x.tar").message().find("also refused: `/b`, `/c`, `/d` and 2 more; nothing was applied"),
            std::string::npos)
      << PlanStatus(many, "x.tar").message();
}

}  // namespace
}  // namespace gpusnap::rootfs
