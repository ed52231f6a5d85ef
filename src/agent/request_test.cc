#include "agent/request.h"

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
  auto r = ParseRestoreRequest(R"({"snapshot": "s1", "target": "new", "gpuMap": {"0": "1", "GPU-ab": "GPU-cd"},
                                   "name": "again"})");
  ASSERT_TRUE(std::holds_alternative<RestoreRequest>(r)) << std::get<ApiError>(r).message;
  const auto& req = std::get<RestoreRequest>(r);
  EXPECT_EQ(req.snapshot, "s1");
  EXPECT_TRUE(req.target_container.empty());
  EXPECT_EQ(req.gpu_map, "0=1,GPU-ab=GPU-cd");
  EXPECT_EQ(req.name, "again");
}

TEST(AgentRestoreRequest, ContainerTarget) {
  auto r = ParseRestoreRequest(R"({"snapshot": "s1", "target": {"container": ")" + kId + R"("}})");
  ASSERT_TRUE(std::holds_alternative<RestoreRequest>(r));
  EXPECT_EQ(std::get<RestoreRequest>(r).target_container, kId);
}

TEST(AgentRestoreRequest, Refusals) {
  EXPECT_NE(RestoreError("{}").message.find("missing field `snapshot`"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "../x"})").message.find("not a snapshot id"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": ".hidden"})").message.find("not a snapshot id"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "target": "old"})").message.find("`target`"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "target": {}})").message.find("target.container"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "target": 3})").message.find("`target` must be"), std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "gpuMap": {"0": 1}})").message.find("must be a string"),
            std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "gpuMap": {"0=1,": "2"}})").message.find("not a GPU index"),
            std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "name": "a/b"})").message.find("not a workload name"),
            std::string::npos);
  EXPECT_NE(RestoreError(R"({"snapshot": "s", "extra": null})").message.find("unknown field `extra`"),
            std::string::npos);
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

}  // namespace
}  // namespace gpusnap::agent
