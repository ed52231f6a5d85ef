#include "util/byte_size.h"

#include <gtest/gtest.h>

namespace gpusnap {
namespace {

uint64_t Bytes(std::string_view text) {
  auto r = ParseByteSize(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status().ToString();
  return r.ok() ? *r : 0;
}

TEST(ParseByteSize, ABareNumberIsBytes) {
  EXPECT_EQ(Bytes("0"), 0u);
  EXPECT_EQ(Bytes("1073741824"), 1073741824u);
  EXPECT_EQ(Bytes("512B"), 512u);
  EXPECT_EQ(Bytes("18446744073709551615"), UINT64_MAX);
}

TEST(ParseByteSize, SuffixesAreBinaryInEitherCase) {
  EXPECT_EQ(Bytes("64K"), 64u << 10);
  EXPECT_EQ(Bytes("512M"), 512ull << 20);
  EXPECT_EQ(Bytes("20G"), 20ull << 30);
  EXPECT_EQ(Bytes("20g"), 20ull << 30);
  EXPECT_EQ(Bytes("1T"), 1ull << 40);
  EXPECT_EQ(Bytes("2P"), 2ull << 50);
  EXPECT_EQ(Bytes("20GiB"), 20ull << 30);
  EXPECT_EQ(Bytes("20GB"), 20ull << 30);
  EXPECT_EQ(Bytes("70mib"), 70ull << 20);
}

TEST(ParseByteSize, AFractionOfAUnitIsRoundedDown) {
  EXPECT_EQ(Bytes("1.5T"), 3ull << 39);
  EXPECT_EQ(Bytes("0.5K"), 512u);
  EXPECT_EQ(Bytes("1.0001K"), 1024u);  // 1024.1024 bytes
}

TEST(ParseByteSize, MalformedSizesAreRefusedQuotingThem) {
  for (std::string_view bad : {"", "G", "-1", "-1G", "12x", "1.5", "1.G", ".5G", "20 G", " 20G", "20G ", "1e9",
                               "0x10", "20Gi", "20GiBs", "20GG", "1,5G"}) {
    auto r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << "`" << bad << "` was taken as " << *r;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(fmt::format("`{}`", bad)), std::string::npos) << r.status().message();
  }
}

TEST(ParseByteSize, MoreThan64BitsIsRefused) {
  for (std::string_view big : {"18446744073709551616", "16384P", "16384.0P", "99999999999999999999999"}) {
    auto r = ParseByteSize(big);
    ASSERT_FALSE(r.ok()) << big;
    EXPECT_NE(r.status().message().find("too large"), std::string::npos) << r.status().message();
  }
  EXPECT_EQ(Bytes("16383P"), 16383ull << 50);
  EXPECT_EQ(Bytes("16383.5P"), (16383ull << 50) + (1ull << 49));
}

}  // namespace
}  // namespace gpusnap
