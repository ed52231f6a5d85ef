#include "store/digest.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>

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

// Writes `bytes` of a pattern, synced, then asks the kernel to drop the file
// from the page cache; false where it keeps it anyway (tmpfs).
bool WriteUncached(const std::string& path, size_t bytes) {
  std::string data(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>(i * 131 + 7);
  if (!WriteFileSynced(path, data).ok()) return false;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  bool dropped = !PageCacheHolds(fd, 0, bytes);
  ::close(fd);
  return dropped;
}

void ReadAll(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  char buf[1 << 16];
  while (::read(fd, buf, sizeof buf) > 0) {
  }
  ::close(fd);
}

TEST_F(DigestTest, PacedDigestFollowsTheReaderThroughThePageCache) {
  std::string path = root_ + "/image";
  if (!WriteUncached(path, 8 << 20)) GTEST_SKIP() << "SKIPPED: this filesystem keeps the file in the page cache";
  auto plain = DigestFiles(root_, {"image"}, false);
  ASSERT_TRUE(plain.ok());
  ASSERT_TRUE(WriteUncached(path, 8 << 20));

  std::atomic<bool> reader_done{false};
  auto paced = std::async(std::launch::async, [&] {
    return DigestFiles(root_, {"image"}, false, 0, kDigestChunkBytes,
                       {.spare_cores = 1, .reader_done = [&] { return reader_done.load(); }});
  });
  // Nothing cached, the reader still running: the digest waits, reading nothing.
  EXPECT_EQ(paced.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  EXPECT_FALSE(PageCacheHolds(fd, 0, 8 << 20)) << "the waiting digest read the file itself";
  // The reader reads the file: the digest follows, though the reader never says it is done.
  ReadAll(path);
  EXPECT_TRUE(PageCacheHolds(fd, 0, 8 << 20));
  ::close(fd);
  ASSERT_EQ(paced.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  auto got = paced.get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->at("image").sha256, plain->at("image").sha256);
}

TEST_F(DigestTest, PacedDigestReadsTheRestOnceTheReaderIsDone) {
  std::string path = root_ + "/image";
  if (!WriteUncached(path, 8 << 20)) GTEST_SKIP() << "SKIPPED: this filesystem keeps the file in the page cache";
  std::atomic<bool> reader_done{false};
  auto paced = std::async(std::launch::async, [&] {
    return DigestFiles(root_, {"image", "abc"}, false, 0, kDigestChunkBytes,
                       {.spare_cores = 0, .reader_done = [&] { return reader_done.load(); }});
  });
  EXPECT_EQ(paced.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  reader_done = true;  // a reader that never read the file (a file CRIU does not read)
  ASSERT_EQ(paced.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  auto got = paced.get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->at("image").size, 8u << 20);
  EXPECT_EQ(got->at("abc").sha256, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(PageCacheHoldsTest, EmptyRangeAndBadFd) {
  EXPECT_TRUE(PageCacheHolds(-1, 0, 0));
  EXPECT_FALSE(PageCacheHolds(-1, 0, 4096));
}

}  // namespace
}  // namespace gpusnap
