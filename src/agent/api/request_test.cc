#include "agent/api/request.h"

#include <gtest/gtest.h>

namespace gpusnap::agent {
namespace {

ApiError CheckpointError(std::string_view body) {
  auto r = ParseCheckpointRequest(body);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

CheckpointRequest CheckpointOk(std::string_view body) {
  auto r = ParseCheckpointRequest(body);
  if (auto* e = std::get_if<ApiError>(&r)) ADD_FAILURE() << "refused " << body << ": " << e->message;
  return std::holds_alternative<CheckpointRequest>(r) ? std::get<CheckpointRequest>(r) : CheckpointRequest{};
}

ApiError RestoreError(std::string_view body) {
  auto r = ParseRestoreRequest(body);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

const std::string kId(64, 'a');

TEST(AgentCheckpointRequest, PidWithLeaveRunning) {
  auto r = CheckpointOk(R"({"pid": 4711, "leaveRunning": true})");
  EXPECT_EQ(r.pid, 4711);
  EXPECT_TRUE(r.leave_running);
  EXPECT_TRUE(r.container.empty());
}

TEST(AgentCheckpointRequest, ContainerAndSnapshotId) {
  auto r = CheckpointOk(R"({"container": ")" + kId + R"(", "snapshotId": "s-1"})");
  EXPECT_EQ(r.container, kId);
  EXPECT_EQ(r.snapshot_id, "s-1");
  EXPECT_FALSE(r.leave_running);
}

TEST(AgentCheckpointRequest, Pod) {
  auto r = CheckpointOk(R"({"pod": {"namespace": "ml", "name": "vllm-0.x", "container": "server"}})");
  ASSERT_TRUE(r.pod.has_value());
  EXPECT_EQ(r.pod->namespace_name, "ml");
  EXPECT_EQ(r.pod->name, "vllm-0.x");
  EXPECT_EQ(r.pod->container, "server");
}

TEST(AgentCheckpointRequest, MalformedJsonIsNamed) {
  auto e = CheckpointError(R"({"pid": 12)");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_NE(e.message.find("malformed JSON"), std::string::npos) << e.message;
}

TEST(AgentCheckpointRequest, NotAnObject) {
  EXPECT_NE(CheckpointError("[1]").message.find("expected a JSON object"), std::string::npos);
  EXPECT_NE(CheckpointError("").message.find("empty body"), std::string::npos);
}

TEST(AgentCheckpointRequest, UnknownFieldIsNamed) {
  auto e = CheckpointError(R"({"pid": 12, "leave_running": true})");
  EXPECT_NE(e.message.find("`leave_running`"), std::string::npos) << e.message;
  e = CheckpointError(R"({"pod": {"namespace": "a", "name": "b", "container": "c", "uid": "x"}})");
  EXPECT_NE(e.message.find("`pod.uid`"), std::string::npos) << e.message;
}

TEST(AgentCheckpointRequest, WrongTypes) {
  EXPECT_NE(CheckpointError(R"({"pid": "12"})").message.find("`pid` must be an integer"), std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pid": 12.5})").message.find("`pid` must be an integer"), std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pid": 12, "leaveRunning": 1})").message.find("boolean"), std::string::npos);
  EXPECT_NE(CheckpointError(R"({"container": 12})").message.find("must be a string"), std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pod": "x"})").message.find("`pod` must be an object"), std::string::npos);
}

TEST(AgentCheckpointRequest, PidOutOfRange) {
  for (const char* body : {R"({"pid": 0})", R"({"pid": -1})", R"({"pid": 4194305})",
                           R"({"pid": 18446744073709551615})", R"({"pid": 99999999999999999999})"}) {
    EXPECT_EQ(CheckpointError(body).http_status, 400) << body;
  }
}

TEST(AgentCheckpointRequest, ExactlyOneTarget) {
  EXPECT_NE(CheckpointError("{}").message.find("exactly one"), std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pid": 5, "container": ")" + kId + R"("})").message.find("exactly one"),
            std::string::npos);
}

TEST(AgentCheckpointRequest, PathLikeIdsAreRefused) {
  EXPECT_NE(CheckpointError(R"({"container": "../../etc/passwd"})").message.find("not a container id"),
            std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pid": 5, "snapshotId": "../x"})").message.find("not a snapshot id"),
            std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pid": 5, "snapshotId": "a/b"})").message.find("not a snapshot id"),
            std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pod": {"namespace": "..", "name": "b", "container": "c"}})").message.find(
                "namespace"),
            std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pod": {"namespace": "a", "name": "b/c", "container": "c"}})").message.find(
                "pod name"),
            std::string::npos);
}

TEST(AgentCheckpointRequest, ShortOrUppercaseContainerIdsAreRefused) {
  CheckpointError(R"({"container": "abc"})");
  CheckpointError(R"({"container": ")" + std::string(64, 'A') + R"("})");
  CheckpointError(R"({"container": ")" + std::string(65, 'a') + R"("})");
}

TEST(AgentRestoreRequest, NewTargetAndGpuMap) {
  auto r = ParseRestoreRequest(R"({"snapshot": "s1", "target": "new", "gpuMap": {"0": "1", "GPU-00000000-0000-0000-0000-0000000000ab": "GPU-00000000-0000-0000-0000-0000000000cd"},
                                   "name": "again"})");
  ASSERT_TRUE(std::holds_alternative<RestoreRequest>(r)) << std::get<ApiError>(r).message;
  const auto& req = std::get<RestoreRequest>(r);
  EXPECT_EQ(req.source.id, "s1");
  EXPECT_TRUE(req.target_container.empty());
  EXPECT_EQ(req.gpus.ToString(), "0=1,GPU-00000000-0000-0000-0000-0000000000ab=GPU-00000000-0000-0000-0000-0000000000cd");
  EXPECT_EQ(req.name, "again");
}

TEST(AgentRestoreRequest, ContainerTarget) {
  auto r = ParseRestoreRequest(R"({"snapshot": "s1", "target": {"container": ")" + kId + R"("}})");
  ASSERT_TRUE(std::holds_alternative<RestoreRequest>(r));
  EXPECT_EQ(std::get<RestoreRequest>(r).target_container, kId);
}

TEST(AgentRestoreRequest, Refusals) {
  EXPECT_NE(RestoreError("{}").message.find("missing field `snapshot`"), std::string::npos);
  // Holding a `/`, it is taken for a registry reference, and refused as one.
  EXPECT_NE(RestoreError(R"({"snapshot": "../x"})").message.find("`snapshot`: invalid snapshot id `../x`"),
            std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": ".hidden"})").message.find("invalid snapshot id `.hidden`"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "target": "old"})").message.find("`target`"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "target": {}})").message.find("target.container"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "target": 3})").message.find("`target` must be"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "gpuMap": {"0": 1}})").message.find("must be a string"),
            std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "gpuMap": {"0=1,": "2"}})").message.find("not a GPU index"),
            std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "name": "a/b"})").message.find("invalid workload name"),
            std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "extra": null})").message.find("unknown field `extra`"),
            std::string::npos);
}

TEST(AgentRestoreRequest, Standby) {
  auto r = ParseRestoreRequest(R"({"snapshot": "s1", "name": "warm", "standby": true})");
  ASSERT_TRUE(std::holds_alternative<RestoreRequest>(r));
  EXPECT_TRUE(std::get<RestoreRequest>(r).standby);
  EXPECT_FALSE(std::get<RestoreRequest>(ParseRestoreRequest(R"({"snapshot": "s1"})")).standby);
  EXPECT_EQ(RestoreError(R"({"snapshot": "s", "standby": "yes"})").message,
            "field `standby` must be a boolean, got string");
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "standby": true, "gpuMap": {"0": "1"}})")
                .message.find("a standby's GPUs are chosen when it is woken"),
            std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "standby": true, "target": {"container": ")" + kId + R"("}})")
                .message.find("fresh namespace only"),
            std::string::npos);
}

ApiError WakeError(std::string_view name, std::string_view body) {
  auto r = ParseWakeRequest(name, body);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(AgentWakeRequest, EmptyBodyGpusOrGpuMap) {
  for (std::string_view body : {"", "{}"}) {
    auto r = ParseWakeRequest("warm", body);
    ASSERT_TRUE(std::holds_alternative<WakeRequest>(r)) << body;
    const auto& w = std::get<WakeRequest>(r);
    EXPECT_EQ(w.name, "warm");
    EXPECT_TRUE(w.gpus.empty());
  }
  auto gpus = ParseWakeRequest("warm", R"({"gpus": [1, 0]})");
  ASSERT_TRUE(std::holds_alternative<WakeRequest>(gpus));
  EXPECT_EQ(std::get<WakeRequest>(gpus).gpus.gpus, (std::vector<int>{1, 0}));
  auto map = ParseWakeRequest("warm", R"({"gpuMap": {"0": "1"}})");
  ASSERT_TRUE(std::holds_alternative<WakeRequest>(map));
  EXPECT_EQ(std::get<WakeRequest>(map).gpus.ToString(), "0=1");
}

TEST(AgentWakeRequest, Refusals) {
  EXPECT_NE(WakeError("a b", "").message.find("invalid workload name"), std::string::npos);
  EXPECT_EQ(WakeError("w", R"({"gpus": [0], "gpuMap": {"0": "0"}})").message,
            "give at most one of `gpuMap` and `gpus`");
  EXPECT_EQ(WakeError("w", R"({"gpus": 0})").message, "field `gpus` must be an array of GPU indices, got number");
  EXPECT_EQ(WakeError("w", R"({"gpus": [-1]})").message, "`gpus` holds -1, not a GPU index");
  EXPECT_EQ(WakeError("w", R"({"gpus": ["0"]})").message, "`gpus` holds \"0\", not a GPU index");
  EXPECT_EQ(WakeError("w", R"({"timeout": 3})").message, "unknown field `timeout`");
  EXPECT_EQ(WakeError("w", "[]").http_status, 400);
}

TEST(AgentInPlaceRequest, TheNameFromThePathAndAnEmptyBody) {
  for (std::string_view body : {"", "{}"}) {
    auto r = ParseInPlaceRequest("llm-a", body);
    ASSERT_TRUE(std::holds_alternative<InPlaceRequest>(r)) << body;
    EXPECT_EQ(std::get<InPlaceRequest>(r).name, "llm-a");
  }
  auto bad_name = ParseInPlaceRequest(".hidden", "");
  ASSERT_TRUE(std::holds_alternative<ApiError>(bad_name));
  EXPECT_NE(std::get<ApiError>(bad_name).message.find("invalid workload name `.hidden`"), std::string::npos);
  auto field = ParseInPlaceRequest("a", R"({"store": "/x"})");
  ASSERT_TRUE(std::holds_alternative<ApiError>(field));
  EXPECT_EQ(std::get<ApiError>(field).message, "unknown field `store`");
  auto array = ParseInPlaceRequest("a", "[]");
  ASSERT_TRUE(std::holds_alternative<ApiError>(array));
  EXPECT_EQ(std::get<ApiError>(array).http_status, 400);
}

ApiError SwapError(std::string_view body) {
  auto r = ParseSwapRequest(body);
  EXPECT_TRUE(std::holds_alternative<ApiError>(r)) << "accepted: " << body;
  return std::holds_alternative<ApiError>(r) ? std::get<ApiError>(r) : ApiError{};
}

TEST(AgentSwapRequest, TwoNamesReadBackFromTheBodyTheClientWrites) {
  auto r = ParseSwapRequest(SwapRequestBody({"llm-a", "llm-b"}));
  ASSERT_TRUE(std::holds_alternative<SwapRequest>(r)) << std::get<ApiError>(r).message;
  EXPECT_EQ(std::get<SwapRequest>(r).suspend, "llm-a");
  EXPECT_EQ(std::get<SwapRequest>(r).resume, "llm-b");
}

TEST(AgentSwapRequest, MalformedBodiesAreRefusedNamingTheProblem) {
  EXPECT_EQ(SwapError(R"({"resume": "b"})").message, "`suspend` is required: the workload to suspend");
  EXPECT_EQ(SwapError(R"({"suspend": "a"})").message, "`resume` is required: the workload to resume");
  EXPECT_EQ(SwapError(R"({"suspend": "a", "resume": 7})").message, "field `resume` must be a string, got number");
  EXPECT_NE(SwapError(R"({"suspend": "a b", "resume": "c"})").message.find("`suspend`: invalid workload name `a b`"),
            std::string::npos);
  EXPECT_EQ(SwapError(R"({"suspend": "a", "resume": "a"})").message,
            "`suspend` and `resume` name the same workload `a`: a swap takes two");
  EXPECT_EQ(SwapError(R"({"suspend": "a", "resume": "b", "force": true})").message, "unknown field `force`");
  EXPECT_EQ(SwapError("").http_status, 400);
  EXPECT_EQ(SwapError(R"({"suspend": "a", "suspend": "b", "resume": "c"})").http_status, 400);
}

TEST(AgentRestoreRequest, ARegistryReferenceIsPulledFirst) {
  auto r = ParseRestoreRequest(R"({"snapshot": "127.0.0.1:5000/team/counter:v1", "name": "copy"})");
  ASSERT_TRUE(std::holds_alternative<RestoreRequest>(r)) << std::get<ApiError>(r).message;
  const auto& req = std::get<RestoreRequest>(r);
  EXPECT_EQ(req.source.ToString(), "127.0.0.1:5000/team/counter:v1");
  EXPECT_TRUE(req.source.from_registry());
  std::string digest = "registry.example/snap@sha256:" + std::string(64, 'b');
  auto d = ParseRestoreRequest(R"({"snapshot": ")" + digest + R"("})");
  ASSERT_TRUE(std::holds_alternative<RestoreRequest>(d)) << std::get<ApiError>(d).message;
  EXPECT_EQ(std::get<RestoreRequest>(d).source.ToString(), digest);
  // A snapshot id is not a reference.
  auto id = ParseRestoreRequest(R"({"snapshot": "s1"})");
  ASSERT_TRUE(std::holds_alternative<RestoreRequest>(id));
  EXPECT_FALSE(std::get<RestoreRequest>(id).source.from_registry());
}

TEST(AgentRestoreRequest, MalformedReferencesAreRefusedSayingWhy) {
  EXPECT_NE(RestoreError(R"({"snapshot": "host:5000/Upper/case"})").message.find("repository component `Upper`"),
            std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "https://host/x"})").message.find("no scheme"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "host/x@sha256:12"})").message.find("digest"), std::string::npos);
}

TEST(AgentCheckpointRequest, PushTo) {
  auto r = CheckpointOk(R"({"pid": 4711, "pushTo": "registry.example:5000/ml/counter:warm"})");
  EXPECT_EQ(r.push_to, "registry.example:5000/ml/counter:warm");
  EXPECT_EQ(CheckpointOk(R"({"pid": 4711})").push_to, "");
  EXPECT_NE(CheckpointError(R"({"pid": 4711, "pushTo": "counter"})").message.find("`pushTo`: invalid registry "
                                                                                  "reference"),
            std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pid": 4711, "pushTo": 3})").message.find("`pushTo` must be a string"),
            std::string::npos);
}

TEST(AgentCheckpointRequest, CapturePathAndTheRootfsSettings) {
  auto r = CheckpointOk(R"({"pid": 4711, "capturePath": "both", "caches": ["/root/.cache/huggingface", "/root/.triton"],
                            "exclude": ["/tmp", "/**/__pycache__"], "image": "registry.example/ml/vllm:0.6.3"})");
  EXPECT_EQ(r.capture_path, CapturePath::kBoth);
  ASSERT_TRUE(r.caches.has_value());
  EXPECT_EQ(*r.caches, (std::vector<std::string>{"/root/.cache/huggingface", "/root/.triton"}));
  ASSERT_TRUE(r.exclude.has_value());
  EXPECT_EQ(*r.exclude, (std::vector<std::string>{"/tmp", "/**/__pycache__"}));
  EXPECT_EQ(r.image, "registry.example/ml/vllm:0.6.3");
  for (const char* path : {"auto", "process", "rootfs"})
    EXPECT_EQ(CheckpointOk(fmt::format(R"({{"pid": 4711, "capturePath": "{}"}})", path)).capture_path, ParseCapturePath(path));
  // Unset is not the same as empty: an empty list overrides a pod's.
  auto unset = CheckpointOk(R"({"pid": 4711})");
  EXPECT_EQ(unset.capture_path, std::nullopt);
  EXPECT_FALSE(unset.caches.has_value());
  EXPECT_FALSE(unset.exclude.has_value());
  auto empty = CheckpointOk(R"({"pid": 4711, "caches": [], "exclude": []})");
  ASSERT_TRUE(empty.caches.has_value());
  EXPECT_TRUE(empty.caches->empty());
  ASSERT_TRUE(empty.exclude.has_value());
  // The empty lists say nothing a process capture could contradict.
  EXPECT_EQ(CheckpointOk(R"({"pid": 4711, "capturePath": "process", "caches": []})").capture_path, CapturePath::kProcess);
}

TEST(AgentCheckpointRequest, ABadCapturePathIsNamed) {
  auto e = CheckpointError(R"({"pid": 4711, "capturePath": "fast"})");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.message, "`capturePath` `fast` is not a capture path: expected auto, process, rootfs or both");
  EXPECT_NE(CheckpointError(R"({"pid": 4711, "capturePath": ""})").message.find("`capturePath` `` is not"),
            std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pid": 4711, "capturePath": "Rootfs"})").message.find("`Rootfs`"), std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pid": 4711, "capturePath": true})").message.find("`capturePath` must be a string"),
            std::string::npos);
}

TEST(AgentCheckpointRequest, BadCachesAreRefusedNamingThePath) {
  auto message = [](const std::string& caches) {
    return CheckpointError(R"({"pid": 4711, "caches": )" + caches + "}").message;
  };
  EXPECT_EQ(message(R"(["root/.cache"])"), "`caches`: `root/.cache` is not an absolute container path");
  EXPECT_EQ(message(R"(["/root/../etc"])"), "`caches`: `/root/../etc` holds a `.` or `..` component");
  EXPECT_EQ(message(R"(["/root/./x"])"), "`caches`: `/root/./x` holds a `.` or `..` component");
  EXPECT_EQ(message(R"(["/.."])"), "`caches`: `/..` holds a `.` or `..` component");
  EXPECT_EQ(message(R"(["/"])"), "`caches`: `/` is the root: a cache is a directory under it");
  EXPECT_EQ(message(R"(["//"])"), "`caches`: `//` is the root: a cache is a directory under it");
  EXPECT_EQ(message(R"([""])"), "`caches`: `` is not an absolute container path");
  EXPECT_EQ(message(R"(["/a", "/a"])"), "`caches`: `/a` is given twice");
  EXPECT_EQ(message(R"(["/a\nb"])"), "`caches`: `/a\\x0ab` holds a control character");
  EXPECT_EQ(message(R"("/a")"), "field `caches` must be an array of strings, got string");
  EXPECT_EQ(message(R"(["/a", 3])"), "`caches` holds 3, not a string");
  std::string many = "[";
  for (size_t i = 0; i <= kMaxRootfsPaths; ++i) many += fmt::format("{}\"/c{}\"", i ? "," : "", i);
  EXPECT_EQ(message(many + "]"), "`caches`: 17 caches, at most 16 are taken");
  // What is accepted: under the root, doubled or trailing slashes as given.
  EXPECT_EQ(CheckpointOk(R"({"pid": 4711, "caches": ["/a//b/"]})").caches->at(0), "/a//b/");
}

TEST(AgentCheckpointRequest, BadExclusionsAreRefusedAsTheCaptureWould) {
  auto message = [](const std::string& exclude) {
    return CheckpointError(R"({"pid": 4711, "exclude": )" + exclude + "}").message;
  };
  EXPECT_EQ(message(R"(["tmp"])"), "`exclude`: excluded path `tmp` is not an absolute path");
  EXPECT_EQ(message(R"(["/a/../b"])"), "`exclude`: excluded path `/a/../b` holds a `.` or `..` component");
  EXPECT_NE(message(R"(["/a**b"])").find("`**` inside a component"), std::string::npos);
  EXPECT_NE(message(R"(["/**"])").find("would exclude the whole root"), std::string::npos);
  EXPECT_EQ(message(R"(["/tmp", "/tmp"])"), "`exclude`: `/tmp` is given twice");
  EXPECT_EQ(message(R"({"/tmp": true})"), "field `exclude` must be an array of strings, got object");
}

TEST(AgentCheckpointRequest, ImageAndTheProcessPathsContradictions) {
  EXPECT_EQ(CheckpointError(R"({"pid": 4711, "image": ""})").message,
            "`image` `` is not an image reference (1-1024 characters, no spaces)");
  EXPECT_NE(CheckpointError(R"({"pid": 4711, "image": "a b"})").message.find("`image` `a b`"), std::string::npos);
  EXPECT_NE(CheckpointError(R"({"pid": 4711, "image": 1})").message.find("`image` must be a string"),
            std::string::npos);
  const std::string two_things =
      "`caches`, `exclude` and `image` are for the rootfs capture: `capturePath` `process` takes none";
  EXPECT_EQ(CheckpointError(R"({"pid": 4711, "capturePath": "process", "caches": ["/c"]})").message, two_things);
  EXPECT_EQ(CheckpointError(R"({"pid": 4711, "capturePath": "process", "exclude": ["/tmp"]})").message, two_things);
  EXPECT_EQ(CheckpointError(R"({"pid": 4711, "capturePath": "process", "image": "x:1"})").message, two_things);
  // `auto` may take either path: its rootfs settings are kept for the case.
  EXPECT_EQ(CheckpointOk(R"({"pid": 4711, "capturePath": "auto", "caches": ["/c"]})").caches->size(), 1u);
}

TEST(AgentRequestJson, ADuplicateKeyIsRefusedNamingIt) {
  // nlohmann keeps the last of two equal keys: {"pid": <a tree>, "pid": 1}
  // would act on pid 1. A body that says two things means neither.
  auto e = CheckpointError(R"({"pid": 4711, "leaveRunning": true, "pid": 1})");
  EXPECT_EQ(e.http_status, 400);
  EXPECT_EQ(e.message, "duplicate key `pid` in the body");
  e = CheckpointError(R"({"pod": {"namespace": "a", "name": "b", "container": "c", "name": "d"}})");
  EXPECT_EQ(e.message, "duplicate key `pod.name` in the body");
  e = RestoreError(R"({"snapshot": "s", "gpuMap": {"0": "1", "1": "2", "0": "3"}})");
  EXPECT_EQ(e.message, "duplicate key `gpuMap.0` in the body");
  e = RestoreError(R"({"snapshot": "s", "target": {"container": "x"}, "target": "new"})");
  EXPECT_EQ(e.message, "duplicate key `target` in the body");
  // The same key in sibling objects is no duplicate.
  auto r = ParseRestoreRequest(R"({"snapshot": "s", "gpuMap": {"0": "1", "1": "0"}})");
  EXPECT_TRUE(std::holds_alternative<RestoreRequest>(r));
}

TEST(AgentRequestJson, BytesThatAreNotUtf8AreRefused) {
  for (std::string_view body : {std::string_view("{\"pid\": 5, \"snapshotId\": \"caf\xe9\"}"),
                                std::string_view("{\"pid\": 5, \"\xc3\": 1}"),
                                std::string_view("{\"pid\": 5, \"snapshotId\": \"\xed\xa0\x80\"}"),
                                std::string_view("{\"pid\": 5}\xff")}) {
    auto e = CheckpointError(body);
    EXPECT_EQ(e.http_status, 400);
    EXPECT_NE(e.message.find("not valid UTF-8"), std::string::npos) << e.message;
    // The refusal itself is text a JSON answer can carry.
    EXPECT_FALSE(FirstInvalidUtf8(e.message).has_value()) << e.message;
  }
  EXPECT_EQ(CheckpointError("{\"pid\": 5, \"snapshotId\": \"caf\xe9\"}").message,
            "the body is not valid UTF-8 (byte 0xe9 at offset 29)");
}

TEST(AgentRequestJson, Utf8Validation) {
  EXPECT_EQ(FirstInvalidUtf8(""), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8("plain ascii"), std::nullopt);
  EXPECT_EQ(FirstInvalidUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), std::nullopt);  // é € 😀
  EXPECT_EQ(FirstInvalidUtf8("\xef\xbb\xbf{}"), std::nullopt);                              // a BOM is UTF-8
  EXPECT_EQ(FirstInvalidUtf8("ab\xff"), 2u);
  EXPECT_EQ(FirstInvalidUtf8("a\xc3"), 1u);           // cut short
  EXPECT_EQ(FirstInvalidUtf8("a\xc3("), 1u);          // no continuation byte
  EXPECT_EQ(FirstInvalidUtf8("\xc0\xaf"), 0u);        // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("\xe0\x80\xaf"), 0u);    // overlong '/'
  EXPECT_EQ(FirstInvalidUtf8("\xed\xa0\x80"), 0u);    // a UTF-16 surrogate
  EXPECT_EQ(FirstInvalidUtf8("\xf4\x90\x80\x80"), 0u);  // past U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("\x80"), 0u);            // a lone continuation byte
}

TEST(AgentRequestJson, PrintableForALogLine) {
  EXPECT_EQ(Printable("/v1/snapshots/s-1"), "/v1/snapshots/s-1");
  EXPECT_EQ(Printable("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 stays
  EXPECT_EQ(Printable("caf\xe9"), "caf\\xe9");
  EXPECT_EQ(Printable("a\nb\r\x7f"), "a\\x0ab\\x0d\\x7f");
  EXPECT_EQ(Printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_FALSE(FirstInvalidUtf8(Printable("\xc3(\xed\xa0\x80")).has_value());
}

TEST(AgentRequestBody, HoldsUpToTheLimitAndNoMore) {
  BodyBuffer body(8);
  EXPECT_TRUE(body.Append("1234", 4));
  EXPECT_TRUE(body.Append("5678", 4));
  EXPECT_EQ(body.text(), "12345678");
  EXPECT_FALSE(body.too_large());
  EXPECT_FALSE(body.Append("9", 1));
  EXPECT_TRUE(body.too_large());
  EXPECT_EQ(body.text(), "12345678");  // nothing past the limit was kept
  EXPECT_FALSE(body.Append("", 0));    // and it stays refused
  EXPECT_EQ(BodyTooLarge(8).http_status, 413);
  EXPECT_EQ(BodyTooLarge(8).message, "request body too large (over 8 bytes, --max-body-bytes)");
}

TEST(AgentRequestHead, WhatIsRefusedBeforeTheBody) {
  EXPECT_EQ(RefusedBeforeTheBody("GET", "/v1/jobs", "", false), std::nullopt);
  EXPECT_EQ(RefusedBeforeTheBody("POST", "/v1/checkpoints", "application/json", true), std::nullopt);
  // `curl -d` says form-encoded; the body is JSON all the same.
  EXPECT_EQ(RefusedBeforeTheBody("POST", "/v1/checkpoints", "application/x-www-form-urlencoded", true), std::nullopt);
  EXPECT_EQ(RefusedBeforeTheBody("DELETE", "/v1/snapshots/s", "", false), std::nullopt);
  auto e = RefusedBeforeTheBody("PUT", "/v1/snapshots/s", "", true);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 405);
  EXPECT_EQ(e->message, "method PUT is not served: the API takes GET, POST and DELETE");
  for (const char* method : {"PATCH", "OPTIONS", "PRI", "CONNECT", "TRACE"})
    EXPECT_EQ(RefusedBeforeTheBody(method, "/", "", false).value_or(ApiError{}).http_status, 405) << method;
  e = RefusedBeforeTheBody("DELETE", "/v1/snapshots/s", "", true);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 400);
  EXPECT_EQ(e->message, "DELETE /v1/snapshots/s takes no body");
  EXPECT_EQ(RefusedBeforeTheBody("GET", "/healthz", "", true).value_or(ApiError{}).http_status, 400);
  e = RefusedBeforeTheBody("POST", "/v1/restores", "multipart/form-data; boundary=x", true);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 415);
}

TEST(AgentJobId, Shape) {
  EXPECT_TRUE(IsValidJobId("job-0123456789abcdef"));
  EXPECT_FALSE(IsValidJobId("job-0123456789abcde"));
  EXPECT_FALSE(IsValidJobId("job-0123456789ABCDEF"));
  EXPECT_FALSE(IsValidJobId("job-../../../../etc/x"));
  EXPECT_FALSE(IsValidJobId(""));
}

TEST(AgentBearer, MatchesOnlyTheExactToken) {
  EXPECT_TRUE(BearerMatches("Bearer s3cret", "s3cret"));
  EXPECT_FALSE(BearerMatches("Bearer s3cret ", "s3cret"));
  EXPECT_FALSE(BearerMatches("Bearer s3cre", "s3cret"));
  EXPECT_FALSE(BearerMatches("Bearer s3creT", "s3cret"));
  EXPECT_FALSE(BearerMatches("bearer s3cret", "s3cret"));
  EXPECT_FALSE(BearerMatches("s3cret", "s3cret"));
  EXPECT_FALSE(BearerMatches("Bearer ", ""));
  // A prefix padded with NULs must not pass for the token.
  EXPECT_FALSE(BearerMatches(std::string("Bearer s3cret\0", 14), "s3cret"));
}

TEST(AgentHttpStatus, ForCodes) {
  EXPECT_EQ(HttpStatusFor(Code::kNotFound), 404);
  EXPECT_EQ(HttpStatusFor(Code::kAlreadyExists), 409);
  EXPECT_EQ(HttpStatusFor(Code::kInvalidArgument), 400);
  EXPECT_EQ(HttpStatusFor(Code::kNotSupported), 501);
  EXPECT_EQ(HttpStatusFor(Code::kExternal), 500);
}

TEST(AgentRequestCodec, WhatTheClientSendsTheServerReadsBack) {
  RestoreRequest restore;
  restore.source = *ParseSnapshotRef("127.0.0.1:5000/team/llm:v1");
  restore.name = "copy";
  restore.target_container = kId;
  restore.gpus = *cuda::MakeGpuMapSpec("0=1,1=0", {});
  auto back = ParseRestoreRequest(RestoreRequestBody(restore));
  ASSERT_TRUE(std::holds_alternative<RestoreRequest>(back)) << std::get<ApiError>(back).message;
  const auto& r = std::get<RestoreRequest>(back);
  EXPECT_EQ(r.source, restore.source);
  EXPECT_EQ(r.name, "copy");
  EXPECT_EQ(r.target_container, kId);
  EXPECT_EQ(r.gpus.ToString(), "0=1,1=0");
  EXPECT_FALSE(r.standby);

  WakeRequest wake;
  wake.name = "warm";
  wake.gpus = *cuda::MakeGpuMapSpec("", {1, 0});
  auto woken = ParseWakeRequest("warm", WakeRequestBody(wake));
  ASSERT_TRUE(std::holds_alternative<WakeRequest>(woken)) << std::get<ApiError>(woken).message;
  EXPECT_EQ(std::get<WakeRequest>(woken).gpus.gpus, (std::vector<int>{1, 0}));
  // An id and no GPU choice: the smallest body.
  RestoreRequest plain;
  plain.source.id = "s1";
  EXPECT_EQ(RestoreRequestBody(plain), R"({"snapshot":"s1"})");
}

TEST(AgentRestoreRequest, AGpuMapIsParsedByItsOneGrammarAtTheDoor) {
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "gpuMap": {"x": "1"}})").message.find("`gpuMap`"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "gpus": [1, 1]})").message.find("GPU 1 is named twice"),
            std::string::npos);
}

}  // namespace
}  // namespace gpusnap::agent
