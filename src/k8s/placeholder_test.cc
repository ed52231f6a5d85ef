// The restore-from mutation: a pod becomes a placeholder the agent restores
// into. Patches are cross-checked with kubectl and mutated twice
// (pod_testing.h).
#include <gtest/gtest.h>

#include <set>

#include "k8s/mutate.h"
#include "k8s/pod_testing.h"

namespace gpusnap::k8s {
namespace {

using nlohmann::json;
using namespace testing;  // NOLINT: the test helpers

json Placeholder() { return Fixture("restore-placeholder.json"); }

json Limits(const json& c) { return c["resources"]["limits"]; }

MutateConfig WithLookup(std::function<Result<int>(const std::string&)> lookup) {
  MutateConfig config;
  config.snapshot_gpu_count = std::move(lookup);
  return config;
}

TEST(Placeholder, KeepsImageAndRunsTheReaper) {
  json pod = Placeholder();
  auto r = MutateChecked(pod);
  const json& c = Container(r.pod, "vllm");
  EXPECT_EQ(c["image"], pod["spec"]["containers"][0]["image"]);
  EXPECT_EQ(c["command"], json({"/gpusnap/bin/gpusnap", "__placeholder"}));
  EXPECT_FALSE(c.contains("args"));
  json original = json::parse(r.pod["metadata"]["annotations"]["gpusnap.io/original-command"].get<std::string>());
  EXPECT_EQ(original["command"], pod["spec"]["containers"][0]["command"]);
  EXPECT_EQ(original["args"], pod["spec"]["containers"][0]["args"]);
}

TEST(Placeholder, MountsTheBundleReadOnly) {
  auto r = MutateChecked(Placeholder());
  const json& c = Container(r.pod, "vllm");
  json bundle = MountAt(c, "/gpusnap");
  EXPECT_EQ(bundle["readOnly"], true);
  EXPECT_EQ(Volume(r.pod, bundle["name"])["hostPath"]["path"], "/var/lib/gpusnap/bundle");
  EXPECT_EQ(Env(c, "LD_PRELOAD"), nullptr);  // the reaper never gets the shim
}

// No snapshot, and nothing else of the store, reaches a pod's filesystem: the
// agent reads the store and hands CRIU its images (docs/SECURITY.md). The
// only host paths are the bundle (read-only) and, with gpushare, the pod's
// own chunk store under its uid.
TEST(Placeholder, NoHostPathOfTheStoreIsMounted) {
  for (const char* from : {"vllm-20250101-abc123", "registry.example:5000/ml/vllm:warm"}) {
    for (bool gpushare : {false, true}) {
      json pod = Placeholder();
      pod["metadata"]["annotations"]["gpusnap.io/restore-from"] = from;
      if (gpushare) pod["metadata"]["annotations"]["gpusnap.io/gpushare"] = "true";
      auto r = MutateChecked(pod);
      std::set<std::string> host_paths;
      for (const json& v : r.pod["spec"]["volumes"])
        if (v.contains("hostPath")) host_paths.insert(v["hostPath"]["path"].get<std::string>());
      std::set<std::string> expected = {"/var/lib/gpusnap/bundle"};
      if (gpushare) expected.insert("/var/lib/gpusnap/pods");
      EXPECT_EQ(host_paths, expected) << from << (gpushare ? " with gpushare" : "");
      for (const json& m : Container(r.pod, "vllm")["volumeMounts"]) {
        EXPECT_NE(m["mountPath"], "/gpusnap-snapshot") << m;
        if (m["mountPath"] == "/gpusnap-store") {
          EXPECT_EQ(m["subPathExpr"], "$(GPUSNAP_POD_UID)") << m;
        }
      }
    }
  }
}

TEST(Placeholder, LabelledForTheAgent) {
  auto r = MutateChecked(Placeholder());
  EXPECT_EQ(r.pod["metadata"]["labels"], json({{"gpusnap.io/placeholder", "true"}}));
  json record = json::parse(r.pod["metadata"]["annotations"]["gpusnap.io/mutation"].get<std::string>());
  EXPECT_EQ(record["restore"], json({{"container", "vllm"}, {"snapshot", "vllm-20250101-abc123"}, {"gpus", 2}}));
}

TEST(Placeholder, GpuCountFromAnnotation) {
  bool asked = false;
  auto r = MutateChecked(Placeholder(), WithLookup([&](const std::string&) -> Result<int> {
                           asked = true;
                           return 8;
                         }));
  const json& c = Container(r.pod, "vllm");
  EXPECT_EQ(Limits(c)["nvidia.com/gpu"], "2");
  EXPECT_EQ(c["resources"]["requests"]["nvidia.com/gpu"], "2");
  EXPECT_FALSE(asked);
}

TEST(Placeholder, GpuCountFromSnapshotLookup) {
  json pod = Placeholder();
  pod["metadata"]["annotations"].erase("gpusnap.io/gpu-count");
  std::string asked;
  auto r = MutateChecked(pod, WithLookup([&](const std::string& id) -> Result<int> {
                           asked = id;
                           return 4;
                         }));
  EXPECT_EQ(asked, "vllm-20250101-abc123");
  EXPECT_EQ(Limits(Container(r.pod, "vllm"))["nvidia.com/gpu"], "4");
}

TEST(Placeholder, GpuCountDefaultsToOneWithWarning) {
  json pod = Placeholder();
  pod["metadata"]["annotations"].erase("gpusnap.io/gpu-count");
  pod["spec"]["containers"][0].erase("resources");
  auto r = MutateChecked(pod, WithLookup([](const std::string& id) -> Result<int> {
                           return Status::Error(Code::kNotFound, "no snapshot `{}` on this node", id);
                         }));
  EXPECT_EQ(Limits(Container(r.pod, "vllm")), json({{"nvidia.com/gpu", "1"}}));
  EXPECT_TRUE(HasWarningAbout(r.m, "no snapshot"));
  EXPECT_EQ(Limits(Container(MutateChecked(pod).pod, "vllm"))["nvidia.com/gpu"], "1");  // no lookup at all
}

TEST(Placeholder, InvalidGpuCountAnnotationIgnoredWithWarning) {
  json pod = Placeholder();
  pod["metadata"]["annotations"]["gpusnap.io/gpu-count"] = "two";
  auto r = MutateChecked(pod, WithLookup([](const std::string&) -> Result<int> { return 3; }));
  EXPECT_EQ(Limits(Container(r.pod, "vllm"))["nvidia.com/gpu"], "3");
  EXPECT_TRUE(HasWarningAbout(r.m, "gpusnap.io/gpu-count"));
}

TEST(Placeholder, InvalidSnapshotIdIsError) {
  for (const char* id : {"../../etc", "a//b", ".hidden", "registry.example/Team/x", "r.example/x:bad tag",
                         "https://r.example/x"}) {
    json pod = Placeholder();
    pod["metadata"]["annotations"]["gpusnap.io/restore-from"] = id;
    auto r = MutatePod(pod, {});
    ASSERT_FALSE(r.ok()) << id;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
  }
}

TEST(Placeholder, FromARegistryReference) {
  const std::string ref = "registry.example:5000/ml/vllm:warm";
  json pod = Placeholder();
  pod["metadata"]["annotations"]["gpusnap.io/restore-from"] = ref;
  bool asked = false;
  auto r = MutateChecked(pod, WithLookup([&](const std::string&) -> Result<int> {
                           asked = true;
                           return 4;
                         }));
  EXPECT_FALSE(asked);  // the store's lookup knows ids, not the registry
  const json& c = Container(r.pod, "vllm");
  EXPECT_EQ(c["command"], json({"/gpusnap/bin/gpusnap", "__placeholder"}));
  EXPECT_EQ(MountAt(c, "/gpusnap")["readOnly"], true);
  EXPECT_EQ(r.pod["metadata"]["labels"], json({{"gpusnap.io/placeholder", "true"}}));
  json record = json::parse(r.pod["metadata"]["annotations"]["gpusnap.io/mutation"].get<std::string>());
  EXPECT_EQ(record["restore"], json({{"container", "vllm"}, {"snapshot", ref}, {"gpus", 2}}));
  EXPECT_EQ(Limits(c)["nvidia.com/gpu"], "2");  // gpusnap.io/gpu-count

  pod["metadata"]["annotations"].erase("gpusnap.io/gpu-count");
  auto unknown = MutateChecked(pod);
  EXPECT_EQ(Limits(Container(unknown.pod, "vllm"))["nvidia.com/gpu"], "1");
  EXPECT_TRUE(HasWarningAbout(unknown.m, "a registry reference"));
}

TEST(Placeholder, ContainerChosenByAnnotation) {
  json pod = Placeholder();
  json sidecar = {{"name", "proxy"}, {"image", "envoy:1"}, {"command", {"envoy"}}};
  pod["spec"]["containers"].insert(pod["spec"]["containers"].begin(), sidecar);
  pod["metadata"]["annotations"]["gpusnap.io/restore-container"] = "vllm";
  auto r = MutateChecked(pod);
  EXPECT_EQ(Container(r.pod, "proxy"), sidecar);
  EXPECT_EQ(Container(r.pod, "vllm")["command"][1], "__placeholder");
}

TEST(Placeholder, MissingRestoreContainerIsError) {
  json pod = Placeholder();
  pod["metadata"]["annotations"]["gpusnap.io/restore-container"] = "nope";
  auto r = MutatePod(pod, {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("nope"), std::string::npos);
}

TEST(Placeholder, WithGpushareTheReaperGetsNoLdPreload) {
  json pod = Placeholder();
  pod["metadata"]["annotations"]["gpusnap.io/gpushare"] = "true";
  auto r = MutateChecked(pod);
  const json& c = Container(r.pod, "vllm");
  EXPECT_EQ(Env(c, "LD_PRELOAD"), nullptr);
  EXPECT_EQ(MountAt(c, "/gpusnap-store")["subPathExpr"], "$(GPUSNAP_POD_UID)");
  int bundles = 0;
  for (const json& v : r.pod["spec"]["volumes"]) bundles += v.contains("hostPath") && v["hostPath"]["path"] == "/var/lib/gpusnap/bundle";
  EXPECT_EQ(bundles, 1);
  EXPECT_EQ(r.m.summary, "restore: `vllm-20250101-abc123` into `vllm` with 2 GPU(s); gpushare: vllm");
}

TEST(Placeholder, LivenessProbeWarns) {
  json pod = Placeholder();
  pod["spec"]["containers"][0]["livenessProbe"] = {{"httpGet", {{"path", "/health"}, {"port", 8000}}}};
  auto r = MutateChecked(pod);
  EXPECT_TRUE(HasWarningAbout(r.m, "livenessProbe"));
}

TEST(Placeholder, ConfigPathsUsed) {
  MutateConfig config;
  config.bundle_host_path = "/srv/gpusnap-bundle";
  config.reaper_command = {"/gpusnap/bin/gpusnap", "__placeholder", "--wait"};
  auto r = MutateChecked(Placeholder(), config);
  const json& c = Container(r.pod, "vllm");
  EXPECT_EQ(c["command"], json(config.reaper_command));
  EXPECT_EQ(Volume(r.pod, MountAt(c, "/gpusnap")["name"])["hostPath"]["path"], "/srv/gpusnap-bundle");
}

}  // namespace
}  // namespace gpusnap::k8s
