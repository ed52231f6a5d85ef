#include "container/oci_bundle.h"

#include <gtest/gtest.h>

namespace gpusnap::container {
namespace {

TEST(OciBundle, ReadsTheCommandCwdEnvAndImage) {
  auto c = ParseBundleConfig(R"({"ociVersion": "1.0.2", "process": {"args": ["/bin/sh", "-c", "app & wait"],
      "cwd": "/srv", "env": ["PATH=/bin", "TOKEN=x"]},
      "annotations": {"io.kubernetes.cri.image-name": "localhost/app:1", "other": "y"}})",
                             "config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->args, (std::vector<std::string>{"/bin/sh", "-c", "app & wait"}));
  EXPECT_EQ(c->cwd, "/srv");
  EXPECT_EQ(c->env.size(), 2u);
  EXPECT_EQ(c->image(), "localhost/app:1");
  EXPECT_EQ(c->image_id(), "");
}

TEST(OciBundle, DefaultsTheCwdAndKnowsNoImageWithoutTheAnnotation) {
  auto c = ParseBundleConfig(R"({"process": {"args": ["/pause"]}})", "config.json");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->cwd, "/");
  EXPECT_EQ(c->image(), "");
}

TEST(OciBundle, RefusesWhatIsNoRuntimeConfigNamingWhere) {
  for (const char* text : {"[]", "{", R"({"process": {}})", R"({"process": {"args": []}})",
                           R"({"process": {"args": [1]}})"}) {
    auto c = ParseBundleConfig(text, "/run/x/config.json");
    ASSERT_FALSE(c.ok()) << text;
    EXPECT_EQ(c.status().code(), Code::kCorruption);
    EXPECT_NE(c.status().message().find("/run/x/config.json"), std::string::npos) << c.status().message();
  }
}

}  // namespace
}  // namespace gpusnap::container
