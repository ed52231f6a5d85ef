#include "rootfs/overlay_mount.h"

#include <gtest/gtest.h>

namespace gpusnap::rootfs {
namespace {

// The root of a containerd container (overlayfs snapshotter), as its init's
// /proc/<pid>/mountinfo shows it.
const std::string kSnapshots = "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots";
const std::string kContainerdRoot = "1021 980 0:87 / / rw,relatime master:412 - overlay overlay rw,lowerdir=" +
                                    kSnapshots + "/12/fs:" + kSnapshots + "/11/fs,upperdir=" + kSnapshots +
                                    "/31/fs,workdir=" + kSnapshots + "/31/work,uuid=on\n";

TEST(RootfsMountInfo, UnescapesTheKernelsOctalEscapes) {
  EXPECT_EQ(UnescapeMountField("/a\\040b\\011c\\012d\\134e"), "/a b\tc\nd\\e");
  EXPECT_EQ(UnescapeMountField("x\\054y"), "x,y");
  // Not three octal digits: left as it is.
  EXPECT_EQ(UnescapeMountField("a\\08b\\9\\"), "a\\08b\\9\\");
  EXPECT_EQ(UnescapeMountField("\\04"), "\\04");
  EXPECT_EQ(UnescapeMountField(""), "");
}

TEST(RootfsMountInfo, ParsesALineWithOptionalFields) {
  auto e = ParseMountInfoLine(kContainerdRoot);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->mount_id, 1021);
  EXPECT_EQ(e->parent_id, 980);
  EXPECT_EQ(e->root, "/");
  EXPECT_EQ(e->mount_point, "/");
  EXPECT_EQ(e->fstype, "overlay");
  EXPECT_EQ(e->source, "overlay");
  EXPECT_EQ(e->super_options.substr(0, 12), "rw,lowerdir=");
}

TEST(RootfsMountInfo, AMountPointWithASpace) {
  auto e = ParseMountInfoLine("40 21 0:35 /vol /root/model\\040cache rw - ext4 /dev/sda1 rw");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->root, "/vol");
  EXPECT_EQ(e->mount_point, "/root/model cache");
}

TEST(RootfsMountInfo, MalformedLinesAreRefusedQuotingThem) {
  for (std::string_view bad : {"", "1 2 0:3 / /", "a 2 0:3 / / rw - ext4 /dev/x rw", "1 2 0:3 / / rw ext4 /dev/x rw",
                               "1 2 0:3 / / rw - ext4 /dev/x rw extra"}) {
    auto e = ParseMountInfoLine(bad);
    EXPECT_FALSE(e.ok()) << bad;
    EXPECT_EQ(e.status().code(), Code::kInvalidArgument) << bad;
  }
  auto all = ParseMountInfo(kContainerdRoot + "garbage\n");
  ASSERT_FALSE(all.ok());
  EXPECT_NE(all.status().message().find("mountinfo line 2"), std::string::npos) << all.status().message();
}

TEST(RootfsOverlay, ContainerdsRootGivesItsLayers) {
  auto mounts = ParseMountInfo(kContainerdRoot);
  ASSERT_TRUE(mounts.ok()) << mounts.status().ToString();
  auto layers = RootOverlay(*mounts);
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  EXPECT_EQ(layers->upper, kSnapshots + "/31/fs");
  EXPECT_EQ(layers->work, kSnapshots + "/31/work");
  ASSERT_EQ(layers->lowers.size(), 2u);
  EXPECT_EQ(layers->lowers[0], kSnapshots + "/12/fs");
  EXPECT_EQ(layers->lowers[1], kSnapshots + "/11/fs");
  EXPECT_TRUE(layers->data_lowers.empty());
  EXPECT_FALSE(layers->userxattr);
  EXPECT_FALSE(layers->metacopy);
}

TEST(RootfsOverlay, EscapedCommasSpacesAndColonsInPaths) {
  // A layer "/l 1,x" and a layer "/l:2": the kernel shows the space and the
  // comma as octal, and the backslash of the mount's own `\:` as \134.
  auto layers = ParseOverlayOptions("rw,lowerdir=/l\\0401\\054x:/l\\134:2,upperdir=/u\\040p,workdir=/w");
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  ASSERT_EQ(layers->lowers.size(), 2u);
  EXPECT_EQ(layers->lowers[0], "/l 1,x");
  EXPECT_EQ(layers->lowers[1], "/l:2");
  EXPECT_EQ(layers->upper, "/u p");
  EXPECT_EQ(layers->work, "/w");
}

TEST(RootfsOverlay, DataOnlyLayersAfterADoubleColon) {
  auto regular_after_data = ParseOverlayOptions("ro,lowerdir=/a:/b::/d1:/d2");
  EXPECT_FALSE(regular_after_data.ok());
  EXPECT_NE(regular_after_data.status().message().find("regular layer after a data-only one"), std::string::npos)
      << regular_after_data.status().message();
  auto layers = ParseOverlayOptions("ro,lowerdir=/a:/b::/d1::/d2,metacopy=on,redirect_dir=on");
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  EXPECT_EQ(layers->lowers, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(layers->data_lowers, (std::vector<std::string>{"/d1", "/d2"}));
  EXPECT_TRUE(layers->metacopy);
  EXPECT_TRUE(layers->redirect_dir);
  EXPECT_TRUE(layers->upper.empty());
}

TEST(RootfsOverlay, OneOptionPerLayerFromKernel67) {
  auto layers = ParseOverlayOptions(
      "rw,lowerdir+=/a,lowerdir+=/b\\054c,datadir+=/d,upperdir=/u,workdir=/w,userxattr,index=on");
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  EXPECT_EQ(layers->lowers, (std::vector<std::string>{"/a", "/b,c"}));
  EXPECT_EQ(layers->data_lowers, (std::vector<std::string>{"/d"}));
  EXPECT_TRUE(layers->userxattr);
  EXPECT_TRUE(layers->index);
  EXPECT_FALSE(ParseOverlayOptions("rw,lowerdir=/a,lowerdir+=/b").ok());
  EXPECT_FALSE(ParseOverlayOptions("rw,lowerdir+=/b,lowerdir=/a").ok());
}

TEST(RootfsOverlay, MalformedLayerListsAreRefused) {
  for (std::string_view bad : {"lowerdir=", "lowerdir=:/a", "lowerdir=/a:", "lowerdir=/a:::/b", "lowerdir=/a,upperdir=/u,upperdir=/v",
                               "lowerdir+=,upperdir=/u"}) {
    auto layers = ParseOverlayOptions(bad);
    EXPECT_FALSE(layers.ok()) << bad;
    EXPECT_EQ(layers.status().code(), Code::kInvalidArgument) << bad;
  }
}

TEST(RootfsOverlay, TheLastMountAtTheRootCounts) {
  auto mounts = ParseMountInfo(
      "20 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
      "21 20 0:40 / / rw - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w\n"
      "22 21 0:41 / /proc rw - proc proc rw\n");
  ASSERT_TRUE(mounts.ok()) << mounts.status().ToString();
  auto layers = RootOverlay(*mounts);
  ASSERT_TRUE(layers.ok()) << layers.status().ToString();
  EXPECT_EQ(layers->upper, "/u");
  EXPECT_EQ(MountPointsBesideRoot(*mounts), (std::vector<std::string>{"/proc"}));
}

TEST(RootfsOverlay, ARootThatIsNoWritableOverlayIsRefusedSayingWhat) {
  auto ext4 = ParseMountInfo("20 1 8:1 / / rw - ext4 /dev/sda1 rw\n");
  ASSERT_TRUE(ext4.ok());
  auto r = RootOverlay(*ext4);
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("`ext4` mount of `/dev/sda1`"), std::string::npos) << r.status().message();
  auto read_only = ParseMountInfo("21 1 0:40 / / ro - overlay overlay ro,lowerdir=/a:/b\n");
  ASSERT_TRUE(read_only.ok());
  r = RootOverlay(*read_only);
  EXPECT_EQ(r.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("no upperdir"), std::string::npos) << r.status().message();
  auto none = ParseMountInfo("22 1 0:41 / /proc rw - proc proc rw\n");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(RootOverlay(*none).status().code(), Code::kNotFound);
}

}  // namespace
}  // namespace gpusnap::rootfs
