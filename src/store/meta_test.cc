#include <gtest/gtest.h>
#include <openssl/evp.h>

#include "gpusnap/snapshot.h"
#include "store/meta_digest.h"
#include "store/meta_testing.h"

#include <nlohmann/json.hpp>

namespace gpusnap {
namespace {

// The current schema version as gpusnap.json writes it, quoted.
std::string QuotedVersion() { return fmt::format("\"{}.{}\"", kSchemaMajor, kSchemaMinor); }

std::string Sha256Hex(const std::string& data) {
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), d, &n, EVP_sha256(), nullptr);
  std::string out;
  for (unsigned int i = 0; i < n; ++i) out += fmt::format("{:02x}", d[i]);
  return out;
}

// The documented canonical form (docs/snapshot-format.md): the object without
// `meta_sha256`, compact, keys sorted.
std::string CanonicalDigest(nlohmann::json j) {
  j.erase("meta_sha256");
  return Sha256Hex(j.dump());
}

// `json` edited by a test, its meta_sha256 recomputed, as a writer would have.
std::string Reseal(const std::string& text) {
  auto j = nlohmann::json::parse(text);
  j["meta_sha256"] = CanonicalDigest(j);
  return j.dump(2);
}
std::string Reseal(nlohmann::json j) { return Reseal(j.dump()); }

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
  json.replace(json.find(QuotedVersion()), 5, "\"2.0\"");
  auto parsed = SnapshotMetaFromJson(json);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kNotSupported);
  EXPECT_NE(parsed.status().message().find("2.0"), std::string::npos);
  EXPECT_NE(parsed.status().message().find("1.x"), std::string::npos);
}

TEST(SnapshotMeta, NewerMinorVersionIsRead) {
  std::string json = SnapshotMetaToJson(Sample());
  json.replace(json.find(QuotedVersion()), 5, "\"1.7\"");
  auto parsed = SnapshotMetaFromJson(Reseal(json));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->schema_minor, 7);
}

TEST(SnapshotMeta, MissingFieldIsNamed) {
  std::string json = SnapshotMetaToJson(Sample());
  json.replace(json.find("\"created\""), 9, "\"kreated\"");
  auto parsed = SnapshotMetaFromJson(Reseal(json));
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kCorruption);
  EXPECT_NE(parsed.status().message().find("`created`"), std::string::npos);
}

TEST(SnapshotMeta, WrongTypeIsNamed) {
  std::string json = SnapshotMetaToJson(Sample());
  json.replace(json.find("\"host_pid\": 4711"), 16, "\"host_pid\": \"x\"");
  auto parsed = SnapshotMetaFromJson(Reseal(json));
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("`source.host_pid`"), std::string::npos);
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

constexpr const char* kUuid = "GPU-5afec0da-0000-0000-0000-000000000000";

TEST(SnapshotMeta, GpuStateRoundTrips) {
  SnapshotMeta m = BarePidMeta("g-1");
  m.gpu = SnapshotGpuState{"580.159.04", 13000, {{0, kUuid, "NVIDIA H200", 9, 0, 150ull << 30}}, {2, 5}, {7, 9}, false, "", {}, ""};
  auto parsed = SnapshotMetaFromJson(SnapshotMetaToJson(m));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_TRUE(parsed->gpu.has_value());
  EXPECT_EQ(parsed->gpu->driver_version, "580.159.04");
  EXPECT_EQ(parsed->gpu->ns_pids, (std::vector<int>{2, 5}));
  ASSERT_EQ(parsed->gpu->gpus.size(), 1u);
  EXPECT_EQ(parsed->gpu->gpus[0].cc_major, 9);
  EXPECT_EQ(parsed->gpu->gpus[0].uuid, kUuid);
}

TEST(SnapshotMeta, GpushareStateRoundTripsAndMustNameASocketPerProcess) {
  SnapshotMeta m = BarePidMeta("g-2");
  m.gpu = SnapshotGpuState{"580.159.04", 13000, {{0, kUuid, "NVIDIA H200", 9, 0, 150ull << 30}}, {2}, {7}, false, "", {}, ""};
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
  SnapshotMeta m = BarePidMeta("c-1");
  std::string json = SnapshotMetaToJson(m);
  EXPECT_EQ(json.find("\"gpu\""), std::string::npos);
  auto parsed = SnapshotMetaFromJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_FALSE(parsed->gpu.has_value());
}

}  // namespace
}  // namespace gpusnap

// Issue 13, defect 2: gpusnap.json's fields are validated on load, and the
// metadata carries a digest of itself.
namespace gpusnap {
namespace {

// A GPU snapshot with every field set, as nlohmann::json.
nlohmann::json FullSample() {
  SnapshotMeta m = Sample();
  m.gpu = SnapshotGpuState{"580.159.04", 13000, {{0, "GPU-5afec0da-0000-0000-0000-000000000000", "NVIDIA H200", 9, 0, 150ull << 30}},
                           {2}, {7}, true, "/var/lib/gpusnap", {"gpusnap-gpushare.4026532301.2"}, "/lib/shim.so"};
  m.timings_s["gpu-lock"] = 2.5e-05;  // printed with an exponent
  m.owner = SnapshotOwner{"team-a", "vllm-0"};
  return nlohmann::json::parse(SnapshotMetaToJson(m));
}

// The message of loading `j` (resealed), or "" when it loads.
std::string RefusalOf(const nlohmann::json& j) {
  auto parsed = SnapshotMetaFromJson(Reseal(j));
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), Code::kCorruption) << parsed.status().ToString();
  return parsed.status().message();
}

TEST(SnapshotMetaValidation, FullSampleLoads) { EXPECT_EQ(RefusalOf(FullSample()), ""); }

TEST(SnapshotMetaValidation, OutOfRangeValuesAreRefusedNamingTheFieldAndValue) {
  using nlohmann::json;
  struct Case {
    const char* pointer;
    json value;
    const char* field;  // as the message names it
    const char* quoted; // the value as the message quotes it
  };
  const Case cases[] = {
      {"/source/host_pid", 0, "source.host_pid", "0"},
      {"/source/host_pid", -4711, "source.host_pid", "-4711"},
      {"/source/ns_pid", kPidMaxLimit + 1, "source.ns_pid", "4194305"},
      {"/pids/1", -1, "pids[1]", "-1"},
      {"/pids/0", 1ll << 40, "pids[0]", "1099511627776"},
      {"/criu/listen_ports/0", 70000, "criu.listen_ports[0]", "70000"},
      {"/criu/listen_ports/0", 0, "criu.listen_ports[0]", "0"},
      {"/files/checkpoint~1pages-1.img/size", -1, "files[\"checkpoint/pages-1.img\"].size", "-1"},
      {"/files/checkpoint~1pages-1.img/sha256", std::string(63, 'a'), "files[\"checkpoint/pages-1.img\"].sha256", "aaa"},
      {"/files/checkpoint~1pages-1.img/sha256", std::string(64, 'A'), "files[\"checkpoint/pages-1.img\"].sha256", "AAA"},
      {"/total_bytes", -1, "total_bytes", "-1"},
      {"/total_bytes", 4097, "total_bytes", "4097"},
      {"/timings_s/dump", -0.5, "timings_s.dump", "-0.5"},
      {"/created", "yesterday", "created", "yesterday"},
      {"/source/kind", "container", "source.kind", "container"},
      {"/criu/version", "", "criu.version", ""},
      {"/gpu/ns_pids/0", 0, "gpu.ns_pids[0]", "0"},
      {"/gpu/restore_tids/0", 9999999, "gpu.restore_tids[0]", "9999999"},
      {"/gpu/gpus/0/uuid", "GPU-0123", "gpu.gpus[0].uuid", "GPU-0123"},
      {"/gpu/gpus/0/index", -1, "gpu.gpus[0].index", "-1"},
      {"/gpu/gpus/0/compute_capability", "9.x", "gpu.gpus[0].compute_capability", "9.x"},
      {"/gpu/cuda_version", -13000, "gpu.cuda_version", "-13000"},
  };
  for (const auto& c : cases) {
    json j = FullSample();
    j[json::json_pointer(c.pointer)] = c.value;
    std::string why = RefusalOf(j);
    EXPECT_NE(why.find(fmt::format("`{}`", c.field)), std::string::npos) << c.pointer << ": " << why;
    EXPECT_NE(why.find(c.quoted), std::string::npos) << c.pointer << ": " << why;
  }
}

TEST(SnapshotMetaValidation, WrongTypesAreRefused) {
  using nlohmann::json;
  const std::pair<const char*, json> cases[] = {
      {"/source/host_pid", 4711.5},     // a float is not a pid
      {"/source/ns_pid", "2"},
      {"/criu/listen_ports", 29777},    // not an array
      {"/criu/listen_ports/0", "29777"},
      {"/criu/tcp_established", 1},
      {"/pids", json::object()},
      {"/source/cmdline/0", 7},
      {"/files/checkpoint~1pages-1.img/size", "4096"},
      {"/gpu/gpus", json::object()},
      {"/gpu/gpushare/control_sockets/0", 1},
  };
  for (const auto& [pointer, value] : cases) {
    json j = FullSample();
    j[json::json_pointer(pointer)] = value;
    std::string why = RefusalOf(j);
    EXPECT_NE(why.find(", not "), std::string::npos) << pointer << ": " << why;
  }
}

TEST(SnapshotMetaValidation, FieldsAddedByAMinorVersionAreRequiredFromIt) {
  using nlohmann::json;
  // A removed `digest` must not make a 1.2+ snapshot read as whole-file SHA-256.
  json without_digest = FullSample();
  without_digest.erase("digest");
  json without_ports = FullSample();
  without_ports["criu"].erase("listen_ports");
  for (const auto& [j, field] : {std::pair{without_digest, "`digest`"}, std::pair{without_ports, "`criu.listen_ports`"}}) {
    std::string why = RefusalOf(j);
    EXPECT_NE(why.find(fmt::format("missing field {} (required since schema", field)), std::string::npos) << why;
  }
  json j = FullSample();
  j.erase("meta_sha256");
  auto parsed = SnapshotMetaFromJson(j.dump());
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("missing field `meta_sha256` (required since schema 1.5)"),
            std::string::npos)
      << parsed.status().message();
}

TEST(SnapshotMetaValidation, OlderSnapshotsLoadWithTheDocumentedDefaults) {
  nlohmann::json j = FullSample();
  j.erase("meta_sha256");
  j["schema_version"] = "1.1";
  j.erase("digest");
  j["criu"].erase("listen_ports");
  j["criu"].erase("shell_job");
  j.erase("pids");
  j.erase("timings_s");
  j.erase("total_bytes");
  auto parsed = SnapshotMetaFromJson(j.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->digest, "sha256");
  EXPECT_TRUE(parsed->listen_ports.empty());
  EXPECT_FALSE(parsed->shell_job);
  EXPECT_TRUE(parsed->pids.empty());
  EXPECT_EQ(parsed->total_bytes, 4096u);  // the files' sum
  // Written back (inspect, the agent) as the schema it has: without a digest.
  EXPECT_EQ(SnapshotMetaToJson(*parsed).find("meta_sha256"), std::string::npos);
  EXPECT_TRUE(SnapshotMetaFromJson(SnapshotMetaToJson(*parsed)).ok());
}

TEST(SnapshotMetaValidation, DigestIsOfTheCanonicalFormAndCoversUnknownFields) {
  nlohmann::json j = FullSample();
  ASSERT_TRUE(j.contains("meta_sha256"));
  EXPECT_EQ(j["meta_sha256"], CanonicalDigest(j));
  // A field of a newer minor version is covered too.
  j["added_by_1_9"] = 1;
  auto parsed = SnapshotMetaFromJson(j.dump(2));
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("does not match its digest"), std::string::npos)
      << parsed.status().message();
  EXPECT_TRUE(SnapshotMetaFromJson(Reseal(j)).ok());
  // The compact form (as the agent sends it) verifies like the indented one.
  EXPECT_TRUE(SnapshotMetaFromJson(FullSample().dump()).ok());
}

TEST(SnapshotMetaDigest, CanonicalFormSortsKeysDropsWhitespaceAndKeepsNumbersAsWritten) {
  auto canonical = CanonicalMeta(
      "{\"b\": 1.50,\n \"a\": [true, null, \"x\\n\\u0041\u00e9\"], \"meta_sha256\": \"0\",\n"
      " \"c\": {\"z\": -2, \"y\": 2.5E-05, \"meta_sha256\": 1}}");
  ASSERT_TRUE(canonical.ok()) << canonical.status().ToString();
  EXPECT_EQ(*canonical, "{\"a\":[true,null,\"x\\nA\u00e9\"],\"b\":1.50,\"c\":{\"meta_sha256\":1,\"y\":2.5E-05,\"z\":-2}}");
  auto twice = CanonicalMeta("{\"a\": 1, \"b\": {\"c\": 1, \"c\": 2}}");
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("the key `c` appears twice"), std::string::npos) << twice.status().message();
}

TEST(SnapshotMetaValidation, FlippedBitInAValueIsRefusedAsCorruptMetadata) {
  std::string text = FullSample().dump(2);
  size_t at = text.find("\"host_pid\": 4711");
  ASSERT_NE(at, std::string::npos);
  text[at + 12] ^= 0x02;  // 4711 -> 6711: still a valid pid
  auto parsed = SnapshotMetaFromJson(text);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kCorruption);
  EXPECT_NE(parsed.status().message().find("does not match its digest"), std::string::npos)
      << parsed.status().message();
}

TEST(SnapshotMetaValidation, EveryFlippedBitIsRefused) {
  const std::string text = FullSample().dump(2) + "\n";
  ASSERT_TRUE(SnapshotMetaFromJson(text).ok());
  size_t accepted = 0;
  std::string first;
  for (size_t i = 0; i < text.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string flipped = text;
      flipped[i] = static_cast<char>(flipped[i] ^ (1 << bit));
      if (SnapshotMetaFromJson(flipped).ok() && accepted++ == 0) first = fmt::format("byte {} bit {}", i, bit);
    }
  }
  EXPECT_EQ(accepted, 0u) << "first accepted flip: " << first;
}

TEST(SnapshotMetaValidation, SyntaxErrorNamesTheBytePosition) {
  std::string text = FullSample().dump(2);
  size_t at = text.find("\"kernel\"");
  ASSERT_NE(at, std::string::npos);
  text.insert(at, "}");  // byte at+1 (1-based) is where it goes wrong
  auto parsed = SnapshotMetaFromJson(text);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kCorruption);
  EXPECT_NE(parsed.status().message().find("JSON syntax error"), std::string::npos) << parsed.status().message();
  EXPECT_NE(parsed.status().message().find(fmt::format("at byte {}", at + 1)), std::string::npos)
      << parsed.status().message();
  EXPECT_EQ(parsed.status().message().find("not a JSON object"), std::string::npos);
}

}  // namespace
}  // namespace gpusnap

// Issue 16: schema 1.6 records the capture path, and a rootfs snapshot's
// filesystem part.
namespace gpusnap {
namespace {

SnapshotMeta RootfsSample() {
  SnapshotMeta m = Sample();
  m.capture_path = {CapturePath::kRootfs, CapturePath::kAuto, "the tree holds an io_uring instance (pid 4712, fd 5)"};
  m.criu_version.clear();
  m.pids.clear();
  m.files.clear();
  m.files["rootfs-diff.tar"] = {10240, std::string(64, 'b')};
  m.files["caches/0.tar"] = {2048, std::string(64, 'c')};
  m.total_bytes = 12288;
  RootfsRecord rf;
  rf.image = "localhost/app:1";
  rf.command = {"/bin/app", "--serve"};
  rf.cwd = "/srv";
  rf.upper = "/var/lib/containerd/snapshots/31/fs";
  rf.lowers = {"/var/lib/containerd/snapshots/12/fs"};
  rf.excluded = {"/etc/hosts", "/tmp"};
  rf.excluded_paths = {"/tmp"};
  rf.skipped = {{"/run/app.sock", "a socket: the workload makes it again"}};
  rf.entries = 7;
  rf.deleted = 1;
  rf.caches = {{"/cache", "caches/0.tar", true, 3}};
  m.rootfs = rf;
  return m;
}

TEST(SnapshotMeta16, ARootfsSnapshotRoundTripsWithoutCriu) {
  std::string text = SnapshotMetaToJson(RootfsSample());
  EXPECT_EQ(nlohmann::json::parse(text).count("criu"), 0u) << text;
  auto parsed = SnapshotMetaFromJson(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->capture_path.path, CapturePath::kRootfs);
  EXPECT_EQ(parsed->capture_path.requested, CapturePath::kAuto);
  EXPECT_EQ(parsed->capture_path.reason, RootfsSample().capture_path.reason);
  ASSERT_TRUE(parsed->rootfs.has_value());
  EXPECT_EQ(parsed->rootfs->image, "localhost/app:1");
  EXPECT_EQ(parsed->rootfs->command, (std::vector<std::string>{"/bin/app", "--serve"}));
  EXPECT_EQ(parsed->rootfs->cwd, "/srv");
  EXPECT_EQ(parsed->rootfs->skipped.size(), 1u);
  ASSERT_EQ(parsed->rootfs->caches.size(), 1u);
  EXPECT_EQ(parsed->rootfs->caches[0].file, "caches/0.tar");
  EXPECT_TRUE(parsed->rootfs->caches[0].mount);
  EXPECT_EQ(parsed->rootfs->entries, 7u);
}

TEST(SnapshotMeta16, AProcessSnapshotRecordsItsPathAndNeedsCriu) {
  auto parsed = SnapshotMetaFromJson(SnapshotMetaToJson(Sample()));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->capture_path.path, CapturePath::kProcess);
  EXPECT_FALSE(parsed->rootfs.has_value());
  nlohmann::json j = nlohmann::json::parse(SnapshotMetaToJson(Sample()));
  j.erase("criu");
  EXPECT_NE(RefusalOf(j).find("missing field `criu`"), std::string::npos) << RefusalOf(j);
}

TEST(SnapshotMeta16, MissingOrBadFieldsAreRefusedNamingThem) {
  nlohmann::json j = nlohmann::json::parse(SnapshotMetaToJson(RootfsSample()));
  auto edited = [&](auto edit) {
    nlohmann::json e = j;
    edit(e);
    return RefusalOf(e);
  };
  EXPECT_NE(edited([](auto& e) { e.erase("capture_path"); }).find("missing field `capture_path` (required since schema 1.6)"),
            std::string::npos);
  EXPECT_NE(edited([](auto& e) { e["capture_path"]["path"] = "disk"; }).find("`capture_path.path` is \"disk\""),
            std::string::npos);
  EXPECT_NE(edited([](auto& e) { e["capture_path"]["requested"] = "x"; }).find("`capture_path.requested`"),
            std::string::npos);
  EXPECT_NE(edited([](auto& e) { e.erase("rootfs"); }).find("missing field `rootfs`"), std::string::npos);
  EXPECT_NE(edited([](auto& e) { e["rootfs"]["command"] = nlohmann::json::array(); }).find("`rootfs.command` is empty"),
            std::string::npos);
  EXPECT_NE(edited([](auto& e) { e["rootfs"]["caches"][0]["file"] = "../x.tar"; }).find("unsafe path"),
            std::string::npos);
  EXPECT_NE(edited([](auto& e) { e["rootfs"]["caches"][0]["path"] = "cache"; }).find("not an absolute container path"),
            std::string::npos);
  EXPECT_NE(edited([](auto& e) { e["capture_path"]["path"] = "process"; e["criu"] = {{"version", "4.3"}, {"listen_ports", nlohmann::json::array()}}; })
                .find("field `rootfs` is there, but capture_path.path is \"process\""),
            std::string::npos);
  // 1.5 snapshots read as process captures.
  nlohmann::json old = nlohmann::json::parse(SnapshotMetaToJson(Sample()));
  old.erase("capture_path");
  old["schema_version"] = "1.5";
  auto parsed = SnapshotMetaFromJson(Reseal(old));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->capture_path.path, CapturePath::kProcess);
}

TEST(SnapshotMeta17, TheOwnerRoundTripsAndIsOptional) {
  SnapshotMeta m = Sample();
  m.owner = SnapshotOwner{"team-a", "vllm-0"};
  std::string text = SnapshotMetaToJson(m);
  EXPECT_EQ(nlohmann::json::parse(text)["owner"], nlohmann::json({{"namespace", "team-a"}, {"pod", "vllm-0"}}));
  auto parsed = SnapshotMetaFromJson(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->owner, m.owner);
  // Taken outside Kubernetes: no owner, in this minor as in the older ones.
  auto unowned = SnapshotMetaFromJson(SnapshotMetaToJson(Sample()));
  ASSERT_TRUE(unowned.ok()) << unowned.status().ToString();
  EXPECT_FALSE(unowned->owner.has_value());
  EXPECT_EQ(nlohmann::json::parse(SnapshotMetaToJson(Sample())).count("owner"), 0u);
}

TEST(SnapshotMeta17, AnOwnerThatIsNotAKubernetesNameIsRefusedNamingTheField) {
  SnapshotMeta m = Sample();
  m.owner = SnapshotOwner{"team-a", "vllm-0"};
  nlohmann::json j = nlohmann::json::parse(SnapshotMetaToJson(m));
  auto edited = [&](auto edit) {
    nlohmann::json e = j;
    edit(e);
    return RefusalOf(e);
  };
  EXPECT_NE(edited([](auto& e) { e["owner"]["namespace"] = "Team_A"; })
                .find("field `owner.namespace` is \"Team_A\", not a Kubernetes namespace name"),
            std::string::npos);
  EXPECT_NE(edited([](auto& e) { e["owner"]["pod"] = ""; }).find("field `owner.pod`"), std::string::npos);
  EXPECT_NE(edited([](auto& e) { e["owner"].erase("namespace"); }).find("missing field `owner.namespace`"),
            std::string::npos);
  EXPECT_NE(edited([](auto& e) { e["owner"] = "team-a"; }).find("field `owner` is string"), std::string::npos);
}

TEST(SnapshotMeta17, AnotherNamespaceWrittenIntoTheOwnerFailsTheDigest) {
  SnapshotMeta m = Sample();
  m.owner = SnapshotOwner{"team-a", "vllm-0"};
  std::string text = SnapshotMetaToJson(m);
  size_t at = text.find("\"team-a\"");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 8, "\"team-b\"");  // a valid name: only the digest can tell
  auto parsed = SnapshotMetaFromJson(text);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().code(), Code::kCorruption);
  EXPECT_NE(parsed.status().message().find("does not match its digest"), std::string::npos)
      << parsed.status().message();
  // Nor can the owner be dropped to make the snapshot nobody's.
  nlohmann::json dropped = nlohmann::json::parse(SnapshotMetaToJson(m));
  dropped.erase("owner");
  auto nobodys = SnapshotMetaFromJson(dropped.dump(2));
  ASSERT_FALSE(nobodys.ok());
  EXPECT_NE(nobodys.status().message().find("does not match its digest"), std::string::npos)
      << nobodys.status().message();
}

}  // namespace
}  // namespace gpusnap
