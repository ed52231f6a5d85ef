#include "store/snapshot_ref.h"

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

TEST(SnapshotRef, AnIdIsAnId) {
  auto s = ParseSnapshotRef("server-20261201-101010-ab12");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_FALSE(s->from_registry());
  EXPECT_EQ(s->id, "server-20261201-101010-ab12");
  EXPECT_EQ(s->ToString(), "server-20261201-101010-ab12");
}

TEST(SnapshotRef, TextWithASlashIsAReferenceParsedOnce) {
  auto s = ParseSnapshotRef("127.0.0.1:5000/team/llm:v1");
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_TRUE(s->from_registry());
  EXPECT_EQ(s->reference->host, "127.0.0.1:5000");
  EXPECT_EQ(s->reference->repository, "team/llm");
  EXPECT_EQ(s->reference->tag, "v1");
  EXPECT_TRUE(s->id.empty());
  EXPECT_EQ(s->ToString(), "127.0.0.1:5000/team/llm:v1");
}

TEST(SnapshotRef, ABadReferenceSaysWhyAsAReference) {
  auto s = ParseSnapshotRef("127.0.0.1:5000/Team/llm");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  EXPECT_NE(s.status().message().find("invalid snapshot id `127.0.0.1:5000/Team/llm` (an id holds no `/`), nor a "
                                      "registry reference: invalid registry reference"),
            std::string::npos)
      << s.status().message();
}

TEST(SnapshotRef, ABadIdNamesBothGrammars) {
  for (const char* text : {"", ".hidden", "a b", "x;y"}) {
    auto s = ParseSnapshotRef(text);
    ASSERT_FALSE(s.ok()) << text;
    EXPECT_NE(s.status().message().find("invalid snapshot id `" + std::string(text) + "`"), std::string::npos)
        << s.status().message();
    EXPECT_NE(s.status().message().find("nor a registry reference"), std::string::npos) << s.status().message();
  }
}

}  // namespace
}  // namespace gpusnap
