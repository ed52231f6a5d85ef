#include "registry/artifact.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace gpusnap::registry {
namespace {

std::string D(char c) { return BlobDigest(std::string(64, c)); }

Artifact Sample() {
  Artifact a;
  a.snapshot_id = "ckpt-1";
  a.config = {D('c'), 900, {}};
  a.files = {{"checkpoint/pages-1.img", {D('1'), 4096, {}}}, {"gpu/7.chunks", {D('2'), 120, {}}}};
  a.chunks = {{std::string(32, 'a'), {D('3'), 64 << 20, {}}}};
  return a;
}

TEST(ArtifactTest, TheManifestReadsBackAsItWasWritten) {
  std::string bytes = ManifestJson(Sample());
  auto m = nlohmann::json::parse(bytes);
  EXPECT_EQ(m["artifactType"], kArtifactType);
  EXPECT_EQ(m["config"]["mediaType"], kConfigMediaType);
  EXPECT_EQ(m["layers"][0]["annotations"][kTitleAnnotation], "checkpoint/pages-1.img");
  EXPECT_EQ(m["layers"][2]["annotations"][kChunkAnnotation], std::string(32, 'a'));
  auto back = ParseManifest(bytes, kManifestMediaType, "r");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back, Sample());
}

std::string Edited(const std::function<void(nlohmann::json&)>& edit) {
  auto m = nlohmann::json::parse(ManifestJson(Sample()));
  edit(m);
  return m.dump();
}

TEST(ArtifactTest, RefusesWhatIsNotOurArtifactNamingWhy) {
  struct Case {
    std::string bytes;
    const char* why;
  } cases[] = {
      {"[1]", "not a JSON object"},
      {R"({"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]})", "image index"},
      {Edited([](auto& m) {
         m.erase("artifactType");
         m["config"]["mediaType"] = "application/vnd.oci.image.config.v1+json";
       }), "container image"},
      {Edited([](auto& m) { m["artifactType"] = "application/vnd.other"; }), "`application/vnd.other`"},
      {Edited([](auto& m) { m["layers"][0]["annotations"][kTitleAnnotation] = "../../etc/passwd"; }), "`../../etc/passwd`"},
      {Edited([](auto& m) { m["layers"][0]["annotations"][kTitleAnnotation] = "/etc/passwd"; }), "not a relative path"},
      {Edited([](auto& m) { m["layers"][1]["annotations"][kTitleAnnotation] = "checkpoint/pages-1.img"; }), "twice"},
      {Edited([](auto& m) { m["layers"][0]["digest"] = "md5:abc"; }), "md5:abc"},
      {Edited([](auto& m) { m["layers"][2]["annotations"][kChunkAnnotation] = "zz"; }), "not 32 hex"},
      {Edited([](auto& m) { m["layers"][2]["mediaType"] = "application/x-tar"; }), "`application/x-tar`"},
      {Edited([](auto& m) { m["layers"][0].erase("size"); }), "no size"},
  };
  for (const auto& c : cases) {
    auto r = ParseManifest(c.bytes, kManifestMediaType, "host/repo:v1");
    ASSERT_FALSE(r.ok()) << c.why;
    EXPECT_NE(r.status().message().find(c.why), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("host/repo:v1"), std::string::npos);
  }
}

}  // namespace
TEST(ArtifactTest, DistinctBlobsKeepsTheFirstOfEachDigestInOrder) {
  std::vector<Blob> blobs = {{"sha256:a", 1, {}}, {"sha256:b", 2, {}}, {"sha256:a", 1, {}}, {"sha256:c", 3, {}}, {"sha256:b", 2, {}}};
  EXPECT_EQ(DistinctBlobs(blobs), (std::vector<size_t>{0, 1, 3}));
  EXPECT_TRUE(DistinctBlobs({}).empty());
}

}  // namespace gpusnap::registry

namespace gpusnap::registry {
namespace {

Artifact EncryptedSample() {
  Artifact a = Sample();
  BlobEncryption enc{"andl", "cHVi"};
  a.config.encryption = a.files[0].blob.encryption = a.files[1].blob.encryption = enc;
  a.chunks.push_back({std::string(32, 'b'), {D('4'), 100, enc}});
  a.chunks[0].blob.encryption = enc;
  return a;
}

TEST(ArtifactTest, AnEncryptedManifestIsOcicryptsAndNamesNoChunk) {
  auto m = nlohmann::json::parse(ManifestJson(EncryptedSample()));
  EXPECT_EQ(m["config"]["mediaType"], kEncryptedConfigMediaType);
  EXPECT_EQ(m["config"]["annotations"][kJweKeysAnnotation], "andl");
  EXPECT_EQ(m["config"]["annotations"][kPublicOptionsAnnotation], "cHVi");
  EXPECT_EQ(m["layers"][0]["mediaType"], std::string(kFileMediaType) + "+encrypted");
  EXPECT_EQ(m["layers"][0]["annotations"][kTitleAnnotation], "checkpoint/pages-1.img");
  EXPECT_EQ(m["layers"][2]["mediaType"], std::string(kChunkMediaType) + "+encrypted");
  // A chunk's name is the XXH3 of its plaintext: equal in every tenant's artifact, so not shown.
  EXPECT_FALSE(m["layers"][2]["annotations"].contains(kChunkAnnotation));
  EXPECT_FALSE(m["layers"][3]["annotations"].contains(kChunkAnnotation));

  auto back = ParseManifest(m.dump(), kManifestMediaType, "r");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->config, EncryptedSample().config);
  EXPECT_EQ(back->files, EncryptedSample().files);
  ASSERT_EQ(back->chunks.size(), 2u);
  EXPECT_EQ(back->chunks[0].xxh3, "");
  EXPECT_EQ(back->chunks[1].blob, EncryptedSample().chunks[1].blob);

  // The names come in order from the snapshot's chunk manifests.
  EXPECT_TRUE(NameChunksInOrder(*back, {std::string(32, 'a'), std::string(32, 'b')}, "r").ok());
  EXPECT_EQ(*back, EncryptedSample());
  Artifact again = *ParseManifest(m.dump(), kManifestMediaType, "r");
  auto short_of_one = NameChunksInOrder(again, {std::string(32, 'a')}, "r");
  ASSERT_FALSE(short_of_one.ok());
  EXPECT_NE(short_of_one.message().find("name 1 chunks, the artifact holds 2"), std::string::npos);
}

TEST(ArtifactTest, WithoutAnArtifactTypeTheConfigsTypeNamesIt) {
  for (const Artifact& a : {Sample(), EncryptedSample()}) {
    auto m = nlohmann::json::parse(ManifestJson(a));
    m.erase("artifactType");
    auto back = ParseManifest(m.dump(), kManifestMediaType, "r");
    ASSERT_TRUE(back.ok()) << back.status().message();
    EXPECT_EQ(back->config, a.config);
  }
}

TEST(ArtifactTest, RefusesEncryptedBlobsWithoutTheirKeyAndHalfNamedChunks) {
  auto m = nlohmann::json::parse(ManifestJson(EncryptedSample()));
  auto keyless = m;
  keyless["layers"][1]["annotations"].erase(kJweKeysAnnotation);
  auto r = ParseManifest(keyless.dump(), kManifestMediaType, "r");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("file `gpu/7.chunks` is encrypted"), std::string::npos);
  auto half = m;
  half["layers"][2]["annotations"][kChunkAnnotation] = std::string(32, 'a');
  r = ParseManifest(half.dump(), kManifestMediaType, "r");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("1 of its chunk layers are named and 1 are not"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap::registry
