// Watch stream lines, as kube-apiserver writes them, and the URL escaping the
// client's queries use.
#include "k8s/watch_event.h"

#include <gtest/gtest.h>

#include "k8s/kube_client.h"

namespace gpusnap::k8s {
namespace {

TEST(WatchEvent, EachType) {
  struct Case {
    const char* type;
    WatchEventType want;
  };
  for (Case c : {Case{"ADDED", WatchEventType::kAdded}, Case{"MODIFIED", WatchEventType::kModified},
                 Case{"DELETED", WatchEventType::kDeleted}, Case{"BOOKMARK", WatchEventType::kBookmark}}) {
    auto e = ParseWatchEvent(fmt::format(R"({{"type":"{}","object":{{"kind":"Pod","metadata":{{"name":"p",)"
                                         R"("resourceVersion":"1234"}}}}}})",
                                         c.type));
    ASSERT_TRUE(e.ok()) << e.status().ToString();
    EXPECT_EQ(e->type, c.want);
    EXPECT_EQ(e->resource_version, "1234");
    EXPECT_FALSE(IsExpired(*e));
  }
}

TEST(WatchEvent, ExpiredErrorAsksForAList) {
  auto e = ParseWatchEvent(R"x({"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},)x"
                           R"x("status":"Failure","message":"too old resource version: 5 (900)","reason":"Expired",)x"
                           R"x("code":410}})x");
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(e->type, WatchEventType::kError);
  EXPECT_EQ(e->error_code, 410);
  EXPECT_TRUE(IsExpired(*e));
  EXPECT_EQ(StatusMessage(e->object.dump()), "Expired: too old resource version: 5 (900)");
}

TEST(WatchEvent, OtherErrorIsNoExpiry) {
  auto e = ParseWatchEvent(R"({"type":"ERROR","object":{"kind":"Status","code":500,"message":"etcd down"}})");
  ASSERT_TRUE(e.ok());
  EXPECT_FALSE(IsExpired(*e));
  EXPECT_EQ(e->error_code, 500);
}

TEST(WatchEvent, MalformedLinesAreRefused) {
  EXPECT_FALSE(ParseWatchEvent("not json").ok());
  EXPECT_FALSE(ParseWatchEvent("[1]").ok());
  EXPECT_FALSE(ParseWatchEvent(R"({"type":"ADDED"})").ok());
  EXPECT_FALSE(ParseWatchEvent(R"({"type":"ADDED","object":{"metadata":{}}})").ok());
  auto unknown = ParseWatchEvent(R"({"type":"RENAMED","object":{}})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("RENAMED"), std::string::npos);
}

TEST(StatusMessage, PlainTextBodies) {
  EXPECT_EQ(StatusMessage("upstream connect error\n"), "upstream connect error");
  EXPECT_EQ(StatusMessage(R"({"message":"pods \"x\" not found"})"), "pods \"x\" not found");
}

TEST(QueryEscape, SelectorsAndResourceVersions) {
  EXPECT_EQ(QueryEscape("gpusnap.io/placeholder=true"), "gpusnap.io%2Fplaceholder%3Dtrue");
  EXPECT_EQ(QueryEscape("spec.nodeName=gpu-node-1"), "spec.nodeName%3Dgpu-node-1");
  EXPECT_EQ(QueryEscape("a b+c&d~"), "a%20b%2Bc%26d~");
}

ApiServerConfig Config(std::string server, std::string ca_pem = "") {
  ApiServerConfig c;
  c.server = std::move(server);
  c.ca_pem = std::move(ca_pem);
  return c;
}

TEST(KubeClient, RefusesWhatCannotWork) {
  auto no_ca = KubeClient::Create(Config("https://10.0.0.1:6443"));
  ASSERT_FALSE(no_ca.ok());
  EXPECT_NE(no_ca.status().message().find("no CA certificate"), std::string::npos);
  auto junk_ca = KubeClient::Create(Config("https://10.0.0.1", "not a certificate"));
  ASSERT_FALSE(junk_ca.ok());
  EXPECT_NE(junk_ca.status().message().find("holds no PEM certificate"), std::string::npos);
  EXPECT_FALSE(KubeClient::Create(Config("ftp://h")).ok());
  EXPECT_FALSE(KubeClient::Create(Config("http://user@h")).ok());
  auto plain = KubeClient::Create(Config("http://127.0.0.1:8001/"));
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ((*plain)->server(), "http://127.0.0.1:8001/");
}

TEST(KubeClient, UnreachableServerIsAnIoError) {
  // Port 1 on the loopback: nothing listens, the connection is refused at once.
  auto client = KubeClient::Create(Config("http://127.0.0.1:1"), 2);
  ASSERT_TRUE(client.ok());
  auto r = (*client)->Get("/api/v1/pods");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kIoError);
  EXPECT_NE(r.status().message().find("GET http://127.0.0.1:1/api/v1/pods"), std::string::npos)
      << r.status().message();
}

}  // namespace
}  // namespace gpusnap::k8s
