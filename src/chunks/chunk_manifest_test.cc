#include "chunks/chunk_manifest.h"

#include <gtest/gtest.h>

namespace gpusnap::chunks {
namespace {

ChunkRef Hashed(uint8_t fill, uint64_t length) {
  ChunkRef r;
  r.digest.fill(fill);
  r.length = length;
  return r;
}

ChunkRef Zero(uint64_t length) {
  ChunkRef r;
  r.zero = true;
  r.length = length;
  return r;
}

ChunkRef Scratch(uint64_t length) {
  ChunkRef r = Zero(length);
  r.scratch = true;
  return r;
}

ChunkManifest Sample() {
  ChunkManifest m;
  m.allocations.push_back({0x7f0000000000, 2 * kChunkBytes + 5, 0, {Hashed(0xab, kChunkBytes), Zero(kChunkBytes), Hashed(1, 5)}});
  m.allocations.push_back({0x7f1000000000, 0, 3, {}});
  m.allocations.push_back({0x10000, 1, -1, {Zero(1)}});
  m.allocations[1].origin = AllocationOrigin::kApplication;
  m.allocations[0].device_uuid.fill(0x5a);
  return m;
}

TEST(ChunkManifestTest, RoundTrip) {
  ChunkManifest m = Sample();
  auto back = DecodeChunkManifest(EncodeChunkManifest(m));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
}

TEST(ChunkManifestTest, EmptyManifestRoundTrips) {
  auto back = DecodeChunkManifest(EncodeChunkManifest({}));
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->allocations.empty());
}

TEST(ChunkManifestTest, StartsWithMagicAndVersion) {
  std::string bytes = EncodeChunkManifest(Sample());
  EXPECT_EQ(bytes.substr(0, 4), "GPCK");
  EXPECT_EQ(bytes.substr(4, 4), std::string("\x02\x00\x00\x00", 4));
}

TEST(ChunkManifestTest, BadMagic) {
  std::string bytes = EncodeChunkManifest(Sample());
  bytes[0] = 'X';
  auto r = DecodeChunkManifest(bytes, "gpu/12.chunks");
  EXPECT_EQ(r.status().code(), Code::kCorruption);
  EXPECT_NE(r.status().message().find("gpu/12.chunks"), std::string::npos);
}

TEST(ChunkManifestTest, UnknownVersion) {
  std::string bytes = EncodeChunkManifest(Sample());
  bytes[4] = 4;
  auto r = DecodeChunkManifest(bytes);
  EXPECT_EQ(r.status().code(), Code::kNotSupported);
  EXPECT_NE(r.status().message().find("version 4"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("versions 1 to 3"), std::string::npos) << r.status().message();
  bytes[4] = 0;
  EXPECT_EQ(DecodeChunkManifest(bytes).status().code(), Code::kNotSupported);
}

// Scratch chunks: version 3, kind 2, no digest; read back as zero chunks that
// say they are scratch.
ChunkManifest WithScratch() {
  ChunkManifest m = Sample();
  m.allocations.push_back({0x7f2000000000, 2 * kChunkBytes + 7, 0, {Scratch(kChunkBytes), Hashed(3, kChunkBytes),
                                                                    Scratch(7)}});
  m.allocations.push_back({0x7f3000000000, kChunkBytes, 1, {Scratch(kChunkBytes)}});
  return m;
}

TEST(ChunkManifestTest, ScratchChunksRoundTripInVersionThree) {
  ChunkManifest m = WithScratch();
  std::string bytes = EncodeChunkManifest(m);
  EXPECT_EQ(bytes.substr(4, 4), std::string("\x03\x00\x00\x00", 4));
  auto back = DecodeChunkManifest(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, m);
  const ChunkRef& s = back->allocations[3].chunks[0];
  EXPECT_TRUE(s.zero && s.scratch);
  EXPECT_FALSE(back->allocations[0].chunks[1].scratch);  // a plain zero chunk stays one
  // A scratch chunk takes the bytes of a zero one: kind and length, no digest.
  EXPECT_EQ(bytes.size(), EncodeChunkManifest(Sample()).size() + 2 * (8 + 8 + 4 + 1 + 16 + 4) + 4 * 9 + 16);
}

TEST(ChunkManifestTest, WithoutScratchItIsWrittenAsVersionTwo) {
  // What a gpusnap that reads version 2 only can still read.
  std::string bytes = EncodeChunkManifest(Sample());
  EXPECT_EQ(bytes.substr(4, 4), std::string("\x02\x00\x00\x00", 4));
  // Version 2 and 3 differ in nothing else: the same bytes under either number read alike.
  bytes[4] = 3;
  auto r = DecodeChunkManifest(bytes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, Sample());
}

TEST(ChunkManifestTest, ScratchKindBeforeVersionThreeIsCorrupt) {
  std::string bytes = EncodeChunkManifest(WithScratch());
  bytes[4] = 2;
  auto r = DecodeChunkManifest(bytes, "gpu/2.chunks");
  EXPECT_EQ(r.status().code(), Code::kCorruption);
  EXPECT_NE(r.status().message().find("unknown kind 2"), std::string::npos) << r.status().message();
}

TEST(ChunkManifestTest, ScratchTruncatedAtEveryLength) {
  std::string bytes = EncodeChunkManifest(WithScratch());
  for (size_t n = 0; n < bytes.size(); ++n)
    EXPECT_EQ(DecodeChunkManifest(std::string_view(bytes).substr(0, n)).status().code(), Code::kCorruption) << n;
}

// Version 1, as snapshots before the origin and UUID were recorded hold it.
TEST(ChunkManifestTest, VersionOneIsReadWithOriginUnknown) {
  std::string v1("GPCK\x01\x00\x00\x00\x01\x00\x00\x00", 12);
  auto put64 = [&](uint64_t v) { v1.append(reinterpret_cast<const char*>(&v), 8); };
  put64(0x1000);                                   // va
  put64(1);                                        // size
  v1.append("\x02\x00\x00\x00\x01\x00\x00\x00", 8);  // device 2, one chunk
  v1.append("\x00", 1);                            // ZERO
  put64(1);
  auto r = DecodeChunkManifest(v1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->allocations.size(), 1u);
  EXPECT_EQ(r->allocations[0].device, 2);
  EXPECT_EQ(r->allocations[0].origin, AllocationOrigin::kUnknown);
  EXPECT_EQ(r->allocations[0].device_uuid, (std::array<uint8_t, 16>{}));
}

TEST(ChunkManifestTest, UnknownOrigin) {
  ChunkManifest m;
  m.allocations.push_back({0x1000, 1, 0, {Zero(1)}});
  std::string bytes = EncodeChunkManifest(m);
  bytes[12 + 8 + 8 + 4] = 9;  // the origin byte
  EXPECT_EQ(DecodeChunkManifest(bytes).status().code(), Code::kCorruption);
}

TEST(ChunkManifestTest, TruncatedAtEveryLength) {
  std::string bytes = EncodeChunkManifest(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto r = DecodeChunkManifest(std::string_view(bytes).substr(0, n));
    EXPECT_EQ(r.status().code(), Code::kCorruption) << "prefix of " << n << " bytes";
  }
}

TEST(ChunkManifestTest, TrailingBytes) {
  std::string bytes = EncodeChunkManifest(Sample()) + "x";
  EXPECT_EQ(DecodeChunkManifest(bytes).status().code(), Code::kCorruption);
}

TEST(ChunkManifestTest, LengthsNotSummingToSize) {
  ChunkManifest m = Sample();
  m.allocations[0].size += 1;
  auto r = DecodeChunkManifest(EncodeChunkManifest(m));
  EXPECT_EQ(r.status().code(), Code::kCorruption);
  EXPECT_NE(r.status().message().find("0x7f0000000000"), std::string::npos) << r.status().message();
}

TEST(ChunkManifestTest, ChunkLengthOutOfRange) {
  ChunkManifest m;
  m.allocations.push_back({0x1000, kChunkBytes + 1, 0, {Zero(kChunkBytes + 1)}});
  EXPECT_EQ(DecodeChunkManifest(EncodeChunkManifest(m)).status().code(), Code::kCorruption);
  m.allocations[0] = {0x1000, 1, 0, {Zero(0), Zero(1)}};
  EXPECT_EQ(DecodeChunkManifest(EncodeChunkManifest(m)).status().code(), Code::kCorruption);
}

TEST(ChunkManifestTest, UnknownChunkKind) {
  ChunkManifest m;
  m.allocations.push_back({0x1000, 1, 0, {Zero(1)}});
  std::string bytes = EncodeChunkManifest(m);
  bytes[12 + 8 + 8 + 4 + 1 + 16 + 4] = 7;  // the chunk's kind byte
  EXPECT_EQ(DecodeChunkManifest(bytes).status().code(), Code::kCorruption);
}

TEST(ChunkManifestTest, Name) { EXPECT_EQ(ChunkManifestName(4711), "gpu/4711.chunks"); }

TEST(ChunkManifestTest, SuspendedRoot) { EXPECT_EQ(SuspendedRoot("/s"), "/s/suspended"); }

}  // namespace
}  // namespace gpusnap::chunks
