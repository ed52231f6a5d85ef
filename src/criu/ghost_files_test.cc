#include "criu/ghost_files.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include "criu/images_testing.h"
#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::criu {
namespace {

using namespace testing;  // NOLINT: the image spellers

class GhostFilesTest : public ::testing::Test {
 protected:
  TempDir tmp_{"ghost-files"};
  void Write(const std::string& name, const std::string& bytes) {
    ASSERT_TRUE(WriteFileSynced(tmp_.path() + "/" + name, bytes).ok()) << name;
  }
};

TEST_F(GhostFilesTest, EachGhostAtTheNameTheRestoreGivesIt) {
  Write("files.img", Image(kFilesMagic, {RegularFile(0x10, "/usr/bin/python3"), RegularFile(0x17, "/data/w.bin"),
                                         VarintField(1, 5) + VarintField(2, 0x18),  // a pipe: not a file
                                         RegularFile(0x19, "/data/scratch"), RegularFile(0x1a, "/data/old.log")}));
  Write("remap-fpath.img", Image(kRemapFpathMagic, {Remap(0x10, 0x11, 0),     // linked: no ghost
                                                    Remap(0x17, 1, 1),        // a file
                                                    Remap(0x17, 1, 1),        // a second open of it
                                                    Remap(0x19, 2, 1),        // a directory
                                                    Remap(0x1a, 0x80000003, -1)}));  // an old image's ghost bit
  Write("ghost-file-1.img", Image(kGhostFileMagic, {Ghost(S_IFREG | 0644)}, std::string(5000, 'x')));
  Write("ghost-file-2.img", Image(kGhostFileMagic, {Ghost(S_IFDIR | 0755)}));
  Write("ghost-file-3.img", Image(kGhostFileMagic, {Ghost(S_IFREG | 0600)}));
  auto ghosts = ReadGhostFiles(tmp_.path());
  ASSERT_TRUE(ghosts.ok()) << ghosts.status().ToString();
  ASSERT_EQ(ghosts->size(), 3u);
  EXPECT_EQ((*ghosts)[0].RestorePath(), "/data/w.bin.cr.1.ghost");
  EXPECT_TRUE((*ghosts)[1].directory);
  EXPECT_EQ((*ghosts)[1].RestorePath(), "/data/scratch");
  EXPECT_EQ((*ghosts)[2].id, 3u);
  EXPECT_EQ((*ghosts)[2].RestorePath(), "/data/old.log.cr.3.ghost");
}

TEST_F(GhostFilesTest, NoRemapsNoGhosts) {
  Write("files.img", Image(kFilesMagic, {RegularFile(0x10, "/usr/bin/python3")}));
  auto ghosts = ReadGhostFiles(tmp_.path());
  ASSERT_TRUE(ghosts.ok()) << ghosts.status().ToString();
  EXPECT_TRUE(ghosts->empty());
}

TEST_F(GhostFilesTest, WhatIsNotCriusImageIsNamed) {
  Write("files.img", Image(kFilesMagic, {RegularFile(0x17, "/data/w.bin")}));
  Write("ghost-file-1.img", Image(kGhostFileMagic, {Ghost(S_IFREG | 0644)}));
  Write("remap-fpath.img", Image(kFilesMagic, {Remap(0x17, 1, 1)}));
  auto wrong_magic = ReadGhostFiles(tmp_.path());
  EXPECT_EQ(wrong_magic.status().code(), Code::kCorruption);
  EXPECT_NE(wrong_magic.status().message().find("remap-fpath.img` has magic"), std::string::npos)
      << wrong_magic.status().message();

  Write("remap-fpath.img", Image(kRemapFpathMagic, {Remap(0x17, 1, 1)}).substr(0, 14));
  auto cut = ReadGhostFiles(tmp_.path());
  EXPECT_EQ(cut.status().code(), Code::kCorruption);
  EXPECT_NE(cut.status().message().find("runs past its end"), std::string::npos) << cut.status().message();

  Write("remap-fpath.img", Image(kRemapFpathMagic, {Remap(0x99, 1, 1)}));
  auto nameless = ReadGhostFiles(tmp_.path());
  EXPECT_EQ(nameless.status().code(), Code::kCorruption);
  EXPECT_NE(nameless.status().message().find("file 0x99, which no image names"), std::string::npos)
      << nameless.status().message();
}

}  // namespace
}  // namespace gpusnap::criu
