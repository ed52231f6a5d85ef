#include "rootfs/cache_archive.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>

#include "rootfs/applier.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::rootfs {
namespace {

void Write(const std::string& path, const std::string& data) {
  ASSERT_TRUE(MakeDirs(path.substr(0, path.rfind('/'))).ok()) << path;
  ASSERT_TRUE(WriteFileSynced(path, data).ok()) << path;
}

void SetTimes(const std::string& path, time_t sec, long nsec) {
  struct timespec times[2] = {{sec, nsec}, {sec, nsec}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path << ": " << std::strerror(errno);
}

struct stat Lstat(const std::string& path) {
  struct stat st = {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path << ": " << std::strerror(errno);
  return st;
}

std::string Xattr(const std::string& path, const char* name) {
  char value[256];
  ssize_t n = ::lgetxattr(path.c_str(), name, value, sizeof value);
  return n < 0 ? std::string("<none>") : std::string(value, static_cast<size_t>(n));
}

UniqueFd OpenPath(const std::string& dir) { return UniqueFd(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)); }

// Bytes that differ from block to block, so a block written at the wrong
// offset shows.
std::string Pattern(size_t size) {
  std::string out(size, '\0');
  for (size_t i = 0; i < size; ++i) out[i] = static_cast<char>((i * 131 + i / 4096) & 0xff);
  return out;
}

// A cache written as an archive and applied into an empty directory comes
// back as it was: kinds, data, modes, times, xattrs, links; owners when root.
TEST(RootfsCacheArchive, RoundTripKeepsEverythingAnArchiveCarries) {
  TempDir tmp{"rootfs-cache"};
  ASSERT_FALSE(tmp.path().empty());
  const std::string cache = tmp.path() + "/cache", out = tmp.path() + "/out";
  const bool root = ::geteuid() == 0;
  const std::string big = Pattern((24u << 20) + 12345);  // bigger than any buffer on the way
  Write(cache + "/models/weights.bin", big);
  Write(cache + "/models/config.json", "{}");
  Write(cache + "/bin/tool", "#!/bin/sh\n");
  Write(cache + "/skip/me", "excluded");
  Write(cache + "/private/key", "k");
  ASSERT_EQ(::chmod((cache + "/bin/tool").c_str(), root ? 04755 : 0755), 0);
  ASSERT_EQ(::chmod((cache + "/models/config.json").c_str(), 0640), 0);
  ASSERT_EQ(::symlink("weights.bin", (cache + "/models/latest").c_str()), 0);
  ASSERT_EQ(::symlink("/etc/passwd", (cache + "/models/absolute").c_str()), 0);
  ASSERT_EQ(::link((cache + "/models/weights.bin").c_str(), (cache + "/models/weights.hard").c_str()), 0);
  ASSERT_EQ(::mkfifo((cache + "/models/pipe").c_str(), 0600), 0);
  bool xattrs = ::setxattr((cache + "/models/config.json").c_str(), "user.origin", "hub", 3, 0) == 0;
  if (!xattrs) {
    ASSERT_EQ(errno, ENOTSUP) << std::strerror(errno);
  } else {
    ASSERT_EQ(::setxattr((cache + "/models").c_str(), "user.kind", "dir", 3, 0), 0);
  }
  if (root) {
    ASSERT_EQ(::lchown((cache + "/models/config.json").c_str(), 1234, 5678), 0);
    ASSERT_EQ(::lchown((cache + "/models/latest").c_str(), 1234, 5678), 0);
    ASSERT_EQ(::chown((cache + "/private").c_str(), 4321, 8765), 0);
  }
  ASSERT_EQ(::chmod((cache + "/private").c_str(), 0700), 0);
  SetTimes(cache + "/models/config.json", 1600000000, 0);
  SetTimes(cache + "/models/latest", 1600000100, 0);
  SetTimes(cache + "/models", 1600000200, 0);  // last: what is made in it moves it
  SetTimes(cache + "/private", 1600000300, 0);

  auto exclusions = PathMatcher::Make({"/root/.triton/skip"});
  ASSERT_TRUE(exclusions.ok());
  UniqueFd src = OpenPath(cache);
  ASSERT_TRUE(src.valid());
  const std::string tar = tmp.path() + "/0.tar";
  auto bound = CacheArchiveBytesBound(src.get(), "/root/.triton", *exclusions);
  ASSERT_TRUE(bound.ok()) << bound.status().ToString();
  auto written = WriteCacheArchive(src.get(), "/root/.triton", tar, *exclusions);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(written->excluded, (std::vector<std::string>{"/root/.triton/skip"}));
  ASSERT_EQ(written->skipped.size(), 1u);
  EXPECT_EQ(written->skipped[0].path, "/root/.triton/models/pipe");
  EXPECT_NE(written->skipped[0].reason.find("FIFO"), std::string::npos);
  // bin/ bin/tool models/ models/{absolute,config.json,latest,weights.bin,weights.hard} private/ private/key
  EXPECT_EQ(written->entries, 10u);
  EXPECT_EQ(written->data_bytes, big.size() + 2 + 10 + 1);  // the hard link's data once
  EXPECT_LE(written->archive_bytes, *bound);

  auto plan = CheckArchive(tar, {}, "caches/0.tar");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(MakeDirs(out).ok());
  UniqueFd dst = OpenPath(out);
  auto applied = ApplyArchive(dst.get(), tar, *plan);
  ASSERT_TRUE(applied.ok()) << applied.status().ToString();
  EXPECT_EQ(applied->entries, 10u);
  EXPECT_EQ(applied->data_bytes, big.size() + 2 + 10 + 1);
  EXPECT_EQ(applied->deleted, 0u);

  EXPECT_EQ(*ReadFile(out + "/models/weights.bin"), big);
  EXPECT_EQ(*ReadFile(out + "/models/config.json"), "{}");
  EXPECT_EQ(::access((out + "/skip").c_str(), F_OK), -1);
  EXPECT_EQ(::access((out + "/models/pipe").c_str(), F_OK), -1);
  for (const char* rel : {"/bin/tool", "/models/config.json", "/private", "/models", "/models/weights.bin"}) {
    struct stat a = Lstat(cache + rel), b = Lstat(out + rel);
    EXPECT_EQ(a.st_mode, b.st_mode) << rel;
    EXPECT_EQ(a.st_uid, b.st_uid) << rel;
    EXPECT_EQ(a.st_gid, b.st_gid) << rel;
    EXPECT_EQ(a.st_mtim.tv_sec, b.st_mtim.tv_sec) << rel;
  }
  EXPECT_EQ(Lstat(out + "/models").st_mtim.tv_sec, 1600000200);
  EXPECT_EQ(Lstat(out + "/private").st_mode & 07777, 0700u);
  if (root) {
    EXPECT_EQ(Lstat(out + "/bin/tool").st_mode & 07777, 04755u);
    EXPECT_EQ(Lstat(out + "/models/config.json").st_uid, 1234u);
    EXPECT_EQ(Lstat(out + "/models/latest").st_gid, 5678u);
    EXPECT_EQ(Lstat(out + "/private").st_uid, 4321u);
  }
  char target[64] = {};
  ASSERT_GT(::readlink((out + "/models/latest").c_str(), target, sizeof target - 1), 0);
  EXPECT_STREQ(target, "weights.bin");
  std::memset(target, 0, sizeof target);
  ASSERT_GT(::readlink((out + "/models/absolute").c_str(), target, sizeof target - 1), 0);
  EXPECT_STREQ(target, "/etc/passwd");  // as it is: resolved in the container when it runs
  EXPECT_EQ(Lstat(out + "/models/latest").st_mtim.tv_sec, 1600000100);
  EXPECT_EQ(Lstat(out + "/models/weights.hard").st_ino, Lstat(out + "/models/weights.bin").st_ino);
  EXPECT_EQ(Lstat(out + "/models/weights.bin").st_nlink, 2u);
  if (xattrs) {
    EXPECT_EQ(Xattr(out + "/models/config.json", "user.origin"), "hub");
    EXPECT_EQ(Xattr(out + "/models", "user.kind"), "dir");
  }

  // A second capture into the same file is refused, not appended.
  EXPECT_EQ(WriteCacheArchive(src.get(), "/root/.triton", tar, *exclusions).status().code(), Code::kAlreadyExists);
}

TEST(RootfsCacheArchive, AnEmptyCacheIsAnEmptyArchive) {
  TempDir tmp{"rootfs-cache"};
  ASSERT_TRUE(MakeDirs(tmp.path() + "/cache").ok());
  UniqueFd src = OpenPath(tmp.path() + "/cache");
  auto written = WriteCacheArchive(src.get(), "/root/.cache/", tmp.path() + "/0.tar", PathMatcher());
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(written->entries, 0u);
  auto plan = CheckArchive(tmp.path() + "/0.tar", {}, "caches/0.tar");
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_TRUE(plan->order.empty());
}

TEST(RootfsCacheArchive, ExclusionsOfTheWholeCacheOrARelativePathAreRefused) {
  TempDir tmp{"rootfs-cache"};
  ASSERT_TRUE(MakeDirs(tmp.path() + "/cache").ok());
  UniqueFd src = OpenPath(tmp.path() + "/cache");
  auto exclusions = PathMatcher::Make({"/root"});
  ASSERT_TRUE(exclusions.ok());
  auto whole = WriteCacheArchive(src.get(), "/root/.triton", tmp.path() + "/0.tar", *exclusions);
  EXPECT_EQ(whole.status().code(), Code::kInvalidArgument);
  EXPECT_NE(whole.status().message().find("`/root` leaves out the whole cache `/root/.triton`"), std::string::npos)
      << whole.status().message();
  auto relative = WriteCacheArchive(src.get(), "root/.triton", tmp.path() + "/1.tar", PathMatcher());
  EXPECT_EQ(relative.status().code(), Code::kInvalidArgument);
}

// No overlay is in a cache: a 0/0 character device is a device like any other.
TEST(RootfsCacheArchive, ADeviceIsRefusedNamingIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: making a device node (mknod)";
  TempDir tmp{"rootfs-cache"};
  const std::string cache = tmp.path() + "/cache";
  Write(cache + "/kept", "k");
  ASSERT_EQ(::mknod((cache + "/whiteout-like").c_str(), S_IFCHR | 0600, makedev(0, 0)), 0) << std::strerror(errno);
  UniqueFd src = OpenPath(cache);
  auto written = WriteCacheArchive(src.get(), "/root/.triton", tmp.path() + "/0.tar", PathMatcher());
  EXPECT_EQ(written.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(written.status().message().find("`/root/.triton/whiteout-like` is a character device (0:0)"),
            std::string::npos)
      << written.status().message();
  EXPECT_EQ(::access((tmp.path() + "/0.tar").c_str(), F_OK), -1);  // refused before writing
  EXPECT_EQ(CacheArchiveBytesBound(src.get(), "/root/.triton", PathMatcher()).status().code(),
            Code::kFailedPrecondition);
  auto excluded = PathMatcher::Make({"/root/.triton/whiteout-like"});
  ASSERT_TRUE(excluded.ok());
  EXPECT_TRUE(WriteCacheArchive(src.get(), "/root/.triton", tmp.path() + "/0.tar", *excluded).ok());
}

class RootfsCacheArchiveMount : public ::testing::Test {
 protected:
  void TearDown() override {
    if (!mounted_.empty()) {
      EXPECT_EQ(::umount2(mounted_.c_str(), MNT_DETACH), 0) << std::strerror(errno);
    }
  }
  std::string mounted_;
};

// Another mount inside a cache is not entered: its content is another
// filesystem's.
TEST_F(RootfsCacheArchiveMount, AMountPointInsideIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: mounting a tmpfs inside the cache";
  TempDir tmp{"rootfs-cache"};
  const std::string cache = tmp.path() + "/cache";
  Write(cache + "/a", "a");
  ASSERT_TRUE(MakeDirs(cache + "/volume").ok());
  if (::mount("gpusnap-test", (cache + "/volume").c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  mounted_ = cache + "/volume";
  Write(mounted_ + "/inner", "another filesystem's");
  UniqueFd src = OpenPath(cache);
  auto written = WriteCacheArchive(src.get(), "/data", tmp.path() + "/0.tar", PathMatcher());
  EXPECT_EQ(written.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(written.status().message().find("`/data/volume` in the cache `/data` is a mount point"),
            std::string::npos)
      << written.status().message();
  auto excluded = PathMatcher::Make({"/data/volume"});
  ASSERT_TRUE(excluded.ok());
  auto rest = WriteCacheArchive(src.get(), "/data", tmp.path() + "/1.tar", *excluded);
  ASSERT_TRUE(rest.ok()) << rest.status().ToString();
  EXPECT_EQ(rest->entries, 1u);
}

TEST(RootfsCacheArchive, ASocketIsSkipped) {
  TempDir tmp{"rootfs-cache"};
  const std::string cache = tmp.path() + "/cache";
  ASSERT_TRUE(MakeDirs(cache).ok());
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(sock.valid());
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  const std::string path = cache + "/s.sock";
  ASSERT_LT(path.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  UniqueFd src = OpenPath(cache);
  auto written = WriteCacheArchive(src.get(), "/run/app", tmp.path() + "/0.tar", PathMatcher());
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  ASSERT_EQ(written->skipped.size(), 1u);
  EXPECT_EQ(written->skipped[0].path, "/run/app/s.sock");
  EXPECT_EQ(written->entries, 0u);
}

}  // namespace
}  // namespace gpusnap::rootfs
