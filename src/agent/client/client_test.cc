#include "agent/client/client.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "util/fd.h"

namespace gpusnap::agent {
namespace {

using Json = nlohmann::json;
using std::chrono::milliseconds;

// A unix socket of this test's own, in a directory removed at the end.
class SocketDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpusnap-client-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/agent.sock";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A socket bound at path_, listening with `backlog` unless it is negative.
  UniqueFd Bound(int backlog) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    if (backlog >= 0) {
      EXPECT_EQ(::listen(fd.get(), backlog), 0);
    }
    return fd;
  }

  // Connections that wait, unaccepted, until the listener's backlog is full.
  std::vector<UniqueFd> FillBacklog() {
    std::vector<UniqueFd> queued;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
    for (int i = 0; i < 64; ++i) {
      UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
      if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        EXPECT_EQ(errno, EAGAIN);
        return queued;
      }
      queued.push_back(std::move(fd));
    }
    ADD_FAILURE() << "the backlog never filled";
    return queued;
  }

  std::string dir_, path_;
};

// Accepts on `listener` after `delay`, answering each connection's request
// with the next of `answers` (a status and a JSON body), then stops.
std::thread AnswerLater(int listener, milliseconds delay, std::vector<std::pair<int, std::string>> answers) {
  return std::thread([listener, delay, answers] {
    std::this_thread::sleep_for(delay);
    for (const auto& [status, body] : answers) {
      for (;;) {
        UniqueFd conn(::accept(listener, nullptr, nullptr));
        if (!conn.valid()) return;
        std::string request;
        char buf[4096];
        ssize_t n;
        while (request.find("\r\n\r\n") == std::string::npos && (n = ::read(conn.get(), buf, sizeof buf)) > 0)
          request.append(buf, static_cast<size_t>(n));
        if (request.empty()) continue;  // a connection that only looked
        std::string answer = "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\n" +
                             "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
        EXPECT_EQ(::write(conn.get(), answer.data(), answer.size()), static_cast<ssize_t>(answer.size()));
        break;
      }
    }
  });
}

TEST(AgentConnect, WhatAFailedConnectSays) {
  EXPECT_EQ(ClassifyConnectError(ENOENT), ConnectVerdict::kAbsent);
  EXPECT_EQ(ClassifyConnectError(ENOTDIR), ConnectVerdict::kAbsent);
  EXPECT_EQ(ClassifyConnectError(EACCES), ConnectVerdict::kDenied);
  EXPECT_EQ(ClassifyConnectError(ECONNREFUSED), ConnectVerdict::kNobodyHome);
  EXPECT_EQ(ClassifyConnectError(EPROTOTYPE), ConnectVerdict::kNobodyHome);
  // A full backlog is an agent at work; what is not understood may be one too.
  EXPECT_EQ(ClassifyConnectError(EAGAIN), ConnectVerdict::kTryAgain);
  EXPECT_EQ(ClassifyConnectError(ETIMEDOUT), ConnectVerdict::kTryAgain);
}

using AgentProbeOnSockets = SocketDir;

TEST_F(AgentProbeOnSockets, NoFileAFileAndASocketNobodyListensOn) {
  EXPECT_EQ(ProbeAgent(path_, milliseconds(200)).state, ProbeState::kAbsent);
  std::ofstream(path_) << "x";
  EXPECT_EQ(ProbeAgent(path_, milliseconds(200)).state, ProbeState::kStale);
  std::filesystem::remove(path_);
  UniqueFd bound = Bound(-1);  // bound, never listening: as a killed agent leaves it
  AgentProbe probe = ProbeAgent(path_, milliseconds(200));
  EXPECT_EQ(probe.state, ProbeState::kStale);
  EXPECT_EQ(probe.detail, "nothing listens on it");
}

TEST_F(AgentProbeOnSockets, AFullBacklogIsBusyNotAbsent) {
  UniqueFd listener = Bound(0);
  auto queued = FillBacklog();
  AgentProbe probe = ProbeAgent(path_, milliseconds(300));
  EXPECT_EQ(probe.state, ProbeState::kBusy);
  EXPECT_EQ(probe.detail, "no answer within 0.3 s; last: its listen backlog is full");
}

TEST_F(AgentProbeOnSockets, AnAgentThatGetsToItWithinTheWaitIsFound) {
  UniqueFd listener = Bound(0);
  auto queued = FillBacklog();
  std::thread agent = AnswerLater(listener.get(), milliseconds(300), {{200, R"({"ok": true, "store": "/srv/s"})"}});
  // Let the queued connections go as the agent starts accepting.
  std::thread drop([&queued] {
    std::this_thread::sleep_for(milliseconds(250));
    queued.clear();
  });
  AgentProbe probe = ProbeAgent(path_, milliseconds(5000));
  drop.join();
  ::shutdown(listener.get(), SHUT_RDWR);
  agent.join();
  EXPECT_EQ(probe.state, ProbeState::kAnswered) << probe.detail;
  EXPECT_EQ(probe.store, "/srv/s");
}

TEST_F(AgentProbeOnSockets, SomethingElseAnsweringIsNoAgent) {
  UniqueFd listener = Bound(8);
  std::thread other = AnswerLater(listener.get(), milliseconds(0), {{404, R"({"error": "no"})"}});
  AgentProbe probe = ProbeAgent(path_, milliseconds(2000));
  other.join();
  EXPECT_EQ(probe.state, ProbeState::kNoAnswer);
  EXPECT_EQ(probe.detail, "GET /healthz answered HTTP 404");
}

using AgentCallOnSockets = SocketDir;

TEST_F(AgentCallOnSockets, A503IsRetriedAndTheAnswerAfterItReturned) {
  UniqueFd listener = Bound(8);
  std::thread agent = AnswerLater(listener.get(), milliseconds(0),
                                  {{503, R"({"error": "too many"})"}, {200, R"([{"id": "s1"}])"}});
  auto list = CallAgent(path_, "GET", "/v1/snapshots", nullptr, milliseconds(5000));
  agent.join();
  ASSERT_TRUE(list.ok()) << list.status().message();
  EXPECT_EQ((*list)[0]["id"], "s1");
}

TEST_F(AgentCallOnSockets, BusyForTheWholeWaitIsATimeout) {
  UniqueFd listener = Bound(0);
  auto queued = FillBacklog();
  auto r = CallAgent(path_, "POST", "/v1/checkpoints", nullptr, milliseconds(300));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kTimeout);
  EXPECT_EQ(r.status().message(), "the agent on `" + path_ +
                                      "` is busy (no answer within 0.3 s; last: its listen backlog is full)");
}

TEST_F(AgentCallOnSockets, AGoneAgentIsNotWaitedFor) {
  // Nothing listens: no agent to wait for (a wait that ran out would be kTimeout).
  UniqueFd bound = Bound(-1);
  auto r = CallAgent(path_, "GET", "/v1/snapshots", nullptr, milliseconds(5000));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNotFound);
  EXPECT_EQ(r.status().message(), "cannot reach the agent at `" + path_ + "`: Connection refused");
}

std::vector<std::string> Phases(const std::vector<ProgressEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) out.push_back(e.phase);
  return out;
}

TEST(AgentJobProgress, EachPhaseOnceInTheOrderItRuns) {
  JobProgress p;
  // nlohmann's objects are sorted by key: "dump" comes before "resolve".
  auto events = p.Update(Json::parse(R"({"kind": "checkpoint", "timings": {"resolve": 0.01, "dump": 0.2}})"));
  EXPECT_EQ(Phases(events), (std::vector<std::string>{"resolve", "dump"}));
  EXPECT_TRUE(events[0].done);
  EXPECT_DOUBLE_EQ(events[1].seconds, 0.2);
  events = p.Update(Json::parse(
      R"({"kind": "checkpoint", "timings": {"resolve": 0.01, "dump": 0.2, "publish": 0.03, "total": 0.3}})"));
  EXPECT_EQ(Phases(events), (std::vector<std::string>{"publish"}));  // never "total"
  EXPECT_TRUE(p.Update(Json::parse(R"({"kind": "checkpoint", "timings": {"publish": 0.03}})")).empty());
}

TEST(AgentJobProgress, BytesGainedGoWithTheLastNewPhase) {
  JobProgress p;
  auto events = p.Update(Json::parse(R"({"kind": "restore", "bytesDone": 0, "timings": {}})"));
  EXPECT_TRUE(events.empty());
  events = p.Update(
      Json::parse(R"({"kind": "restore", "bytesDone": 4096, "timings": {"namespace": 0.1, "verify": 0.2}})"));
  ASSERT_EQ(Phases(events), (std::vector<std::string>{"verify", "namespace"}));
  EXPECT_EQ(events[0].bytes, 0u);
  EXPECT_EQ(events[1].bytes, 4096u);
  events = p.Update(Json::parse(
      R"({"kind": "restore", "bytesDone": 4096, "timings": {"namespace": 0.1, "verify": 0.2, "criu-restore": 1}})"));
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].bytes, 0u);
}

TEST(AgentJobProgress, UnknownPhasesComeLastByName) {
  JobProgress p;
  auto events = p.Update(Json::parse(R"({"kind": "restore", "timings": {"zeta": 1, "alpha": 1, "verify": 1}})"));
  EXPECT_EQ(Phases(events), (std::vector<std::string>{"verify", "alpha", "zeta"}));
}

TEST(AgentJobProgress, MalformedFieldsAreSkipped) {
  JobProgress p;
  EXPECT_TRUE(p.Update(Json::parse(R"({"timings": "soon", "bytesDone": "many"})")).empty());
  auto events = p.Update(Json::parse(R"({"timings": {"dump": "slow", "publish": 1}})"));
  EXPECT_EQ(Phases(events), (std::vector<std::string>{"publish"}));
}

}  // namespace
}  // namespace gpusnap::agent
