#include "registry/redirect.h"

#include <gtest/gtest.h>

namespace gpusnap::registry {
namespace {

constexpr const char* kBlob = "https://reg:5000/v2/team/app/blobs/sha256:ab";

TEST(RegistryRedirect, AbsoluteUrlsAreTakenAsTheyAre) {
  EXPECT_EQ(*ResolveRedirect(kBlob, "https://bucket.example/x?sig=1"), "https://bucket.example/x?sig=1");
  EXPECT_EQ(*ResolveRedirect("http://reg:5000/v2/a/blobs/d", "http://other:9/y"), "http://other:9/y");
  EXPECT_EQ(*ResolveRedirect("http://reg:5000/v2/a/blobs/d", "https://other:9/y"), "https://other:9/y");
}

TEST(RegistryRedirect, RelativeLocationsResolveAgainstTheRequest) {
  EXPECT_EQ(*ResolveRedirect(kBlob, "/storage/ab?x=1"), "https://reg:5000/storage/ab?x=1");
  EXPECT_EQ(*ResolveRedirect(kBlob, "//cdn:8443/ab"), "https://cdn:8443/ab");
  EXPECT_EQ(*ResolveRedirect(kBlob, "other"), "https://reg:5000/v2/team/app/blobs/other");
  EXPECT_EQ(*ResolveRedirect("http://reg/v2/a/blobs/d?q=/x", "e"), "http://reg/v2/a/blobs/e");
}

TEST(RegistryRedirect, HttpsNeverStepsDownToHttpAndTheErrorNamesBoth) {
  auto r = ResolveRedirect(kBlob, "http://reg:5000/storage/ab");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(kBlob), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("`http://reg:5000/storage/ab`"), std::string::npos) << r.status().message();
  EXPECT_EQ(*ResolveRedirect(kBlob, "//cdn/ab"), "https://cdn/ab");
}

TEST(RegistryRedirect, NoLocationOrAnotherSchemeIsRefused) {
  EXPECT_FALSE(ResolveRedirect(kBlob, "").ok());
  EXPECT_FALSE(ResolveRedirect(kBlob, "file:///etc/passwd").ok());
  EXPECT_FALSE(ResolveRedirect(kBlob, "ftp://x/y").ok());
}

}  // namespace
}  // namespace gpusnap::registry
