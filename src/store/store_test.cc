#include "store/store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include "store/layout.h"
#include "store/origins.h"
#include "util/files.h"
#include "util/temp_dir_testing.h"
#include "store/meta_testing.h"

namespace gpusnap {
namespace {

class StoreTest : public ::testing::Test {
 protected:
  TempDir tmp_{"store-test"};
  void SetUp() override {
    root_ = tmp_.path();
  }

  // A published snapshot with one image file.
  void Publish(const Store& store, const std::string& id, const std::string& content = "pages") {
    auto pending = store.Begin(id);
    ASSERT_TRUE(pending.ok()) << pending.status().ToString();
    ASSERT_TRUE(MakeDirs(pending->dir() + "/checkpoint").ok());
    ASSERT_TRUE(WriteFileSynced(pending->dir() + "/checkpoint/pages-1.img", content).ok());
    SnapshotMeta m = BarePidMeta(id);
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

// Issue 13, defect 1: a snapshot holds exactly its files, all regular.

// The message of verifying `id`, or "" when it verifies.
std::string VerifyRefusal(const Store& store, const std::string& id) {
  auto meta = store.Load(id);
  if (!meta.ok()) return meta.status().message();
  Status st = store.Verify(*meta);
  if (!st.ok()) {
    EXPECT_EQ(st.code(), Code::kCorruption) << st.ToString();
  }
  return st.message();
}

TEST_F(StoreTest, ExtraSymlinkNamedLikeAnImageIsRefused) {
  auto store = Store::Open(root_, true);
  Publish(*store, "s-1");
  std::string dir = root_ + "/snapshots/s-1";
  ASSERT_TRUE(WriteFileSynced(root_ + "/outside.img", "planted").ok());
  ASSERT_EQ(::symlink((root_ + "/outside.img").c_str(), (dir + "/checkpoint/cgroup.img").c_str()), 0);
  EXPECT_NE(VerifyRefusal(*store, "s-1").find("`checkpoint/cgroup.img` is a symbolic link, not a regular file"),
            std::string::npos)
      << VerifyRefusal(*store, "s-1");
}

TEST_F(StoreTest, ExtraFifoSocketAndDeviceAreRefusedNamingTheirType) {
  auto store = Store::Open(root_, true);
  Publish(*store, "s-2");
  std::string img = root_ + "/snapshots/s-2/checkpoint/extra.img";
  ASSERT_EQ(::mkfifo(img.c_str(), 0600), 0);
  EXPECT_NE(VerifyRefusal(*store, "s-2").find("`checkpoint/extra.img` is a FIFO, not a regular file"),
            std::string::npos)
      << VerifyRefusal(*store, "s-2");
  ASSERT_EQ(::unlink(img.c_str()), 0);

  int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(sock, 0);
  struct sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(img.size(), sizeof addr.sun_path);
  std::strcpy(addr.sun_path, img.c_str());
  ASSERT_EQ(::bind(sock, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ::close(sock);
  EXPECT_NE(VerifyRefusal(*store, "s-2").find("`checkpoint/extra.img` is a socket, not a regular file"),
            std::string::npos)
      << VerifyRefusal(*store, "s-2");
  ASSERT_EQ(::unlink(img.c_str()), 0);

  if (::mknod(img.c_str(), S_IFCHR | 0600, makedev(1, 3)) == 0) {  // /dev/null's numbers; root only
    EXPECT_NE(VerifyRefusal(*store, "s-2").find("`checkpoint/extra.img` is a character device, not a regular file"),
              std::string::npos)
        << VerifyRefusal(*store, "s-2");
    ASSERT_EQ(::unlink(img.c_str()), 0);
  }
  EXPECT_EQ(VerifyRefusal(*store, "s-2"), "");  // and as it was, it verifies
}

TEST_F(StoreTest, ListedFileSwappedForASymlinkIsNamedAsSuchNotAsMissing) {
  auto store = Store::Open(root_, true);
  Publish(*store, "s-3");
  std::string img = root_ + "/snapshots/s-3/checkpoint/pages-1.img";
  ASSERT_EQ(::rename(img.c_str(), (root_ + "/pages-1.img").c_str()), 0);
  ASSERT_EQ(::symlink((root_ + "/pages-1.img").c_str(), img.c_str()), 0);  // same content, behind a link
  std::string why = VerifyRefusal(*store, "s-3");
  EXPECT_NE(why.find("`checkpoint/pages-1.img` is a symbolic link, not a regular file"), std::string::npos) << why;
  EXPECT_EQ(why.find("missing"), std::string::npos) << why;
}

TEST_F(StoreTest, DirectoryTheFormatDoesNotHaveIsRefused) {
  auto store = Store::Open(root_, true);
  Publish(*store, "s-4");
  ASSERT_EQ(::mkdir((root_ + "/snapshots/s-4/checkpoint/sub").c_str(), 0700), 0);
  std::string why = VerifyRefusal(*store, "s-4");
  EXPECT_NE(why.find("`checkpoint/sub` is a directory where the format has none"), std::string::npos) << why;
}

TEST_F(StoreTest, MetadataBehindASymlinkIsRefused) {
  auto store = Store::Open(root_, true);
  Publish(*store, "s-5");
  std::string meta = root_ + "/snapshots/s-5/gpusnap.json";
  ASSERT_EQ(::rename(meta.c_str(), (root_ + "/gpusnap.json").c_str()), 0);
  ASSERT_EQ(::symlink((root_ + "/gpusnap.json").c_str(), meta.c_str()), 0);
  auto loaded = store->Load("s-5");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), Code::kCorruption);
  EXPECT_NE(loaded.status().message().find("is a symbolic link, not a regular file"), std::string::npos)
      << loaded.status().message();
}

TEST_F(StoreTest, PublishRefusesANonRegularEntry) {
  auto store = Store::Open(root_, true);
  auto pending = store->Begin("s-6");
  ASSERT_TRUE(pending.ok());
  ASSERT_TRUE(MakeDirs(pending->dir() + "/checkpoint").ok());
  ASSERT_EQ(::symlink("/etc/hostname", (pending->dir() + "/checkpoint/pages-1.img").c_str()), 0);
  SnapshotMeta m = BarePidMeta("s-6");
  Status st = pending->Publish(m);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("`checkpoint/pages-1.img` is a symbolic link"), std::string::npos) << st.message();
  EXPECT_FALSE(std::filesystem::exists(root_ + "/snapshots/s-6"));
}

TEST_F(StoreTest, UnknownDigestAlgorithmIsRefusedOnLoad) {
  auto store = Store::Open(root_, true);
  Publish(*store, "s-7");
  SnapshotMeta m = *store->Load("s-7");
  m.digest = "md5";
  ASSERT_TRUE(WriteFileAtomic(root_ + "/snapshots/s-7/gpusnap.json", SnapshotMetaToJson(m)).ok());
  auto loaded = store->Load("s-7");
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("unknown digest algorithm `md5`"), std::string::npos)
      << loaded.status().message();
}

// Issue 13, defect 3: `gpusnap rm` racing the end of a checkpoint.

TEST_F(StoreTest, RemoveWaitsForTheWriterThatIsStillFinishingTheSnapshot) {
  auto store = Store::Open(root_, true);
  auto pending = store->Begin("r-1");
  ASSERT_TRUE(pending.ok());
  ASSERT_TRUE(MakeDirs(pending->dir() + "/checkpoint").ok());
  ASSERT_TRUE(WriteFileSynced(pending->dir() + "/checkpoint/pages-1.img", "pages").ok());
  SnapshotMeta m = BarePidMeta("r-1");
  ASSERT_TRUE(pending->Publish(m).ok());
  // Published, but its writer (CRIU, after the post-dump answer) is not done.
  std::atomic<bool> removed{false};
  Status removal;
  std::thread rm([&] {
    removal = store->Remove("r-1");
    removed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(removed.load()) << "removed while its writer still held it";
  // The writer's last file, made as CRIU makes stats-dump: in the directory it holds.
  UniqueFd late(::openat(pending->dir_fd(), "stats-dump", O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  EXPECT_TRUE(late.valid());
  late.Reset();
  { PendingSnapshot done = std::move(*pending); }  // the writer ends
  rm.join();
  EXPECT_TRUE(removal.ok()) << removal.ToString();
  EXPECT_FALSE(std::filesystem::exists(root_ + "/snapshots/r-1"));
  EXPECT_TRUE(store->ListTemporaries().empty());
}

TEST_F(StoreTest, RemoveGivesUpOnAWriterThatDoesNotFinish) {
  auto store = Store::Open(root_, true);
  auto pending = store->Begin("r-2");
  ASSERT_TRUE(pending.ok());
  SnapshotMeta m = BarePidMeta("r-2");
  ASSERT_TRUE(pending->Publish(m).ok());
  Status st = store->Remove("r-2", /*wait_ms=*/100);
  EXPECT_EQ(st.code(), Code::kTimeout) << st.ToString();
  EXPECT_NE(st.message().find("still held by the checkpoint that wrote it"), std::string::npos) << st.message();
  EXPECT_TRUE(store->Load("r-2").ok());  // left as it was
}

TEST_F(StoreTest, LeftoverOfAnInterruptedRemovalIsCleanedByTheNextOne) {
  auto store = Store::Open(root_, true);
  // What an rm killed mid-way (or racing a writer) leaves: a renamed, partly
  // deleted snapshot that no one holds.
  for (const char* leftover : {"/snapshots/.tmp-.rm-h-1", "/snapshots/.tmp-rm-h-1"}) {
    ASSERT_TRUE(MakeDirs(root_ + leftover).ok());
    ASSERT_TRUE(WriteFileSynced(root_ + leftover + "/stats-dump", "x").ok());
  }
  Publish(*store, "h-1");  // the same id again
  Status st = store->Remove("h-1");
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_FALSE(std::filesystem::exists(root_ + "/snapshots/h-1"));
  EXPECT_TRUE(store->ListTemporaries().empty());
}

TEST_F(StoreTest, SnapshotBeingRemovedIsNotTakenByACleanerMeanwhile) {
  auto store = Store::Open(root_, true);
  Publish(*store, "r-3");
  // A removal in progress holds its directory: a cleaner (another
  // checkpoint's) leaves it to the removal instead of deleting alongside.
  std::string dir = root_ + "/snapshots/r-3";
  UniqueFd held(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_EQ(::flock(held.get(), LOCK_EX | LOCK_NB), 0);
  ASSERT_EQ(::rename(dir.c_str(), (root_ + "/snapshots/.tmp-.rm-r-3").c_str()), 0);
  EXPECT_EQ(store->CleanStaleTemporaries(), 0);
  auto temps = store->ListTemporaries();
  ASSERT_EQ(temps.size(), 1u);
  EXPECT_TRUE(temps[0].live);
  EXPECT_TRUE(temps[0].removing);
}

TEST(SnapshotIds, AreValidAndDistinct) {
  std::string a = NewSnapshotId("counter"), b = NewSnapshotId("counter");
  EXPECT_TRUE(IsValidSnapshotId(a));
  EXPECT_EQ(a.rfind("counter-", 0), 0u);
  (void)b;
}

TEST_F(StoreTest, ASnapshotIsOnlyTheManifestsItWasPulledFromOrPushedAsAndLosesThemWithItsRemoval) {
  auto store = Store::Open(root_, true);
  Publish(*store, "o-1");
  const std::string pulled = "sha256:" + std::string(64, 'a'), pushed = "sha256:" + std::string(64, 'b');
  EXPECT_FALSE(IsOrigin(root_, "o-1", pulled));
  ASSERT_TRUE(SetOrigin(root_, "o-1", pulled).ok());
  ASSERT_TRUE(AddOrigin(root_, "o-1", pushed).ok());
  ASSERT_TRUE(AddOrigin(root_, "o-1", pushed).ok());
  EXPECT_TRUE(IsOrigin(root_, "o-1", pulled));
  EXPECT_TRUE(IsOrigin(root_, "o-1", pushed));
  EXPECT_EQ(*ReadFile(OriginsPath(root_, "o-1")), pulled + "\n" + pushed + "\n");
  EXPECT_FALSE(IsOrigin(root_, "o-1", pulled.substr(0, 20)));
  EXPECT_FALSE(IsOrigin(root_, "o-2", pulled));
  // A pull that publishes it anew replaces what it was.
  ASSERT_TRUE(SetOrigin(root_, "o-1", pushed).ok());
  EXPECT_FALSE(IsOrigin(root_, "o-1", pulled));
  ASSERT_TRUE(store->Remove("o-1").ok());
  EXPECT_FALSE(std::filesystem::exists(OriginsPath(root_, "o-1")));
  Publish(*store, "o-1");
  EXPECT_FALSE(IsOrigin(root_, "o-1", pushed));
}

}  // namespace
}  // namespace gpusnap
