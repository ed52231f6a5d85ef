#include "agent/service/pod_annotations.h"

#include <gtest/gtest.h>

namespace gpusnap::agent {
namespace {

using nlohmann::json;

json Pod(json annotations) {
  return {{"metadata", {{"namespace", "ml"}, {"name", "vllm-0"}, {"annotations", std::move(annotations)}}}};
}

CheckpointSettings Ok(const CheckpointRequest& request, const json* pod) {
  auto s = CheckpointSettingsFor(request, pod);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? *s : CheckpointSettings{};
}

std::string Refusal(const CheckpointRequest& request, const json& pod) {
  auto s = CheckpointSettingsFor(request, &pod);
  EXPECT_FALSE(s.ok());
  if (s.ok()) return "";
  EXPECT_EQ(s.status().code(), Code::kInvalidArgument);
  return s.status().message();
}

TEST(AgentPodAnnotations, WithNeitherTheCapturePathIsAuto) {
  CheckpointSettings s = Ok(CheckpointRequest{}, nullptr);
  EXPECT_EQ(s.capture_path, CapturePath::kAuto);
  EXPECT_EQ(s.capture_path_from, "the agent's default");
  EXPECT_TRUE(s.caches.empty());
  EXPECT_TRUE(s.exclude.empty());
  EXPECT_EQ(s.push_to, "");
  json bare = {{"metadata", {{"name", "p"}}}};
  EXPECT_EQ(Ok(CheckpointRequest{}, &bare).capture_path, CapturePath::kAuto);
}

TEST(AgentPodAnnotations, ThePodsAnnotationsAreRead) {
  json pod = Pod({{"gpusnap.io/capture-path", "rootfs"},
                  {"gpusnap.io/caches", "/root/.cache/huggingface, /root/.triton,"},
                  {"gpusnap.io/rootfs-exclude", "/tmp,/**/__pycache__"},
                  {"gpusnap.io/push-to", "registry.example:5000/ml/vllm:warm"}});
  CheckpointSettings s = Ok(CheckpointRequest{}, &pod);
  EXPECT_EQ(s.capture_path, CapturePath::kRootfs);
  EXPECT_EQ(s.capture_path_from, "annotation gpusnap.io/capture-path");
  EXPECT_EQ(s.caches, (std::vector<std::string>{"/root/.cache/huggingface", "/root/.triton"}));
  EXPECT_EQ(s.exclude, (std::vector<std::string>{"/tmp", "/**/__pycache__"}));
  EXPECT_EQ(s.push_to, "registry.example:5000/ml/vllm:warm");
}

TEST(AgentPodAnnotations, TheRequestWins) {
  json pod = Pod({{"gpusnap.io/capture-path", "rootfs"},
                  {"gpusnap.io/caches", "/pod-cache"},
                  {"gpusnap.io/rootfs-exclude", "/pod-tmp"},
                  {"gpusnap.io/push-to", "registry.example:5000/ml/vllm:pod"}});
  CheckpointRequest request;
  request.capture_path = CapturePath::kBoth;
  request.caches = std::vector<std::string>{"/request-cache"};
  request.exclude = std::vector<std::string>{};  // none, whatever the pod says
  request.image = "vllm:0.6.3";
  request.push_to = "registry.example:5000/ml/vllm:request";
  CheckpointSettings s = Ok(request, &pod);
  EXPECT_EQ(s.capture_path, CapturePath::kBoth);
  EXPECT_EQ(s.capture_path_from, "the request");
  EXPECT_EQ(s.caches, std::vector<std::string>{"/request-cache"});
  EXPECT_TRUE(s.exclude.empty());
  EXPECT_EQ(s.image, "vllm:0.6.3");
  EXPECT_EQ(s.push_to, "registry.example:5000/ml/vllm:request");
  EXPECT_FALSE(AsksThePod(request));
  // Field by field: what the request leaves is the pod's.
  CheckpointRequest path_only;
  path_only.capture_path = CapturePath::kAuto;
  EXPECT_TRUE(AsksThePod(path_only));
  s = Ok(path_only, &pod);
  EXPECT_EQ(s.capture_path, CapturePath::kAuto);
  EXPECT_EQ(s.caches, std::vector<std::string>{"/pod-cache"});
  EXPECT_EQ(s.exclude, std::vector<std::string>{"/pod-tmp"});
  EXPECT_EQ(s.push_to, "registry.example:5000/ml/vllm:pod");
}

TEST(AgentPodAnnotations, ABadAnnotationIsRefusedNamingIt) {
  EXPECT_EQ(Refusal(CheckpointRequest{}, Pod({{"gpusnap.io/capture-path", "fast"}})),
            "annotation gpusnap.io/capture-path `fast` is not a capture path: expected auto, process, rootfs or both");
  EXPECT_NE(Refusal(CheckpointRequest{}, Pod({{"gpusnap.io/capture-path", ""}})).find("`` is not a capture path"),
            std::string::npos);
  EXPECT_EQ(Refusal(CheckpointRequest{}, Pod({{"gpusnap.io/capture-path", 3}})),
            "annotation gpusnap.io/capture-path is not a string");
  EXPECT_EQ(Refusal(CheckpointRequest{}, Pod({{"gpusnap.io/caches", "/a,relative"}})),
            "annotation gpusnap.io/caches: `relative` is not an absolute container path");
  EXPECT_EQ(Refusal(CheckpointRequest{}, Pod({{"gpusnap.io/caches", "/a/../b"}})),
            "annotation gpusnap.io/caches: `/a/../b` holds a `.` or `..` component");
  EXPECT_EQ(Refusal(CheckpointRequest{}, Pod({{"gpusnap.io/rootfs-exclude", "/tmp, /a**b"}})),
            "annotation gpusnap.io/rootfs-exclude: excluded path `/a**b` holds `**` inside a component (`**` stands "
            "alone, for any number of components)");
  EXPECT_NE(Refusal(CheckpointRequest{}, Pod({{"gpusnap.io/push-to", "not a reference"}}))
                .find("annotation gpusnap.io/push-to"),
            std::string::npos);
  // Blanks around the value are no fault.
  json padded = Pod({{"gpusnap.io/capture-path", " rootfs "}});
  EXPECT_EQ(Ok(CheckpointRequest{}, &padded).capture_path, CapturePath::kRootfs);
}

TEST(AgentPodAnnotations, WhatTheRequestOverridesIsNotChecked) {
  json pod = Pod({{"gpusnap.io/capture-path", "fast"},
                  {"gpusnap.io/caches", "relative"},
                  {"gpusnap.io/push-to", "not a reference"}});
  CheckpointRequest request;
  request.capture_path = CapturePath::kRootfs;
  request.caches = std::vector<std::string>{"/c"};
  request.push_to = "registry.example:5000/ml/vllm:warm";
  EXPECT_EQ(Ok(request, &pod).capture_path, CapturePath::kRootfs);
}

TEST(AgentPodAnnotations, AProcessCaptureLeavesThePodsRootfsListsUnread) {
  json pod = Pod({{"gpusnap.io/capture-path", "process"},
                  {"gpusnap.io/caches", "relative"},
                  {"gpusnap.io/rootfs-exclude", "/tmp"}});
  CheckpointSettings s = Ok(CheckpointRequest{}, &pod);
  EXPECT_EQ(s.capture_path, CapturePath::kProcess);
  EXPECT_TRUE(s.caches.empty());
  EXPECT_TRUE(s.exclude.empty());
}

TEST(AgentPodAnnotations, AnnotationListsAreCommaSeparated) {
  EXPECT_EQ(SplitAnnotationList(""), std::vector<std::string>{});
  EXPECT_EQ(SplitAnnotationList(" , ,"), std::vector<std::string>{});
  EXPECT_EQ(SplitAnnotationList("/a"), std::vector<std::string>{"/a"});
  EXPECT_EQ(SplitAnnotationList("/a,/b c,\t/d\n"), (std::vector<std::string>{"/a", "/b c", "/d"}));
  // Too many is the request's limit too.
  std::string many;
  for (size_t i = 0; i <= kMaxRootfsPaths; ++i) many += fmt::format("/c{},", i);
  EXPECT_EQ(Refusal(CheckpointRequest{}, Pod({{"gpusnap.io/caches", many}})),
            "annotation gpusnap.io/caches: 17 caches, at most 16 are taken");
}

TEST(AgentPodAnnotations, TheChoiceIsRecordedOnThePod) {
  json pod = Pod({{"gpusnap.io/capture-path-reason", "an older reason"}});
  pod.merge_patch(CapturePathChosenPatch(CapturePath::kRootfs, "the tree holds an io_uring instance (pid 12, fd 5)"));
  const json& a = pod["metadata"]["annotations"];
  EXPECT_EQ(a["gpusnap.io/capture-path-chosen"], "rootfs");
  EXPECT_EQ(a["gpusnap.io/capture-path-reason"], "the tree holds an io_uring instance (pid 12, fd 5)");
  // No reason removes the last one's.
  pod.merge_patch(CapturePathChosenPatch(CapturePath::kProcess, ""));
  EXPECT_EQ(a["gpusnap.io/capture-path-chosen"], "process");
  EXPECT_FALSE(a.contains("gpusnap.io/capture-path-reason"));
  EXPECT_EQ(CapturePathChosenPatch(CapturePath::kRootfs, std::string(10000, 'r'))["metadata"]["annotations"]
                ["gpusnap.io/capture-path-reason"]
                    .get<std::string>()
                    .size(),
            4000u);
}

}  // namespace
}  // namespace gpusnap::agent
