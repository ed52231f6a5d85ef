#include "agent/client.h"

#include <gtest/gtest.h>

namespace gpusnap::agent {
namespace {

using Json = nlohmann::json;

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
