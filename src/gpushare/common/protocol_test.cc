#include "gpushare/common/protocol.h"

#include <gtest/gtest.h>

namespace gpusnap::gpushare {
namespace {

TEST(ControlProtocol, RequestsRoundTrip) {
  ControlRequest release{ShimCommand::kRelease, "/var/lib/gpusnap", "/var/lib/gpusnap/tmp/x/gpu/2.chunks", 10000};
  auto parsed = ParseControlRequest(FormatControlRequest(release));
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(*parsed, release);

  ControlRequest quiesce{ShimCommand::kQuiesce, "", "", 2500};
  EXPECT_EQ(*ParseControlRequest(FormatControlRequest(quiesce)), quiesce);
  for (ShimCommand c : {ShimCommand::kState, ShimCommand::kResume}) {
    ControlRequest r{c, "", "", 10000};
    EXPECT_EQ(*ParseControlRequest(FormatControlRequest(r)), r);
  }
  EXPECT_EQ(FormatControlRequest({ShimCommand::kState, "", "", 1}), "{\"cmd\":\"state\"}\n");
}

TEST(ControlProtocol, RefusesMalformedRequestsNamingTheProblem) {
  struct Case {
    const char* line;
    const char* says;
  } cases[] = {
      {"", "not JSON"},
      {"{\"cmd\":", "not JSON"},
      {"[1]", "not a JSON object"},
      {"{}", "no \"cmd\""},
      {"{\"cmd\":7}", "no \"cmd\""},
      {"{\"cmd\":\"dump\"}", "unknown control command `dump` (known: state, quiesce, release, load, resume, export, remap, adopt)"},
      {"{\"cmd\":\"state\",\"manifest\":\"/x\"}", "`state` takes no field `manifest`"},
      {"{\"cmd\":\"release\",\"manifest\":\"/m\"}", "needs a \"chunk_store\" string"},
      {"{\"cmd\":\"load\",\"chunk_store\":\"/s\",\"manifest\":5}", "needs a \"manifest\" string"},
      {"{\"cmd\":\"load\",\"chunk_store\":\"s\",\"manifest\":\"/m\"}", "absolute path, not `s`"},
      {"{\"cmd\":\"quiesce\",\"timeout_ms\":0}", "1..3600000, not 0"},
      {"{\"cmd\":\"quiesce\",\"timeout_ms\":\"5\"}", "not \"5\""},
      {"{\"cmd\":\"resume\",\"timeout_ms\":5}", "takes no field `timeout_ms`"},
      {"{\"cmd\":\"export\"}", "`export` needs \"object\": a positive integer"},
      {"{\"cmd\":\"export\",\"object\":-3}", "`export` needs \"object\""},
      {"{\"cmd\":\"remap\",\"object\":3}", "`remap` takes no field `object`"},
      {"{\"cmd\":\"remap\",\"import\":0}", "`remap` needs \"import\""},
  };
  for (const Case& c : cases) {
    auto r = ParseControlRequest(c.line);
    ASSERT_FALSE(r.ok()) << c.line;
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(c.says), std::string::npos) << c.line << " -> " << r.status().message();
  }
}

TEST(ControlProtocol, Replies) {
  auto ok = ParseControlReply(FormatControlReply({{"state", "quiesced"}, {"allocations", 3}}));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ((*ok)["state"], "quiesced");
  EXPECT_EQ((*ok)["ok"], true);
  auto err = ParseControlReply(FormatControlError("cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)"));
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.status().code(), Code::kExternal);
  EXPECT_EQ(err.status().message(), "cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)");
  auto late = ParseControlReply(FormatControlError("quiesce: did not finish", /*timed_out=*/true));
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.status().code(), Code::kTimeout);
  auto bad = ParseControlReply("hello");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInternal);
  EXPECT_NE(bad.status().message().find("`hello`"), std::string::npos);
}

TEST(ControlProtocol, SocketNameCarriesThePidNamespace) {
  EXPECT_EQ(ControlSocketName(4026532301, 2), "gpusnap-gpushare.4026532301.2");
  EXPECT_NE(ControlSocketName(4026532301, 2), ControlSocketName(4026532302, 2));
  // A later generation, for a name a restored process still holds.
  EXPECT_EQ(ControlSocketName(4026532301, 2, 0), "gpusnap-gpushare.4026532301.2");
  EXPECT_EQ(ControlSocketName(4026532301, 2, 3), "gpusnap-gpushare.4026532301.2.3");
}

TEST(ControlProtocol, PeerCredentials) {
  EXPECT_TRUE(ControlPeerAllowed(0, 1000, false));     // root from the host
  EXPECT_TRUE(ControlPeerAllowed(1000, 1000, true));   // the owner, same namespace
  EXPECT_FALSE(ControlPeerAllowed(1000, 1000, false)); // the owner from elsewhere
  EXPECT_FALSE(ControlPeerAllowed(1001, 1000, true));  // someone else
}


TEST(ControlProtocol, ExportRemapAndAdoptNameTheirObject) {
  ControlRequest exp{ShimCommand::kExport, "", "", 10000, 0x7f0000200000};
  EXPECT_EQ(FormatControlRequest(exp), "{\"cmd\":\"export\",\"object\":139637978824704}\n");
  EXPECT_EQ(*ParseControlRequest(FormatControlRequest(exp)), exp);
  ControlRequest remap{ShimCommand::kRemap, "", "", 10000, 0x6753000000000002};
  EXPECT_EQ(*ParseControlRequest(FormatControlRequest(remap)), remap);
  ControlRequest adopt{ShimCommand::kAdopt, "", "", 10000, 0x7f0000400000};
  EXPECT_EQ(FormatControlRequest(adopt), "{\"cmd\":\"adopt\",\"object\":139637980921856}\n");
  EXPECT_EQ(*ParseControlRequest(FormatControlRequest(adopt)), adopt);
}

TEST(IpcHandle, AnOlderShimsHandleHasGenerationZero) {
  IpcHandle h{4026532301, 2, 0x7f0000200000, 4096, 8 << 20, 0};
  unsigned char bytes[kIpcHandleBytes];
  EncodeIpcHandle(h, bytes);
  for (size_t i = 12 + 36; i < kIpcHandleBytes; ++i) EXPECT_EQ(bytes[i], 0) << i;  // what older shims left zero
  EXPECT_EQ(DecodeIpcHandle(bytes)->generation, 0u);
}

TEST(IpcHandle, RoundTripsAndTellsDriverHandlesApart) {
  IpcHandle h{4026532301, 2, 0x7f0000200000, 4096, 8 << 20, 5};
  unsigned char bytes[kIpcHandleBytes];
  EncodeIpcHandle(h, bytes);
  auto back = DecodeIpcHandle(bytes);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, h);
  unsigned char driver[kIpcHandleBytes] = {0x11, 0x22, 0x33};
  EXPECT_FALSE(DecodeIpcHandle(driver).has_value());
  bytes[3] ^= 1;  // one bit of the magic
  EXPECT_FALSE(DecodeIpcHandle(bytes).has_value());
}

}  // namespace
}  // namespace gpusnap::gpushare
