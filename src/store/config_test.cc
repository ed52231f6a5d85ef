#include "store/config.h"

#include <gtest/gtest.h>

#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap {
namespace {

void ExpectRefused(std::string_view text, const std::string& needle) {
  auto c = StoreConfigFromJson(text);
  ASSERT_FALSE(c.ok()) << text;
  EXPECT_EQ(c.status().code(), Code::kInvalidArgument);
  EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
}

TEST(StoreConfigFromJson, AnEmptyObjectIsAllDefaults) {
  auto c = StoreConfigFromJson("{}");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->chunk_cache_bytes.has_value());
}

TEST(StoreConfigFromJson, TheCacheLimitAsBytesOrAsASize) {
  auto bytes = StoreConfigFromJson(R"({"chunk_cache_bytes": 21474836480})");
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(bytes->chunk_cache_bytes, 20ull << 30);
  auto size = StoreConfigFromJson(R"({"chunk_cache_bytes": "20G"})");
  ASSERT_TRUE(size.ok()) << size.status().ToString();
  EXPECT_EQ(size->chunk_cache_bytes, 20ull << 30);
  auto zero = StoreConfigFromJson(R"({"chunk_cache_bytes": 0})");
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->chunk_cache_bytes, 0u);
}

TEST(StoreConfigFromJson, AValueThatIsNoByteCountIsRefusedQuotingIt) {
  ExpectRefused(R"({"chunk_cache_bytes": -1})", "member `chunk_cache_bytes` is -1, not a byte count");
  ExpectRefused(R"({"chunk_cache_bytes": 1.5})", "is 1.5, not a byte count");
  ExpectRefused(R"({"chunk_cache_bytes": "12x"})", R"(is "12x", not a byte count)");
  ExpectRefused(R"({"chunk_cache_bytes": null})", "is null, not a byte count");
  ExpectRefused(R"({"chunk_cache_bytes": true})", "is true, not a byte count");
}

TEST(StoreConfigFromJson, AMisspeltMemberIsRefusedNotIgnored) {
  ExpectRefused(R"({"chunk_cache_byte": 100})", "unknown member `chunk_cache_byte`");
}

TEST(StoreConfigFromJson, AMemberGivenTwiceIsRefused) {
  ExpectRefused(R"({"chunk_cache_bytes": 100, "chunk_cache_bytes": 0})", "member `chunk_cache_bytes` is given twice");
}

TEST(StoreConfigFromJson, NotAnObjectOrNotJson) {
  ExpectRefused("[]", "array, not a JSON object");
  ExpectRefused("", "syntax error at byte");
  ExpectRefused(R"({"chunk_cache_bytes": )", "syntax error at byte");
}

TEST(ReadStoreConfig, AStoreWithoutTheFileHasTheDefaults) {
  TempDir tmp{"store-config-test"};
  auto c = ReadStoreConfig(tmp.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(c->chunk_cache_bytes.has_value());
}

TEST(ReadStoreConfig, ReadsTheFileAndNamesItWhenItIsWrong) {
  TempDir tmp{"store-config-test"};
  ASSERT_TRUE(WriteFileAtomic(StoreConfigPath(tmp.path()), R"({"chunk_cache_bytes": "512M"})").ok());
  auto c = ReadStoreConfig(tmp.path());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->chunk_cache_bytes, 512ull << 20);
  ASSERT_TRUE(WriteFileAtomic(StoreConfigPath(tmp.path()), "{oops").ok());
  auto bad = ReadStoreConfig(tmp.path());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("store settings `" + tmp.path() + "/config.json`"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace gpusnap
