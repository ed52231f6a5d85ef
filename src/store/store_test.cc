#include "store/store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "store/layout.h"
#include "util/files.h"

namespace gpusnap {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpusnap-store-test-XXXXXX";
    root_ = ::mkdtemp(tmpl);
  }
  void TearDown() override { (void)RemoveTree(root_); }

  SnapshotMeta MetaFor(const std::string& id) {
    SnapshotMeta m;
    m.id = id;
    m.created = "2026-11-29T23:30:00.000Z";
    m.source.kind = "pid";
    m.source.host_pid = 1;
    m.source.ns_pid = 1;
    m.criu_version = "4.3";
    return m;
  }

  // A published snapshot with one image file.
  void Publish(const Store& store, const std::string& id, const std::string& content = "pages") {
    auto pending = store.Begin(id);
    ASSERT_TRUE(pending.ok()) << pending.status().ToString();
    ASSERT_TRUE(MakeDirs(pending->dir() + "/checkpoint").ok());
    ASSERT_TRUE(WriteFileSynced(pending->dir() + "/checkpoint/pages-1.img", content).ok());
    SnapshotMeta m = MetaFor(id);
    ASSERT_TRUE(pending->Publish(m).ok());
  }

  std::string root_;
};

TEST_F(StoreTest, PublishedSnapshotIsListedAndVerifies) {
  auto store = Store::Open(root_, true);
  ASSERT_TRUE(store.ok());
  Publish(*store, "a-1");
  auto all = store->List();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].id, "a-1");
  EXPECT_EQ((*all)[0].total_bytes, 5u);
  EXPECT_TRUE(store->Verify((*all)[0]).ok());
}

TEST_F(StoreTest, UnpublishedSnapshotIsNeverListedAndIsRemoved) {
  auto store = Store::Open(root_, true);
  {
    auto pending = store->Begin("b-1");
    ASSERT_TRUE(pending.ok());
    ASSERT_TRUE(WriteFileSynced(pending->dir() + "/x", "x").ok());
    EXPECT_TRUE(store->List()->empty());
  }
  EXPECT_FALSE(std::filesystem::exists(root_ + "/snapshots/.tmp-b-1"));
}

TEST_F(StoreTest, StaleTemporaryOfADeadWriterIsCleaned) {
  auto store = Store::Open(root_, true);
  pid_t child = ::fork();
  if (child == 0) {
    auto pending = store->Begin("c-1");
    (void)!pending.ok();
    ::_exit(0);  // dies holding its .tmp, like a killed gpusnap
  }
  ::waitpid(child, nullptr, 0);
  ASSERT_TRUE(std::filesystem::exists(root_ + "/snapshots/.tmp-c-1"));
  EXPECT_EQ(store->CleanStaleTemporaries(), 1);
  EXPECT_FALSE(std::filesystem::exists(root_ + "/snapshots/.tmp-c-1"));
}

TEST_F(StoreTest, LiveWritersTemporaryIsKept) {
  auto store = Store::Open(root_, true);
  auto pending = store->Begin("d-1");
  ASSERT_TRUE(pending.ok());
  EXPECT_EQ(store->CleanStaleTemporaries(), 0);
  EXPECT_TRUE(std::filesystem::exists(pending->dir()));
}

TEST_F(StoreTest, DigestMismatch) {
  auto store = Store::Open(root_, true);
  Publish(*store, "e-1", "pages");
  std::string img = root_ + "/snapshots/e-1/checkpoint/pages-1.img";
  int fd = ::open(img.c_str(), O_WRONLY);
  ASSERT_EQ(::pwrite(fd, "q", 1, 0), 1);  // same size, one byte flipped
  ::close(fd);
  Status st = store->Verify(*store->Load("e-1"));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("checkpoint/pages-1.img"), std::string::npos);
}

TEST_F(StoreTest, TruncatedFileIsRejected) {
  auto store = Store::Open(root_, true);
  Publish(*store, "f-1", "pages");
  ASSERT_EQ(::truncate((root_ + "/snapshots/f-1/checkpoint/pages-1.img").c_str(), 2), 0);
  Status st = store->Verify(*store->Load("f-1"));
  EXPECT_EQ(st.code(), Code::kCorruption);
  EXPECT_NE(st.message().find("has 2 bytes"), std::string::npos);
}

TEST_F(StoreTest, MissingAndExtraFilesAreRejected) {
  auto store = Store::Open(root_, true);
  Publish(*store, "g-1");
  ASSERT_TRUE(WriteFileSynced(root_ + "/snapshots/g-1/checkpoint/extra.img", "x").ok());
  EXPECT_NE(store->Verify(*store->Load("g-1")).message().find("unexpected file `checkpoint/extra.img`"),
            std::string::npos);
  ::unlink((root_ + "/snapshots/g-1/checkpoint/pages-1.img").c_str());
  EXPECT_NE(store->Verify(*store->Load("g-1")).message().find("missing"), std::string::npos);
}

TEST_F(StoreTest, LoadOfUnknownIdIsNotFound) {
  auto store = Store::Open(root_, true);
  EXPECT_EQ(store->Load("nope").status().code(), Code::kNotFound);
  EXPECT_EQ(store->Load("../etc").status().code(), Code::kInvalidArgument);
}

TEST_F(StoreTest, RemoveMakesItVanish) {
  auto store = Store::Open(root_, true);
  Publish(*store, "h-1");
  ASSERT_TRUE(store->Remove("h-1").ok());
  EXPECT_TRUE(store->List()->empty());
  EXPECT_EQ(store->Remove("h-1").code(), Code::kNotFound);
}

TEST_F(StoreTest, DuplicateIdIsRefused) {
  auto store = Store::Open(root_, true);
  Publish(*store, "i-1");
  EXPECT_EQ(store->Begin("i-1").status().code(), Code::kAlreadyExists);
}

TEST_F(StoreTest, UnwritableStoreIsAnError) {
  if (::geteuid() == 0) {
    // root ignores permissions; a path under a regular file cannot be a directory.
    ASSERT_TRUE(WriteFileSynced(root_ + "/file", "x").ok());
    EXPECT_FALSE(Store::Open(root_ + "/file/store", true).ok());
  } else {
    ::chmod(root_.c_str(), 0500);
    EXPECT_FALSE(Store::Open(root_ + "/s", true).ok());
  }
}

TEST(SnapshotIds, AreValidAndDistinct) {
  std::string a = NewSnapshotId("counter"), b = NewSnapshotId("counter");
  EXPECT_TRUE(IsValidSnapshotId(a));
  EXPECT_EQ(a.rfind("counter-", 0), 0u);
  (void)b;
}

}  // namespace
}  // namespace gpusnap
