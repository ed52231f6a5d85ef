#include "host/huge_pages.h"

#include <gtest/gtest.h>

#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::host {
namespace {

std::string Read(const std::string& path) {
  auto text = ReadFile(path);
  return text.ok() ? *text : "?";
}

TEST(ThpModeTest, TheBracketedWordOrTheWordItself) {
  EXPECT_EQ(ThpMode("always [madvise] never\n"), "madvise");
  EXPECT_EQ(ThpMode("[always] madvise never"), "always");
  EXPECT_EQ(ThpMode("madvise\n"), "madvise");
}

class HugePagesWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    thp = tmp.path() + "/enabled";
    dir = tmp.path() + "/thp";
    ASSERT_TRUE(WriteFileAtomic(thp, "always [madvise] never\n").ok());
  }
  TempDir tmp{"huge-pages"};
  std::string thp, dir;
};

TEST_F(HugePagesWindowTest, OverlappingWindowsPutTheHostsModeBackWhenTheLastCloses) {
  auto a = HugePagesWindow::Open(thp, dir);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(ThpMode(Read(thp)), "always");
  auto b = HugePagesWindow::Open(thp, dir);
  ASSERT_TRUE(b.ok()) << b.status().message();
  ASSERT_TRUE(a->Close().ok());
  EXPECT_EQ(ThpMode(Read(thp)), "always");  // b still restores
  ASSERT_TRUE(b->Close().ok());
  EXPECT_EQ(ThpMode(Read(thp)), "madvise");
  EXPECT_TRUE(b->Close().ok());  // idempotent
}

TEST_F(HugePagesWindowTest, AWindowADeadHolderLeftIsClosedByTheNext) {
  // A crash: `always` set, the host's mode saved, the holder's file not locked by anyone.
  ASSERT_TRUE(MakeDirs(dir, 0700).ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/saved", "never\n").ok());
  ASSERT_TRUE(WriteFileAtomic(dir + "/holder-1-0", "").ok());
  ASSERT_TRUE(WriteFileAtomic(thp, "always\n").ok());
  {
    auto w = HugePagesWindow::Open(thp, dir);
    ASSERT_TRUE(w.ok()) << w.status().message();
  }
  EXPECT_EQ(ThpMode(Read(thp)), "never");  // what the first window saved, not the `always` it found
}

TEST_F(HugePagesWindowTest, AnUnwritableSettingIsAnErrorNamingIt) {
  auto w = HugePagesWindow::Open(tmp.path() + "/no/such/file", dir);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("no/such/file"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap::host
