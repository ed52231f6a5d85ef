// The webhook's mutation. Every patch is applied with nlohmann-json and with
// the real kubectl (kubectl_testing.h), and every mutated pod is mutated again
// to check that the second pass adds nothing.
#include "k8s/mutate.h"

#include <gtest/gtest.h>

#include "k8s/pod_testing.h"

namespace gpusnap::k8s {
namespace {

using nlohmann::json;
using namespace testing;  // NOLINT: the test helpers

constexpr const char* kShim = "/gpusnap/lib/libgpusnap_gpushare.so";

json PatchPaths(const Mutation& m) {
  json paths = json::array();
  for (const json& op : m.patch) paths.push_back(op["path"]);
  return paths;
}

json WithEnv(json pod, const std::string& container, json env) {
  for (json& c : pod["spec"]["containers"])
    if (c["name"] == container) c["env"] = std::move(env);
  return pod;
}

// ---------------------------------------------------------------- gpushare

TEST(Gpushare, LdPreloadAddedWhenAbsent) {
  auto r = MutateChecked(Fixture("gpushare-vllm.json"));
  EXPECT_EQ(Env(Container(r.pod, "vllm"), "LD_PRELOAD")["value"], kShim);
  EXPECT_EQ(Env(Container(r.pod, "vllm"), "HF_HOME")["value"], "/models/hf");
}

TEST(Gpushare, LdPreloadAppendedToLiteralValue) {
  auto r = MutateChecked(Fixture("gpushare-mixed.json"));
  EXPECT_EQ(Env(Container(r.pod, "trainer"), "LD_PRELOAD")["value"],
            std::string("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2:") + kShim);
}

TEST(Gpushare, LdPreloadAlreadyListingTheShimUnchanged) {
  std::string value = std::string("/lib/a.so ") + kShim;
  json pod = WithEnv(Fixture("gpushare-vllm.json"), "vllm", {{{"name", "LD_PRELOAD"}, {"value", value}}});
  auto r = MutateChecked(pod);
  EXPECT_EQ(Env(Container(r.pod, "vllm"), "LD_PRELOAD")["value"], value);
}

TEST(Gpushare, EmptyLdPreloadBecomesTheShim) {
  json pod = WithEnv(Fixture("gpushare-vllm.json"), "vllm", {{{"name", "LD_PRELOAD"}, {"value", ""}}});
  EXPECT_EQ(Env(Container(MutateChecked(pod).pod, "vllm"), "LD_PRELOAD")["value"], kShim);
}

TEST(Gpushare, ValueFromLdPreloadSkippedWithWarning) {
  json pod = Fixture("gpushare-mixed.json");
  auto r = MutateChecked(pod);
  EXPECT_EQ(Container(r.pod, "evaluator"), Container(pod, "evaluator"));
  EXPECT_TRUE(HasWarningAbout(r.m, "evaluator")) << r.m.summary;
  EXPECT_TRUE(HasWarningAbout(r.m, "valueFrom"));
}

TEST(Gpushare, SecondPassAddsNothing) {
  for (const char* f : {"gpushare-vllm.json", "gpushare-mixed.json", "restore-placeholder.json"}) {
    json once = MutateChecked(Fixture(f)).pod;
    auto twice = MutatePod(once, {});
    ASSERT_TRUE(twice.ok()) << f;
    EXPECT_EQ(twice->patch, json::array()) << f;
    EXPECT_EQ(twice->warnings.size(), MutatePod(Fixture(f), {})->warnings.size()) << f;
  }
}

TEST(Gpushare, BundleMountedReadOnly) {
  auto r = MutateChecked(Fixture("gpushare-vllm.json"));
  json m = MountAt(Container(r.pod, "vllm"), "/gpusnap");
  EXPECT_EQ(m["readOnly"], true);
  EXPECT_EQ(Volume(r.pod, m["name"])["hostPath"],
            json({{"path", "/var/lib/gpusnap/bundle"}, {"type", "Directory"}}));
}

TEST(Gpushare, BundleVolumeAlreadyPresentReused) {
  json pod = Fixture("gpushare-vllm.json");
  pod["spec"]["volumes"].push_back({{"name", "host-gpusnap"}, {"hostPath", {{"path", "/var/lib/gpusnap/bundle"}}}});
  auto r = MutateChecked(pod);
  EXPECT_EQ(MountAt(Container(r.pod, "vllm"), "/gpusnap")["name"], "host-gpusnap");
  EXPECT_EQ(Volume(r.pod, "gpusnap-bundle"), nullptr);
  EXPECT_EQ(r.pod["spec"]["volumes"].size(), pod["spec"]["volumes"].size() + 1);  // the store only
}

TEST(Gpushare, BundleMountAlreadyPresentReused) {
  json pod = Fixture("gpushare-vllm.json");
  pod["spec"]["volumes"].push_back({{"name", "gpusnap-bundle"}, {"hostPath", {{"path", "/var/lib/gpusnap/bundle"}}}});
  pod["spec"]["containers"][0]["volumeMounts"].push_back(
      {{"name", "gpusnap-bundle"}, {"mountPath", "/gpusnap"}, {"readOnly", true}});
  auto r = MutateChecked(pod);
  int bundles = 0;
  for (const json& m : Container(r.pod, "vllm")["volumeMounts"]) bundles += m["name"] == "gpusnap-bundle";
  EXPECT_EQ(bundles, 1);
}

TEST(Gpushare, BundleVolumeNameTakenGetsSuffix) {
  json pod = Fixture("gpushare-vllm.json");
  pod["spec"]["volumes"].push_back({{"name", "gpusnap-bundle"}, {"emptyDir", json::object()}});
  auto r = MutateChecked(pod);
  EXPECT_EQ(MountAt(Container(r.pod, "vllm"), "/gpusnap")["name"], "gpusnap-bundle-2");
  EXPECT_EQ(Volume(r.pod, "gpusnap-bundle")["emptyDir"], json::object());
}

TEST(Gpushare, ChunkStoreMountedWithSubPathExprOfPodUid) {
  auto r = MutateChecked(Fixture("gpushare-vllm.json"));
  const json& c = Container(r.pod, "vllm");
  json m = MountAt(c, "/gpusnap-store");
  EXPECT_EQ(m["subPathExpr"], "$(GPUSNAP_POD_UID)");
  EXPECT_FALSE(m.contains("readOnly"));
  EXPECT_EQ(Volume(r.pod, m["name"])["hostPath"],
            json({{"path", "/var/lib/gpusnap/pods"}, {"type", "DirectoryOrCreate"}}));
  EXPECT_EQ(Env(c, "GPUSNAP_POD_UID")["valueFrom"], json({{"fieldRef", {{"fieldPath", "metadata.uid"}}}}));
  EXPECT_EQ(Env(c, "GPUSNAP_CHUNK_STORE")["value"], "/gpusnap-store");
}

// The variable names the chunk store the pod mounts: a value of the pod's own
// (another pod's uid, or "" for every pod's store) is replaced, every
// definition of it, so that the kubelet (which takes the last) sees the uid.
TEST(Gpushare, APodsOwnPodUidVariableIsReplacedByItsUid) {
  json uid = {{"name", "GPUSNAP_POD_UID"}, {"valueFrom", {{"fieldRef", {{"fieldPath", "metadata.uid"}}}}}};
  for (json value : {json("3f0b7c1e-0000-4000-8000-000000000000"), json("")}) {
    json mine = {{"name", "GPUSNAP_POD_UID"}, {"value", value}};
    json other = {{"name", "OTHER"}, {"value", "kept"}};
    auto r = MutateChecked(WithEnv(Fixture("gpushare-vllm.json"), "vllm", {mine, other, mine}));
    const json& env = Container(r.pod, "vllm")["env"];
    int defined = 0;
    for (const json& e : env) defined += e["name"] == "GPUSNAP_POD_UID";
    EXPECT_EQ(defined, 1) << env;
    EXPECT_EQ(Env(Container(r.pod, "vllm"), "GPUSNAP_POD_UID"), uid);
    EXPECT_EQ(Env(Container(r.pod, "vllm"), "OTHER"), other);
  }
}

TEST(Gpushare, InitContainersMutated) {
  json pod = Fixture("gpushare-mixed.json");
  auto r = MutateChecked(pod);
  const json& warmup = Container(r.pod, "warmup");
  EXPECT_EQ(Env(warmup, "LD_PRELOAD")["value"], kShim);
  EXPECT_NE(MountAt(warmup, "/gpusnap"), nullptr);
  EXPECT_NE(MountAt(warmup, "/gpusnap-store"), nullptr);
  EXPECT_EQ(Container(r.pod, "fetch"), Container(pod, "fetch"));  // no GPU
}

TEST(Gpushare, SeveralContainersOnlyGpuOnesTouched) {
  json pod = Fixture("gpushare-mixed.json");
  auto r = MutateChecked(pod);
  EXPECT_NE(MountAt(Container(r.pod, "trainer"), "/gpusnap"), nullptr);
  EXPECT_EQ(Container(r.pod, "metrics"), Container(pod, "metrics"));  // nvidia.com/gpu: "0"
  json record = json::parse(r.pod["metadata"]["annotations"]["gpusnap.io/mutation"].get<std::string>());
  EXPECT_EQ(record, json({{"gpushare", {"trainer", "warmup"}}}));
  EXPECT_EQ(r.m.summary, "gpushare: trainer, warmup");
  // One bundle and one store volume, shared by all.
  EXPECT_EQ(r.pod["spec"]["volumes"].size(), pod["spec"]["volumes"].size() + 2);
}

TEST(Gpushare, GpuCountGivenAsJsonNumber) {
  // kube-apiserver sends quantities as strings; a number in a hand-written review still counts.
  json pod = Fixture("gpushare-mixed.json");
  pod["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1;
  pod["spec"]["containers"][2]["resources"]["limits"]["nvidia.com/gpu"] = 0;  // metrics
  auto r = MutateChecked(pod);
  EXPECT_NE(MountAt(Container(r.pod, "warmup"), "/gpusnap"), nullptr);
  EXPECT_EQ(Container(r.pod, "metrics"), Container(pod, "metrics"));
}

TEST(Gpushare, MountPathTakenSkipsContainerWithWarning) {
  json pod = Fixture("gpushare-vllm.json");
  pod["spec"]["containers"][0]["volumeMounts"].push_back({{"name", "models"}, {"mountPath", "/gpusnap"}});
  auto r = MutateChecked(pod);
  EXPECT_EQ(Container(r.pod, "vllm"), Container(pod, "vllm"));
  EXPECT_TRUE(HasWarningAbout(r.m, "/gpusnap"));
  EXPECT_EQ(Volume(r.pod, "gpusnap-bundle"), nullptr);  // no volume nobody mounts
}

TEST(Gpushare, AnnotationKeysEscapedInJsonPointers) {
  json pod = Fixture("gpushare-vllm.json");
  pod["metadata"]["annotations"]["gpusnap.io/restore-from"] = "snap-1";
  auto r = MutateChecked(pod);
  json paths = PatchPaths(r.m);
  for (const char* want : {"/metadata/annotations/gpusnap.io~1mutation", "/metadata/annotations/gpusnap.io~1original-command",
                           "/metadata/labels/gpusnap.io~1placeholder"})
    EXPECT_NE(std::find(paths.begin(), paths.end(), want), paths.end()) << want << " not in " << paths.dump();
  EXPECT_EQ(r.pod["metadata"]["labels"]["gpusnap.io/placeholder"], "true");
}

TEST(Gpushare, AnnotationsObjectCreatedWhenAbsent) {
  json pod = Fixture("gpushare-vllm.json");
  pod["metadata"].erase("annotations");
  pod["metadata"]["labels"] = {{"x", "y"}};
  pod["metadata"]["annotations"] = {{"gpusnap.io/gpushare", "true"}};
  auto r = MutateChecked(pod);
  EXPECT_TRUE(r.pod["metadata"]["annotations"].contains("gpusnap.io/mutation"));
}

TEST(Gpushare, ValueOtherThanTrueIgnoredWithWarning) {
  json pod = Fixture("gpushare-vllm.json");
  pod["metadata"]["annotations"]["gpusnap.io/gpushare"] = "yes";
  auto r = MutateChecked(pod);
  EXPECT_EQ(r.m.patch, json::array());
  EXPECT_TRUE(HasWarningAbout(r.m, "gpusnap.io/gpushare"));
}

TEST(Gpushare, UnannotatedPodGetsNoPatch) {
  json pod = Fixture("gpushare-vllm.json");
  pod["metadata"]["annotations"].erase("gpusnap.io/gpushare");
  auto r = MutateChecked(pod);
  EXPECT_EQ(r.m.patch, json::array());
  EXPECT_TRUE(r.m.warnings.empty());
}

TEST(Gpushare, PodWithoutGpuContainersOnlyRecorded) {
  json pod = Fixture("gpushare-vllm.json");
  pod["spec"]["containers"][0]["resources"] = json::object();
  auto r = MutateChecked(pod);
  EXPECT_EQ(Container(r.pod, "vllm"), Container(pod, "vllm"));
  EXPECT_EQ(r.m.summary, "gpushare: no GPU container");
  EXPECT_EQ(r.pod["spec"]["volumes"], pod["spec"]["volumes"]);
}

TEST(Gpushare, PodOfWrongShapeIsError) {
  json pod = Fixture("gpushare-vllm.json");
  pod["spec"]["containers"][0]["env"] = {{"name", "X"}};  // an object, not an array
  auto r = MutatePod(pod, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  EXPECT_NE(r.status().message().find("spec.containers[0].env"), std::string::npos) << r.status().ToString();
  EXPECT_FALSE(MutatePod(json::array(), {}).ok());
  EXPECT_FALSE(MutatePod(json({{"spec", {{"containers", 3}}}}), {}).ok());
}

}  // namespace
}  // namespace gpusnap::k8s
