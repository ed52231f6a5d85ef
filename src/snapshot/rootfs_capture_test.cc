#include "snapshot/rootfs_capture.h"

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

TEST(RootfsRequest, CacheDirectoriesMustBeCleanAbsoluteDistinctAndApart) {
  EXPECT_TRUE(CheckRootfsRequest({"/root/.triton", "/var/cache/hub"}, {"/tmp", "/**/__pycache__"}).ok());
  for (auto [cache, why] : std::vector<std::pair<std::string, std::string>>{
           {"cache", "not an absolute container path"},
           {"/", "the root is captured by the diff"},
           {"/a/*", "not a pattern"},
           {"/a/../etc", "not a clean path"},
           {"/a/", "not a clean path"},
           {"/a//b", "not a clean path"},
           {"/a/.", "not a clean path"}}) {
    Status st = CheckRootfsRequest({cache}, {});
    ASSERT_FALSE(st.ok()) << cache;
    EXPECT_EQ(st.code(), Code::kInvalidArgument);
    EXPECT_NE(st.message().find(why), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("`" + cache + "`"), std::string::npos) << st.message();
  }
  EXPECT_NE(CheckRootfsRequest({"/c", "/c"}, {}).message().find("named twice"), std::string::npos);
  EXPECT_NE(CheckRootfsRequest({"/c", "/c/d"}, {}).message().find("`/c/d` lies inside cache directory `/c`"),
            std::string::npos);
  EXPECT_FALSE(CheckRootfsRequest({}, {"relative"}).ok());
}

}  // namespace
}  // namespace gpusnap
