#include "util/files.h"
#include "util/temp_dir_testing.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gpusnap {
namespace {

class MakeDirsTest : public ::testing::Test {
 protected:
  TempDir tmp_{"files-test"};
  void SetUp() override {
    root_ = tmp_.path();
  }

  // The permission bits of `path` (-1 when it cannot be stat'ed).
  static int ModeOf(const std::string& path) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) return -1;
    return static_cast<int>(st.st_mode & 07777);
  }

  // MakeDirs under a given umask, the old one restored before returning.
  static Status MakeDirsUnder(mode_t mask, const std::string& path, int mode) {
    mode_t old = ::umask(mask);
    Status st = MakeDirs(path, mode);
    ::umask(old);
    return st;
  }

  std::string root_;
};

TEST_F(MakeDirsTest, EveryCreatedDirectoryGetsTheModeAskedFor) {
  ASSERT_TRUE(MakeDirsUnder(022, root_ + "/a/b/c", 0700).ok());
  EXPECT_EQ(ModeOf(root_ + "/a"), 0700);
  EXPECT_EQ(ModeOf(root_ + "/a/b"), 0700);
  EXPECT_EQ(ModeOf(root_ + "/a/b/c"), 0700);
}

TEST_F(MakeDirsTest, TheUmaskDoesNotNarrowTheMode) {
  ASSERT_TRUE(MakeDirsUnder(077, root_ + "/shared/logs", 0755).ok());
  EXPECT_EQ(ModeOf(root_ + "/shared"), 0755);
  EXPECT_EQ(ModeOf(root_ + "/shared/logs"), 0755);
}

TEST_F(MakeDirsTest, ExistingDirectoriesKeepTheirMode) {
  ASSERT_EQ(::mkdir((root_ + "/kept").c_str(), 0700), 0);
  ASSERT_EQ(::chmod((root_ + "/kept").c_str(), 0750), 0);
  ASSERT_TRUE(MakeDirsUnder(022, root_ + "/kept/new/", 0711).ok());
  EXPECT_EQ(ModeOf(root_ + "/kept"), 0750);
  EXPECT_EQ(ModeOf(root_ + "/kept/new"), 0711);
  // Again: everything exists now, nothing changes.
  ASSERT_TRUE(MakeDirsUnder(022, root_ + "/kept/new", 0755).ok());
  EXPECT_EQ(ModeOf(root_ + "/kept/new"), 0711);
}

TEST_F(MakeDirsTest, AFileInTheWayIsAnErrorNamingIt) {
  ASSERT_TRUE(WriteFileSynced(root_ + "/file", "x").ok());
  Status st = MakeDirs(root_ + "/file/sub", 0755);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.sys_errno(), ENOTDIR);
  EXPECT_NE(st.message().find("`" + root_ + "/file`"), std::string::npos) << st.message();
  EXPECT_EQ(ModeOf(root_ + "/file/sub"), -1);
}

TEST_F(MakeDirsTest, AnEmptyPathIsRefused) {
  Status st = MakeDirs("", 0755);
  EXPECT_EQ(st.code(), Code::kInvalidArgument) << st.message();
}

TEST(IsOwnerOnly, NoGroupOrOtherBits) {
  EXPECT_TRUE(IsOwnerOnly(0600));
  EXPECT_TRUE(IsOwnerOnly(0400));
  EXPECT_FALSE(IsOwnerOnly(0640));
  EXPECT_FALSE(IsOwnerOnly(0604));
}

TEST(ReadOwnerOnlyFile, AFileOverItsBoundIsRefusedWithoutItsContent) {
  TempDir dir("owner-only");
  std::string path = dir.path() + "/secret";
  ASSERT_TRUE(WriteFileSynced(path, std::string(2048, 'k')).ok());
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_TRUE(ReadOwnerOnlyFile(path, "--key").ok());
  auto big = ReadOwnerOnlyFile(path, "--key", 1024);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("larger than 1024 bytes"), std::string::npos) << big.status().message();
  EXPECT_EQ(big.status().message().find("kkkk"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap
