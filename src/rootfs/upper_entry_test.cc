#include "rootfs/upper_entry.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

namespace gpusnap::rootfs {
namespace {

UpperEntry E(std::string path, FileKind kind, std::map<std::string, std::string> xattrs = {}) {
  UpperEntry e;
  e.path = std::move(path);
  e.kind = kind;
  e.xattrs = std::move(xattrs);
  return e;
}

UpperEntry Device(std::string path, FileKind kind, uint32_t major, uint32_t minor) {
  UpperEntry e = E(std::move(path), kind);
  e.rdev_major = major;
  e.rdev_minor = minor;
  return e;
}

TEST(RootfsUpperEntry, FilesDirectoriesAndLinksAreKept) {
  for (FileKind k : {FileKind::kRegular, FileKind::kDirectory, FileKind::kSymlink}) {
    EntryDecision d = DecideUpperEntry(E("opt/app/x", k));
    EXPECT_EQ(d.disposition, Disposition::kKeep) << FileKindName(k);
    EXPECT_TRUE(d.reason.empty());
  }
}

TEST(RootfsUpperEntry, ACharacterDevice00IsAWhiteout) {
  EXPECT_EQ(DecideUpperEntry(Device("etc/removed.conf", FileKind::kCharDevice, 0, 0)).disposition,
            Disposition::kWhiteout);
}

TEST(RootfsUpperEntry, TheXattrWhiteoutOfNewerKernels) {
  EXPECT_EQ(DecideUpperEntry(E("a", FileKind::kRegular, {{"trusted.overlay.whiteout", ""}})).disposition,
            Disposition::kWhiteout);
  // With userxattr the attribute is user.overlay.*; the trusted one then means nothing.
  EXPECT_EQ(DecideUpperEntry(E("a", FileKind::kRegular, {{"user.overlay.whiteout", ""}}), kUserOverlayPrefix)
                .disposition,
            Disposition::kWhiteout);
  EXPECT_EQ(DecideUpperEntry(E("a", FileKind::kRegular, {{"trusted.overlay.whiteout", ""}}), kUserOverlayPrefix)
                .disposition,
            Disposition::kKeep);
  // A file with data is no whiteout, whatever it is marked.
  UpperEntry data = E("a", FileKind::kRegular, {{"trusted.overlay.whiteout", ""}});
  data.size = 5;
  EXPECT_EQ(DecideUpperEntry(data).disposition, Disposition::kKeep);
}

TEST(RootfsUpperEntry, AnOpaqueDirectoryIsMarked) {
  EXPECT_EQ(DecideUpperEntry(E("var/cache", FileKind::kDirectory, {{"trusted.overlay.opaque", "y"}})).disposition,
            Disposition::kOpaqueDir);
  EXPECT_EQ(DecideUpperEntry(E("var/cache", FileKind::kDirectory, {{"user.overlay.opaque", "y"}}), kUserOverlayPrefix)
                .disposition,
            Disposition::kOpaqueDir);
  // "x": a directory that holds xattr whiteouts, not an opaque one.
  EXPECT_EQ(DecideUpperEntry(E("var/cache", FileKind::kDirectory, {{"trusted.overlay.opaque", "x"}})).disposition,
            Disposition::kKeep);
}

TEST(RootfsUpperEntry, SocketsAndFifosAreSkippedSayingWhy) {
  EntryDecision s = DecideUpperEntry(E("run/app.sock", FileKind::kSocket));
  EXPECT_EQ(s.disposition, Disposition::kSkip);
  EXPECT_NE(s.reason.find("`/run/app.sock` is a socket"), std::string::npos) << s.reason;
  EntryDecision f = DecideUpperEntry(E("tmp/pipe", FileKind::kFifo));
  EXPECT_EQ(f.disposition, Disposition::kSkip);
  EXPECT_NE(f.reason.find("`/tmp/pipe` is a FIFO"), std::string::npos) << f.reason;
}

TEST(RootfsUpperEntry, OtherDevicesAreRefusedNamingThem) {
  EntryDecision c = DecideUpperEntry(Device("dev/null2", FileKind::kCharDevice, 1, 3));
  EXPECT_EQ(c.disposition, Disposition::kRefuse);
  EXPECT_NE(c.reason.find("`/dev/null2` is a character device (1:3)"), std::string::npos) << c.reason;
  EntryDecision b = DecideUpperEntry(Device("dev/sdz", FileKind::kBlockDevice, 8, 0));
  EXPECT_EQ(b.disposition, Disposition::kRefuse);
  EXPECT_NE(b.reason.find("`/dev/sdz` is a block device (8:0)"), std::string::npos) << b.reason;
  EXPECT_EQ(DecideUpperEntry(E("x", FileKind::kUnknown)).disposition, Disposition::kRefuse);
}

TEST(RootfsUpperEntry, DataInALowerLayerIsRefused) {
  EntryDecision m = DecideUpperEntry(E("usr/bin/tool", FileKind::kRegular, {{"trusted.overlay.metacopy", ""}}));
  EXPECT_EQ(m.disposition, Disposition::kRefuse);
  EXPECT_NE(m.reason.find("metacopy"), std::string::npos) << m.reason;
  EntryDecision r =
      DecideUpperEntry(E("srv/new", FileKind::kDirectory, {{"trusted.overlay.redirect", "/srv/old"}}));
  EXPECT_EQ(r.disposition, Disposition::kRefuse);
  EXPECT_NE(r.reason.find("`/srv/new` is a renamed directory (overlay redirect to `/srv/old`)"), std::string::npos)
      << r.reason;
}

TEST(RootfsUpperEntry, KindsFromModes) {
  EXPECT_EQ(FileKindOfMode(S_IFREG | 0644), FileKind::kRegular);
  EXPECT_EQ(FileKindOfMode(S_IFDIR | 0755), FileKind::kDirectory);
  EXPECT_EQ(FileKindOfMode(S_IFLNK | 0777), FileKind::kSymlink);
  EXPECT_EQ(FileKindOfMode(S_IFCHR), FileKind::kCharDevice);
  EXPECT_EQ(FileKindOfMode(S_IFBLK), FileKind::kBlockDevice);
  EXPECT_EQ(FileKindOfMode(S_IFIFO), FileKind::kFifo);
  EXPECT_EQ(FileKindOfMode(S_IFSOCK), FileKind::kSocket);
}

TEST(RootfsUpperEntry, TheOverlaysOwnXattrsAndLabelsStayOutOfTheArchive) {
  std::map<std::string, std::string> in = {{"trusted.overlay.opaque", "y"},
                                           {"trusted.overlay.origin", "..."},
                                           {"user.overlay.impure", "y"},
                                           {"trusted.other", "1"},
                                           {"security.selinux", "system_u:object_r:container_file_t:s0"},
                                           {"security.capability", "\x01\x02"},
                                           {"system.posix_acl_access", "acl"},
                                           {"user.mime_type", "text/plain"}};
  auto out = ArchivedXattrs(in);
  EXPECT_EQ(out, (std::map<std::string, std::string>{{"security.capability", "\x01\x02"},
                                                      {"system.posix_acl_access", "acl"},
                                                      {"user.mime_type", "text/plain"}}));
}

TEST(RootfsUpperEntry, AnOpaqueDirectoryDeletesWhatOnlyTheLowerLayersHold) {
  auto d = OpaqueDeletions("var/cache/app", {"new.bin", "kept"}, {"old.bin", "kept", "stale", "old.bin", "."});
  EXPECT_EQ(d, (std::vector<std::string>{"/var/cache/app/old.bin", "/var/cache/app/stale"}));
  EXPECT_TRUE(OpaqueDeletions("d", {"a"}, {"a"}).empty());
  EXPECT_TRUE(OpaqueDeletions("d", {}, {}).empty());
}

TEST(RootfsUpperEntry, ACacheKeepsFilesSkipsSocketsAndRefusesEveryDevice) {
  for (FileKind k : {FileKind::kRegular, FileKind::kDirectory, FileKind::kSymlink})
    EXPECT_EQ(DecideCacheEntry(E("a/b", k), "/root/.triton").disposition, Disposition::kKeep) << FileKindName(k);
  // No overlay in a cache: its xattrs and a 0/0 device mean nothing special.
  EXPECT_EQ(DecideCacheEntry(E("a", FileKind::kRegular, {{"trusted.overlay.metacopy", ""}}), "/c").disposition,
            Disposition::kKeep);
  EntryDecision zero = DecideCacheEntry(Device("w", FileKind::kCharDevice, 0, 0), "/root/.triton");
  EXPECT_EQ(zero.disposition, Disposition::kRefuse);
  EXPECT_EQ(zero.reason, "`/root/.triton/w` is a character device (0:0): a cache archive carries no device nodes "
                         "into another container");
  EXPECT_EQ(DecideCacheEntry(Device("sda", FileKind::kBlockDevice, 8, 0), "/c").disposition, Disposition::kRefuse);
  EntryDecision fifo = DecideCacheEntry(E("p", FileKind::kFifo), "/c/");
  EXPECT_EQ(fifo.disposition, Disposition::kSkip);
  EXPECT_NE(fifo.reason.find("`/c/p` is a FIFO"), std::string::npos) << fifo.reason;
  EXPECT_EQ(DecideCacheEntry(E("s", FileKind::kSocket), "/c").disposition, Disposition::kSkip);
}

TEST(RootfsUpperEntry, ContainerPathsOfATreeBeneathAContainerPath) {
  EXPECT_EQ(ContainerPathIn("/", "etc/a"), "/etc/a");
  EXPECT_EQ(ContainerPathIn("/", ""), "/");
  EXPECT_EQ(ContainerPathIn("/root/.triton", "a/b"), "/root/.triton/a/b");
  EXPECT_EQ(ContainerPathIn("/root/.triton/", "a"), "/root/.triton/a");
  EXPECT_EQ(ContainerPathIn("/root/.triton//", ""), "/root/.triton");
}

}  // namespace
}  // namespace gpusnap::rootfs
