#include "snapshot/container_files.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace gpusnap {
namespace {

TEST(ContainerFiles, SpecCarriesTheCommandAndManager) {
  SnapshotMeta meta;
  meta.id = "counter-20261129-233000-ab12";
  meta.source.name = "counter";
  meta.source.cmdline = {"/bin/counter", "-n", "3"};
  auto spec = nlohmann::json::parse(SpecDumpJson(meta));
  EXPECT_EQ(spec["process"]["args"][0], "/bin/counter");
  EXPECT_EQ(spec["annotations"]["io.container.manager"], "gpusnap");
  auto config = nlohmann::json::parse(ConfigDumpJson(meta, ""));
  EXPECT_EQ(config["name"], "counter");
  EXPECT_EQ(config["id"], meta.id);
}

}  // namespace
}  // namespace gpusnap
