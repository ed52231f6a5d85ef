#include <gtest/gtest.h>

#include "gpusnap/snapshot.h"

#include <nlohmann/json.hpp>

namespace gpusnap {
namespace {

SnapshotMeta Sample() {
  SnapshotMeta m;
  m.id = "counter-20261129-233000-ab12";
  m.created = "2026-11-29T23:30:00.000Z";
  m.source = {"workload", "counter", 4711, 2, {"/bin/counter", "-n", "3"}, "/run/gpusnap/logs/counter.log"};
  m.criu_version = "4.3";
  m.pids = {4711, 4712};
  m.listen_ports = {29777};
  m.files["checkpoint/pages-1.img"] = {4096, std::string(64, 'a')};
  m.total_bytes = 4096;
  m.timings_s["dump"] = 0.25;
  return m;
}

TEST(SnapshotMeta, RoundTrips) {
  auto parsed = SnapshotMetaFromJson(SnapshotMetaToJson(Sample()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->id, Sample().id);
  EXPECT_EQ(parsed->source.cmdline, Sample().source.cmdline);
  EXPECT_EQ(parsed->source.ns_pid, 2);
  EXPECT_EQ(parsed->pids, Sample().pids);
  EXPECT_EQ(parsed->listen_ports, std::vector<int>{29777});
  EXPECT_EQ(parsed->files.at("checkpoint/pages-1.img").size, 4096u);
  EXPECT_DOUBLE_EQ(parsed->timings_s.at("dump"), 0.25);
}

TEST(SnapshotMeta, UnknownMajorVersionIsRefusedNamingBoth) {
  std::string json = SnapshotMetaToJson(Sample());
  json.replace(json.find("\"1.4\""), 5, "\"2.0\"");
  auto parsed = SnapshotMetaFromJson(json);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kNotSupported);
  EXPECT_NE(parsed.status().message().find("2.0"), std::string::npos);
  EXPECT_NE(parsed.status().message().find("1.x"), std::string::npos);
}

TEST(SnapshotMeta, NewerMinorVersionIsRead) {
  std::string json = SnapshotMetaToJson(Sample());
  json.replace(json.find("\"1.4\""), 5, "\"1.7\"");
  auto parsed = SnapshotMetaFromJson(json);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->schema_minor, 7);
}

TEST(SnapshotMeta, MissingFieldIsNamed) {
  std::string json = SnapshotMetaToJson(Sample());
  json.replace(json.find("\"created\""), 9, "\"kreated\"");
  auto parsed = SnapshotMetaFromJson(json);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kCorruption);
  EXPECT_NE(parsed.status().message().find("`created`"), std::string::npos);
}

TEST(SnapshotMeta, WrongTypeIsNamed) {
  std::string json = SnapshotMetaToJson(Sample());
  json.replace(json.find("\"host_pid\": 4711"), 16, "\"host_pid\": \"x\"");
  auto parsed = SnapshotMetaFromJson(json);
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("`host_pid`"), std::string::npos);
}

TEST(SnapshotMeta, NotJsonIsCorruption) {
  EXPECT_EQ(SnapshotMetaFromJson("{\"id\": ").status().code(), Code::kCorruption);
  EXPECT_EQ(SnapshotMetaFromJson("[]").status().code(), Code::kCorruption);
}

TEST(SnapshotMeta, PathsEscapingTheSnapshotAreRefused) {
  SnapshotMeta m = Sample();
  m.files["../../etc/passwd"] = {1, "x"};
  auto parsed = SnapshotMetaFromJson(SnapshotMetaToJson(m));
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("unsafe path"), std::string::npos);
}

TEST(SnapshotId, Validation) {
  EXPECT_TRUE(IsValidSnapshotId("counter-20261129-233000-ab12"));
  EXPECT_FALSE(IsValidSnapshotId(""));
  EXPECT_FALSE(IsValidSnapshotId(".tmp-x"));
  EXPECT_FALSE(IsValidSnapshotId("a/b"));
  EXPECT_FALSE(IsValidSnapshotId(".."));
  EXPECT_FALSE(IsValidSnapshotId(std::string(65, 'a')));
}

}  // namespace
}  // namespace gpusnap

namespace gpusnap {
namespace {

TEST(SnapshotMeta, GpuStateRoundTrips) {
  SnapshotMeta m;
  m.id = "g-1";
  m.created = "2026-11-29T23:30:00.000Z";
  m.source.kind = "pid";
  m.criu_version = "4.3";
  m.gpu = SnapshotGpuState{"580.159.04", 13000, {{0, "GPU-0123", "NVIDIA H200", 9, 0, 150ull << 30}}, {2, 5}, {7, 9}, false, "", {}, ""};
  auto parsed = SnapshotMetaFromJson(SnapshotMetaToJson(m));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_TRUE(parsed->gpu.has_value());
  EXPECT_EQ(parsed->gpu->driver_version, "580.159.04");
  EXPECT_EQ(parsed->gpu->ns_pids, (std::vector<int>{2, 5}));
  ASSERT_EQ(parsed->gpu->gpus.size(), 1u);
  EXPECT_EQ(parsed->gpu->gpus[0].cc_major, 9);
  EXPECT_EQ(parsed->gpu->gpus[0].uuid, "GPU-0123");
}

TEST(SnapshotMeta, GpushareStateRoundTripsAndMustNameASocketPerProcess) {
  SnapshotMeta m;
  m.id = "g-2";
  m.created = "2026-11-30T03:00:00.000Z";
  m.source.kind = "pid";
  m.criu_version = "4.3";
  m.gpu = SnapshotGpuState{"580.159.04", 13000, {{0, "GPU-0123", "NVIDIA H200", 9, 0, 150ull << 30}}, {2}, {7}, false, "", {}, ""};
  EXPECT_EQ(SnapshotMetaToJson(m).find("gpushare"), std::string::npos);
  m.gpu->gpushare = true;
  m.gpu->chunk_store = "/var/lib/gpusnap";
  m.gpu->control_sockets = {"gpusnap-gpushare.4026532301.2"};
  m.gpu->shim = "/usr/local/lib/gpusnap/libgpusnap_gpushare.so";
  std::string json = SnapshotMetaToJson(m);
  auto parsed = SnapshotMetaFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->gpu->gpushare);
  EXPECT_EQ(parsed->gpu->chunk_store, "/var/lib/gpusnap");
  EXPECT_EQ(parsed->gpu->control_sockets, m.gpu->control_sockets);
  EXPECT_EQ(parsed->gpu->shim, m.gpu->shim);

  m.gpu->control_sockets.push_back("gpusnap-gpushare.4026532301.3");
  auto bad = SnapshotMetaFromJson(SnapshotMetaToJson(m));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("2 control sockets for 1 GPU processes"), std::string::npos);
}

TEST(SnapshotMeta, CpuSnapshotHasNoGpuState) {
  SnapshotMeta m;
  m.id = "c-1";
  m.created = "x";
  m.source.kind = "pid";
  m.criu_version = "4.3";
  std::string json = SnapshotMetaToJson(m);
  EXPECT_EQ(json.find("\"gpu\""), std::string::npos);
  EXPECT_FALSE(SnapshotMetaFromJson(json)->gpu.has_value());
}

}  // namespace
}  // namespace gpusnap
