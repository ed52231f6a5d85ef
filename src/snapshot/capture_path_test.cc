#include "snapshot/capture_path.h"

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

const Status kIoUring = Status::Error(Code::kFailedPrecondition, "pid 12 holds an io_uring instance (fd 5)");
const Status kNoOverlay =
    Status::Error(Code::kFailedPrecondition, "the container's root is a `btrfs` mount, not an overlay");

TEST(CapturePath, AutoTakesTheProcessWhenItCanElseTheRootfsSayingWhy) {
  auto d = ChooseCapturePath("auto", Status::Ok(), Status::Ok());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->path, "process");
  d = ChooseCapturePath("auto", kIoUring, Status::Ok());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->path, "rootfs");
  EXPECT_NE(d->reason.find("io_uring instance (fd 5)"), std::string::npos) << d->reason;
  d = ChooseCapturePath("auto", kIoUring, kNoOverlay);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(d.status().message().find("io_uring"), std::string::npos);
  EXPECT_NE(d.status().message().find("not an overlay"), std::string::npos);
  // A tree with no overlay root that CRIU can take still goes by process.
  d = ChooseCapturePath("auto", Status::Ok(), kNoOverlay);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->path, "process");
}

TEST(CapturePath, AForcedPathIsTakenOrRefusedWithItsOwnReason) {
  EXPECT_EQ(ChooseCapturePath("process", kIoUring, Status::Ok()).status().message(), kIoUring.message());
  auto d = ChooseCapturePath("rootfs", Status::Ok(), Status::Ok());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->path, "rootfs");
  EXPECT_NE(ChooseCapturePath("rootfs", Status::Ok(), kNoOverlay).status().message().find("not an overlay"),
            std::string::npos);
  d = ChooseCapturePath("both", Status::Ok(), Status::Ok());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->path, "both");
  auto refused = ChooseCapturePath("both", kIoUring, Status::Ok());
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("the process path is refused"), std::string::npos);
  refused = ChooseCapturePath("both", Status::Ok(), kNoOverlay);
  EXPECT_NE(refused.status().message().find("the rootfs path is refused"), std::string::npos);
}

TEST(CapturePath, AnUnknownPathIsRefusedNamingIt) {
  auto d = ChooseCapturePath("disk", Status::Ok(), Status::Ok());
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
  EXPECT_NE(d.status().message().find("`disk`"), std::string::npos);
  EXPECT_TRUE(IsCapturePathName("both"));
  EXPECT_FALSE(IsCapturePathName(""));
}

}  // namespace
}  // namespace gpusnap
