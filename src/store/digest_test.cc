#include "store/digest.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap {
namespace {

class DigestTest : public ::testing::Test {
 protected:
  TempDir tmp_{"digest-test"};
  void SetUp() override {
    root_ = tmp_.path();
    ASSERT_TRUE(WriteFileSynced(root_ + "/empty", "").ok());
    ASSERT_TRUE(WriteFileSynced(root_ + "/abc", "abc").ok());
    ASSERT_TRUE(WriteFileSynced(root_ + "/ten", "abcdefghij").ok());
  }
  std::string root_;
};

// Expected values computed independently (Python's hashlib).
TEST_F(DigestTest, SingleChunkFilesHaveTheirPlainSha256) {
  auto d = DigestFiles(root_, {"empty", "abc"}, false);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->at("empty").sha256, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(d->at("abc").sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(d->at("abc").size, 3u);
}

TEST_F(DigestTest, LongFilesHashTheirChunkDigests) {
  // chunks "abcd", "efgh", "ij": sha256(sha256(abcd) || sha256(efgh) || sha256(ij))
  auto d = DigestFiles(root_, {"ten"}, false, 0, 4);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->at("ten").sha256, "39bca6fa3619f67ee4d6f8df51491558560f429920593f7f649119ba3f285ed9");
}

TEST_F(DigestTest, ThreadCountDoesNotChangeTheResult) {
  auto one = DigestFiles(root_, {"empty", "abc", "ten"}, true, 1, 3);
  auto many = DigestFiles(root_, {"empty", "abc", "ten"}, true, 8, 3);
  ASSERT_TRUE(one.ok() && many.ok());
  for (const char* f : {"empty", "abc", "ten"}) EXPECT_EQ(one->at(f).sha256, many->at(f).sha256) << f;
}

TEST_F(DigestTest, WholeFileAlgorithmOfOlderSnapshots) {
  auto chunk = DigestChunkBytes("sha256");
  ASSERT_TRUE(chunk.ok());
  auto d = DigestFiles(root_, {"ten"}, false, 0, *chunk);
  EXPECT_EQ(d->at("ten").sha256, "72399361da6a7754fec986dca5b7cbaf1c810a28ded4abaf56b2106d06cb78b0");
  EXPECT_EQ(*DigestChunkBytes(kDigestAlgorithm), kDigestChunkBytes);
  EXPECT_EQ(DigestChunkBytes("md5").status().code(), Code::kNotSupported);
}

TEST_F(DigestTest, MissingFileIsNamed) {
  auto d = DigestFiles(root_, {"abc", "nope"}, false);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("nope"), std::string::npos);
}

// Issue 13, defect 1: files are opened for digesting without following links.
TEST_F(DigestTest, SymlinkIsRefusedNotFollowed) {
  ASSERT_EQ(::symlink((root_ + "/abc").c_str(), (root_ + "/link").c_str()), 0);
  auto d = DigestFiles(root_, {"link"}, false);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kCorruption);
  EXPECT_NE(d.status().message().find("/link` is a symbolic link, not a regular file"), std::string::npos)
      << d.status().message();
}

TEST_F(DigestTest, FifoIsRefusedWithoutBlocking) {
  std::string fifo = root_ + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // In a child with a deadline: a reader that opened the FIFO would wait for a writer forever.
  pid_t child = ::fork();
  if (child == 0) {
    ::alarm(10);
    auto d = DigestFiles(root_, {"fifo"}, false);
    bool named = !d.ok() && d.status().message().find("/fifo` is a FIFO, not a regular file") != std::string::npos;
    ::_exit(named ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status)) << "the digest blocked on the FIFO (status " << status << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0) << "not refused as a FIFO";
}

}  // namespace
}  // namespace gpusnap
