// The webhook's snapshot GPU-count lookup, over a real store directory.
#include "k8s/snapshot_lookup.h"

#include <gtest/gtest.h>

#include "gpusnap/snapshot.h"
#include "util/files.h"
#include "store/meta_testing.h"

namespace gpusnap::k8s {
namespace {

class SnapshotLookup : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpusnap-lookup-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override { (void)RemoveTree(root_); }

  void Publish(const std::string& id, int gpus, bool with_gpu_state = true) {
    SnapshotMeta meta = BarePidMeta(id);
    if (with_gpu_state) {
      meta.gpu.emplace();
      meta.gpu->driver_version = "580.159.04";
      for (int i = 0; i < gpus; ++i) {
        SnapshotGpu g;
        g.index = i;
        g.uuid = fmt::format("GPU-5afec0da-0000-0000-0000-{:012}", i);
        meta.gpu->gpus.push_back(g);
      }
    }
    std::string dir = root_ + "/snapshots/" + id;
    ASSERT_TRUE(MakeDirs(dir).ok());
    ASSERT_TRUE(WriteFileAtomic(dir + "/gpusnap.json", SnapshotMetaToJson(meta)).ok());
  }

  std::string root_;
};

TEST_F(SnapshotLookup, CountsTheSnapshotsGpus) {
  Publish("two-gpus", 2);
  auto n = StoreGpuCountLookup(root_)("two-gpus");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 2);
}

TEST_F(SnapshotLookup, MissingSnapshotIsNotFound) {
  auto n = StoreGpuCountLookup(root_)("nope");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kNotFound);
}

TEST_F(SnapshotLookup, SnapshotWithoutGpuStateIsNotFound) {
  Publish("cpu-only", 0, /*with_gpu_state=*/false);
  auto n = StoreGpuCountLookup(root_)("cpu-only");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kNotFound);
  EXPECT_NE(n.status().message().find("records no GPU"), std::string::npos);
}

TEST_F(SnapshotLookup, MissingStoreIsAnError) {
  EXPECT_FALSE(StoreGpuCountLookup(root_ + "/absent")("x").ok());
}

}  // namespace
}  // namespace gpusnap::k8s
