// AdmissionReview in, AdmissionReview out.
#include "k8s/admission.h"

#include <openssl/evp.h>

#include <gtest/gtest.h>

#include "k8s/pod_testing.h"

namespace gpusnap::k8s {
namespace {

using nlohmann::json;
using testing::ApplyPatch;
using testing::Fixture;

json Review(json object, std::string uid = "705ab4f5-6393-11e8-b7cc-42010a800002") {
  return {{"apiVersion", "admission.k8s.io/v1"},
          {"kind", "AdmissionReview"},
          {"request",
           {{"uid", uid},
            {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
            {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
            {"namespace", "inference"},
            {"operation", "CREATE"},
            {"userInfo", {{"username", "system:serviceaccount:kube-system:replicaset-controller"}}},
            {"object", std::move(object)},
            {"oldObject", nullptr},
            {"dryRun", false},
            {"options", {{"apiVersion", "meta.k8s.io/v1"}, {"kind", "CreateOptions"}}}}}};
}

std::string Base64Decode(const std::string& text) {
  std::string out(text.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) return "<not base64>";
  out.resize(static_cast<size_t>(n) - (text.ends_with("==") ? 2 : text.ends_with("=") ? 1 : 0));
  return out;
}

json Response(const AdmissionReply& reply) {
  EXPECT_EQ(reply.http_status, 200) << reply.body;
  EXPECT_EQ(reply.content_type, "application/json");
  json review = json::parse(reply.body);
  EXPECT_EQ(review["apiVersion"], "admission.k8s.io/v1");
  EXPECT_EQ(review["kind"], "AdmissionReview");
  EXPECT_EQ(review["response"]["allowed"], true);
  return review["response"];
}

TEST(Admission, ResponseCarriesUidAndBase64JsonPatch) {
  json pod = Fixture("gpushare-vllm.json");
  auto reply = Admit(Review(pod, "uid-1").dump(), {});
  json resp = Response(reply);
  EXPECT_EQ(resp["uid"], "uid-1");
  EXPECT_EQ(resp["patchType"], "JSONPatch");
  json patch = json::parse(Base64Decode(resp["patch"].get<std::string>()));
  EXPECT_EQ(patch, MutatePod(pod, {})->patch);
  json out = ApplyPatch(pod, patch);
  EXPECT_EQ(out["spec"]["containers"][0]["env"].back()["name"], "LD_PRELOAD");
  EXPECT_NE(reply.log_line.find("uid=uid-1 pod=inference/vllm-7d9f8c6b5-*: gpushare: vllm"), std::string::npos)
      << reply.log_line;
}

TEST(Admission, WarningsPassedOn) {
  json resp = Response(Admit(Review(Fixture("gpushare-mixed.json")).dump(), {}));
  ASSERT_EQ(resp["warnings"].size(), 1u);
  EXPECT_NE(resp["warnings"][0].get<std::string>().find("evaluator"), std::string::npos);
}

TEST(Admission, MalformedReviewIs400) {
  json no_uid = Review(Fixture("gpushare-vllm.json"));
  no_uid["request"].erase("uid");
  json no_object = Review(nullptr);
  json wrong_version = Review(Fixture("gpushare-vllm.json"));
  wrong_version["apiVersion"] = "admission.k8s.io/v1beta1";
  json wrong_kind = Review(Fixture("gpushare-vllm.json"));
  wrong_kind["kind"] = "Pod";
  for (const std::string& body : {std::string("{not json"), std::string("[]"), std::string("{}"), no_uid.dump(),
                                  no_object.dump(), wrong_version.dump(), wrong_kind.dump(),
                                  json({{"apiVersion", "admission.k8s.io/v1"}, {"kind", "AdmissionReview"}}).dump()}) {
    auto reply = Admit(body, {});
    EXPECT_EQ(reply.http_status, 400) << body;
    EXPECT_EQ(reply.content_type, "text/plain");
    EXPECT_NE(reply.body.find("malformed AdmissionReview"), std::string::npos);
  }
}

TEST(Admission, NotAPodCreationAllowedUnchanged) {
  json update = Review(Fixture("gpushare-vllm.json"));
  update["request"]["operation"] = "UPDATE";
  json deployment = Review(json::object());
  deployment["request"]["kind"] = {{"group", "apps"}, {"version", "v1"}, {"kind", "Deployment"}};
  json binding = Review(Fixture("gpushare-vllm.json"));
  binding["request"]["subResource"] = "binding";
  for (const json& review : {update, deployment, binding}) {
    json resp = Response(Admit(review.dump(), {}));
    EXPECT_EQ(resp["uid"], review["request"]["uid"]);
    EXPECT_FALSE(resp.contains("patch"));
  }
}

TEST(Admission, UnannotatedPodAllowedWithoutPatch) {
  json pod = Fixture("gpushare-vllm.json");
  pod["metadata"].erase("annotations");
  json resp = Response(Admit(Review(pod).dump(), {}));
  EXPECT_FALSE(resp.contains("patch"));
  EXPECT_FALSE(resp.contains("patchType"));
  EXPECT_FALSE(resp.contains("warnings"));
}

TEST(Admission, MutationErrorAllowsPodUnchangedWithWarning) {
  json pod = Fixture("restore-placeholder.json");
  pod["metadata"]["annotations"]["gpusnap.io/restore-from"] = "../x";
  auto reply = Admit(Review(pod, "uid-err").dump(), {});
  json resp = Response(reply);
  EXPECT_EQ(resp["uid"], "uid-err");
  EXPECT_FALSE(resp.contains("patch"));
  ASSERT_EQ(resp["warnings"].size(), 1u);
  EXPECT_NE(resp["warnings"][0].get<std::string>().find("admitted unchanged"), std::string::npos);
}

TEST(Admission, ThrowingLookupAllowsPodUnchangedWithWarning) {
  MutateConfig config;
  config.snapshot_gpu_count = [](const std::string&) -> Result<int> { throw std::runtime_error("lookup exploded"); };
  json pod = Fixture("restore-placeholder.json");
  pod["metadata"]["annotations"].erase("gpusnap.io/gpu-count");
  json resp = Response(Admit(Review(pod, "uid-bug").dump(), config));
  EXPECT_EQ(resp["uid"], "uid-bug");
  EXPECT_FALSE(resp.contains("patch"));
  EXPECT_NE(resp["warnings"][0].get<std::string>().find("lookup exploded"), std::string::npos);
}

TEST(Admission, Base64KnownVectors) {  // RFC 4648 §10
  EXPECT_EQ(Base64Encode(""), "");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
}

}  // namespace
}  // namespace gpusnap::k8s
