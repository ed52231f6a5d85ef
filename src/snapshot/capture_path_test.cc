#include "snapshot/capture_path.h"

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

const Status kIoUring = Status::Error(Code::kFailedPrecondition, "pid 12 holds an io_uring instance (fd 5)");
const Status kNoOverlay =
    Status::Error(Code::kFailedPrecondition, "the container's root is a `btrfs` mount, not an overlay");

TEST(CapturePath, AutoTakesTheProcessWhenItCanElseTheRootfsSayingWhy) {
  auto d = ChooseCapturePath(CapturePath::kAuto, Status::Ok(), Status::Ok());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->path, CapturePath::kProcess);
  d = ChooseCapturePath(CapturePath::kAuto, kIoUring, Status::Ok());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->path, CapturePath::kRootfs);
  EXPECT_NE(d->reason.find("io_uring instance (fd 5)"), std::string::npos) << d->reason;
  d = ChooseCapturePath(CapturePath::kAuto, kIoUring, kNoOverlay);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("io_uring"), std::string::npos);
  EXPECT_NE(d.status().message().find("not an overlay"), std::string::npos);
  // A tree with no overlay root that CRIU can take still goes by process.
  d = ChooseCapturePath(CapturePath::kAuto, Status::Ok(), kNoOverlay);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->path, CapturePath::kProcess);
}

TEST(CapturePath, AForcedPathIsTakenOrRefusedWithItsOwnReason) {
  EXPECT_EQ(ChooseCapturePath(CapturePath::kProcess, kIoUring, Status::Ok()).status().message(), kIoUring.message());
  auto d = ChooseCapturePath(CapturePath::kRootfs, Status::Ok(), Status::Ok());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->path, CapturePath::kRootfs);
  EXPECT_NE(ChooseCapturePath(CapturePath::kRootfs, Status::Ok(), kNoOverlay).status().message().find("not an overlay"),
            std::string::npos);
  d = ChooseCapturePath(CapturePath::kBoth, Status::Ok(), Status::Ok());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->path, CapturePath::kBoth);
  auto refused = ChooseCapturePath(CapturePath::kBoth, kIoUring, Status::Ok());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("the process path is refused"), std::string::npos);
  refused = ChooseCapturePath(CapturePath::kBoth, Status::Ok(), kNoOverlay);
  EXPECT_NE(refused.status().message().find("the rootfs path is refused"), std::string::npos);
}

TEST(CapturePath, ItsNamesReadBackAsTheSamePath) {
  for (CapturePath p : {CapturePath::kAuto, CapturePath::kProcess, CapturePath::kRootfs, CapturePath::kBoth})
    EXPECT_EQ(ParseCapturePath(CapturePathName(p)), p);
  EXPECT_EQ(ParseCapturePath("disk"), std::nullopt);
  EXPECT_EQ(ParseCapturePath(""), std::nullopt);
  EXPECT_EQ(ParseCapturePath("Process"), std::nullopt);
}

}  // namespace
}  // namespace gpusnap
