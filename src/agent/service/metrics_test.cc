#include "agent/service/metrics.h"

#include <gtest/gtest.h>

namespace gpusnap::agent {
namespace {

TEST(AgentMetrics, HistogramBucketsAreCumulative) {
  Metrics m;
  m.ObservePhase("checkpoint", "dump", 0.3);
  m.ObservePhase("checkpoint", "dump", 7);
  m.ObservePhase("checkpoint", "dump", 1000);
  std::string text = m.Format();
  EXPECT_NE(text.find("# TYPE gpusnap_operation_duration_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("gpusnap_operation_duration_seconds_bucket{kind=\"checkpoint\",phase=\"dump\",le=\"0.25\"} 0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("gpusnap_operation_duration_seconds_bucket{kind=\"checkpoint\",phase=\"dump\",le=\"0.5\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("gpusnap_operation_duration_seconds_bucket{kind=\"checkpoint\",phase=\"dump\",le=\"10\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("gpusnap_operation_duration_seconds_bucket{kind=\"checkpoint\",phase=\"dump\",le=\"300\"} 2\n"),
            std::string::npos);
  EXPECT_NE(text.find("gpusnap_operation_duration_seconds_bucket{kind=\"checkpoint\",phase=\"dump\",le=\"+Inf\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("gpusnap_operation_duration_seconds_count{kind=\"checkpoint\",phase=\"dump\"} 3\n"),
            std::string::npos);
  EXPECT_NE(text.find("gpusnap_operation_duration_seconds_sum{kind=\"checkpoint\",phase=\"dump\"} 1007.3\n"),
            std::string::npos);
}

TEST(AgentMetrics, CountersAndGauge) {
  Metrics m;
  m.JobStarted();
  m.JobStarted();
  m.JobFinished("restore", false);
  m.AddBytes("checkpoint", 10);
  m.AddBytes("checkpoint", 5);
  std::string text = m.Format();
  EXPECT_NE(text.find("gpusnap_jobs_in_flight 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpusnap_operations_total{kind=\"restore\",result=\"failed\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("gpusnap_operation_bytes_total{kind=\"checkpoint\"} 15\n"), std::string::npos);
}

TEST(AgentMetrics, StandbysAreAGaugeOfTheirOwn) {
  Metrics m;
  EXPECT_EQ(m.Format().find("gpusnap_standby_workloads"), std::string::npos);
  m.JobStarted();
  m.JobFinished("wake", true);
  std::string text = m.Format(2);
  EXPECT_NE(text.find("# TYPE gpusnap_standby_workloads gauge\ngpusnap_standby_workloads 2\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("gpusnap_operations_total{kind=\"wake\",result=\"succeeded\"} 1\n"), std::string::npos);
}

TEST(AgentMetrics, ThePinnedTierIsReportedOnlyWhenThereIsOne) {
  Metrics m;
  EXPECT_EQ(m.Format(0).find("gpusnap_agent_pinned_tier"), std::string::npos);
  gpushare::control::PinnedTierGauges g{.capacity_bytes = 4ull << 26, .used_bytes = 3ull << 26, .chunks = 3,
                                        .hits = 7, .misses = 2, .evictions = 1, .admissions_pending = 2};
  std::string text = m.Format(0, g);
  for (const char* line : {"# TYPE gpusnap_agent_pinned_tier_bytes gauge\n",
                           "gpusnap_agent_pinned_tier_bytes{kind=\"capacity\"} 268435456\n",
                           "gpusnap_agent_pinned_tier_bytes{kind=\"used\"} 201326592\n",
                           "gpusnap_agent_pinned_tier_chunks 3\n",
                           "# TYPE gpusnap_agent_pinned_tier_admissions_pending gauge\n"
                           "gpusnap_agent_pinned_tier_admissions_pending 2\n",
                           "# TYPE gpusnap_agent_pinned_tier_hits_total counter\ngpusnap_agent_pinned_tier_hits_total 7\n",
                           "# TYPE gpusnap_agent_pinned_tier_misses_total counter\ngpusnap_agent_pinned_tier_misses_total 2\n",
                           "gpusnap_agent_pinned_tier_evictions_total 1\n"})
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
}

TEST(AgentMetrics, RefusalsAreCountedByListenerAndStatus) {
  Metrics m;
  m.Refused("unix", 403);
  m.Refused("unix", 403);
  m.Refused("tcp", 401);
  std::string text = m.Format();
  EXPECT_NE(text.find("# TYPE gpusnap_agent_refusals_total counter\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpusnap_agent_refusals_total{listener=\"unix\",status=\"403\"} 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("gpusnap_agent_refusals_total{listener=\"tcp\",status=\"401\"} 1\n"), std::string::npos) << text;
}

TEST(AgentMetrics, LabelValuesAreEscaped) {
  MetricsSnapshot s;
  s.bytes["a\"b\\c\nd"] = 1;
  EXPECT_NE(FormatMetrics(s).find("kind=\"a\\\"b\\\\c\\nd\""), std::string::npos) << FormatMetrics(s);
}

}  // namespace
}  // namespace gpusnap::agent
