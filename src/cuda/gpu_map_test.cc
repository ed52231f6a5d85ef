#include "cuda/gpu_map.h"

#include <gtest/gtest.h>

namespace gpusnap::cuda {
namespace {

Uuid U(std::uint8_t last) {
  Uuid u{};
  u[0] = 0xab;
  u[15] = last;
  return u;
}

std::vector<GpuInfo> Gpus(int n, std::uint8_t base = 0) {
  std::vector<GpuInfo> out;
  for (int i = 0; i < n; ++i) {
    GpuInfo g;
    g.index = i;
    g.uuid = U(static_cast<std::uint8_t>(base + i));
    out.push_back(g);
  }
  return out;
}

Result<GpuMap> Translate(const std::string& text, const std::vector<GpuInfo>& old_gpus,
                         const std::vector<GpuInfo>& new_gpus) {
  auto entries = ParseGpuMap(text);
  if (!entries.ok()) return entries.status();
  return TranslateGpuMap(*entries, old_gpus, new_gpus);
}

TEST(CudaUuid, FormatsAndParsesLikeNvidiaSmi) {
  Uuid u{};
  for (size_t i = 0; i < u.size(); ++i) u[i] = static_cast<std::uint8_t>(0x10 * (i % 16) + i);
  std::string text = FormatUuid(u);
  EXPECT_EQ(text, "GPU-00112233-4455-6677-8899-aabbccddeeff");
  auto back = ParseUuid("GPU-00112233-4455-6677-8899-AABBCCDDEEFF");
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, u);
}

TEST(CudaUuid, MalformedIsRejectedQuotingIt) {
  for (const char* bad : {"GPU-0011", "00112233-4455-6677-8899-aabbccddeeff", "GPU-00112233x4455-6677-8899-aabbccddeeff",
                          "GPU-0011223g-4455-6677-8899-aabbccddeeff"}) {
    auto r = ParseUuid(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(bad), std::string::npos);
  }
}

TEST(CudaGpuMap, ParsesIndicesUuidsAndMixed) {
  std::string uuid = FormatUuid(U(1));
  auto entries = ParseGpuMap("0=1, " + uuid + "=0");
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_EQ(entries->size(), 2u);
  EXPECT_EQ((*entries)[0].from.index, 0);
  EXPECT_EQ((*entries)[0].to.index, 1);
  EXPECT_EQ((*entries)[1].from.uuid, U(1));
  EXPECT_EQ((*entries)[1].to.index, 0);
}

TEST(CudaGpuMap, MalformedEntriesAreRejected) {
  for (const char* bad : {"", "0", "0=", "=1", "a=1", "-1=0", "0=1,", "0=1,0=0", "0=GPU-zz"}) {
    auto r = ParseGpuMap(bad);
    EXPECT_FALSE(r.ok()) << "`" << bad << "` was accepted";
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
      EXPECT_NE(r.status().message().find("--gpu-map"), std::string::npos) << r.status().message();
    }
  }
}

TEST(CudaGpuMap, SwapTranslatesToUuidPairsInOldOrder) {
  auto gpus = Gpus(2);
  auto map = Translate("0=1,1=0", gpus, gpus);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_EQ(*map, (GpuMap{{U(0), U(1)}, {U(1), U(0)}}));
}

TEST(CudaGpuMap, OrdinalAfterMapFollowsTheMap) {
  auto here = Gpus(4);
  GpuMap swap{{U(0), U(3)}, {U(3), U(0)}};
  EXPECT_EQ(OrdinalAfterMap(U(0), swap, here), 3);
  EXPECT_EQ(OrdinalAfterMap(U(3), swap, here), 0);
  EXPECT_EQ(OrdinalAfterMap(U(1), swap, here), 1);  // not named: stays
  EXPECT_EQ(OrdinalAfterMap(U(2), {}, here), 2);
}

TEST(CudaGpuMap, OrdinalAfterMapOfNothingOrAGpuNotHere) {
  auto here = Gpus(2);
  EXPECT_EQ(OrdinalAfterMap(Uuid{}, {}, here), std::nullopt);  // not recorded
  EXPECT_EQ(OrdinalAfterMap(U(7), {}, here), std::nullopt);
  EXPECT_EQ(OrdinalAfterMap(U(0), {{U(0), U(9)}}, here), std::nullopt);
  // Another machine: its GPUs by their own UUIDs, reached through the map.
  EXPECT_EQ(OrdinalAfterMap(U(0), {{U(0), U(0x41)}}, Gpus(2, 0x40)), 1);
}

TEST(CudaGpuMap, UuidsAndIndicesMix) {
  auto gpus = Gpus(2);
  auto map = Translate(FormatUuid(U(0)) + "=1,1=" + FormatUuid(U(0)), gpus, gpus);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_EQ(*map, (GpuMap{{U(0), U(1)}, {U(1), U(0)}}));
}

TEST(CudaGpuMap, UnnamedGpusKeepTheirIndexOnAnotherMachine) {
  auto old_gpus = Gpus(2), new_gpus = Gpus(3, 0x40);
  auto map = Translate("0=2", old_gpus, new_gpus);
  ASSERT_TRUE(map.ok()) << map.status().ToString();
  EXPECT_EQ(*map, (GpuMap{{U(0), U(0x42)}, {U(1), U(0x41)}}));
}

TEST(CudaGpuMap, EmptyMapMeansNoRemap) {
  auto gpus = Gpus(2);
  auto map = TranslateGpuMap({}, gpus, gpus);
  ASSERT_TRUE(map.ok());
  EXPECT_TRUE(map->empty());
}

TEST(CudaGpuMap, UnknownIndexOrUuidIsRejected) {
  auto gpus = Gpus(2);
  auto r = Translate("2=0", gpus, gpus);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no checkpointed GPU `2`"), std::string::npos) << r.status().message();
  r = Translate("0=5", gpus, gpus);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no target GPU `5`"), std::string::npos) << r.status().message();
  r = Translate("0=" + FormatUuid(U(9)), gpus, gpus);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(FormatUuid(U(9))), std::string::npos) << r.status().message();
}

TEST(CudaGpuMap, SameGpuByIndexAndUuidIsADuplicate) {
  auto gpus = Gpus(2);
  auto r = Translate("0=1," + FormatUuid(U(0)) + "=0", gpus, gpus);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("mapped twice"), std::string::npos) << r.status().message();
}

TEST(CudaGpuMap, NonPermutationOverTheSameGpusIsRejected) {
  auto gpus = Gpus(2);
  auto r = Translate("0=1", gpus, gpus);  // GPU 1 keeps its index: both land on GPU 1
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("target GPU 1 would receive both GPU 0 and GPU 1"), std::string::npos)
      << r.status().message();
  EXPECT_FALSE(Translate("0=0,1=0", gpus, gpus).ok());
}

TEST(CudaGpuMap, UnmappedGpuWithoutCounterpartIsRejected) {
  auto old_gpus = Gpus(2), new_gpus = Gpus(1, 0x40);
  auto r = Translate("0=0", old_gpus, new_gpus);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("checkpointed GPU 1"), std::string::npos) << r.status().message();
}

TEST(CudaGpuMap, FormatsPairs) {
  EXPECT_EQ(FormatGpuMap({{U(0), U(1)}}), FormatUuid(U(0)) + ">" + FormatUuid(U(1)));
}

TEST(CudaGpuMapSpec, ParsedOnceAndWrittenBackAsGiven) {
  auto map = MakeGpuMapSpec("0=1, 1=0", {});
  ASSERT_TRUE(map.ok()) << map.status().message();
  ASSERT_EQ(map->entries.size(), 2u);
  EXPECT_EQ(*map->entries[0].to.index, 1);
  EXPECT_EQ(map->ToString(), "0=1,1=0");
  auto gpus = MakeGpuMapSpec("", {1, 0});
  ASSERT_TRUE(gpus.ok());
  EXPECT_EQ(gpus->ToString(), "1,0");
  auto none = MakeGpuMapSpec("", {});
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(CudaGpuMapSpec, RefusesBothABadMapAndBadIndices) {
  auto both = MakeGpuMapSpec("0=1", {1});
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("not both"), std::string::npos);
  auto bad = MakeGpuMapSpec("0:1", {});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("`0:1`"), std::string::npos) << bad.status().message();
  auto twice = MakeGpuMapSpec("", {1, 1});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("GPU 1 is named twice"), std::string::npos);
  EXPECT_FALSE(MakeGpuMapSpec("", {-1}).ok());
}

}  // namespace
}  // namespace gpusnap::cuda
