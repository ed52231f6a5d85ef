// The agent's metrics, in Prometheus' text exposition format (version 0.0.4):
//
//   gpusnap_operation_duration_seconds{kind,phase}  histogram of phase times
//                                                   (phase="total" for a whole job)
//   gpusnap_operation_bytes_total{kind}             bytes written (checkpoint) or read (restore)
//   gpusnap_operations_total{kind,result}           finished jobs, result="succeeded"|"failed"
//   gpusnap_jobs_in_flight                          jobs running now
//   gpusnap_standby_workloads                       standbys waiting on the node for a wake
//   gpusnap_agent_refusals_total{listener,status}   requests and connections the API refused
//                                                   (listener="unix"|"tcp", status: the HTTP answer)
//   gpusnap_agent_pinned_tier_bytes{kind}           the pinned chunk tier's bound and use
//                                                   (kind="capacity"|"used"), with --pinned-cache
//   gpusnap_agent_pinned_tier_chunks                chunks in it
//   gpusnap_agent_pinned_tier_hits_total            chunks fills copied from it
//   gpusnap_agent_pinned_tier_misses_total          chunks fills read from the store instead
//   gpusnap_agent_pinned_tier_evictions_total       chunks it let go for others
//
// kind is "checkpoint", "restore" or "wake": the wakes of standbys are
// counted by gpusnap_operations_total{kind="wake"}, and their seconds are
// gpusnap_operation_duration_seconds{kind="wake",phase="total"}.
//
// Thread-safety: Metrics is safe to use from any thread. FormatMetrics is pure.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "gpushare/control/pinned_tier.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::agent {

// Upper bounds (seconds) of the histogram buckets; +Inf is implied.
inline constexpr std::array<double, 12> kDurationBuckets = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};

struct Histogram {
  std::array<uint64_t, kDurationBuckets.size()> buckets{};  // non-cumulative counts
  uint64_t count = 0;
  double sum = 0;
  void Observe(double seconds);
};

struct MetricsSnapshot {
  std::map<std::pair<std::string, std::string>, Histogram> durations;   // (kind, phase)
  std::map<std::string, uint64_t> bytes;                                // kind
  std::map<std::pair<std::string, std::string>, uint64_t> operations;   // (kind, result)
  int64_t jobs_in_flight = 0;
  int64_t standby_workloads = -1;  // -1: not reported
  std::map<std::pair<std::string, int>, uint64_t> refusals;            // (listener, HTTP status)
  std::optional<gpushare::control::PinnedTierGauges> pinned_tier;     // unset: no tier
};

std::string FormatMetrics(const MetricsSnapshot& m);

class Metrics {
 public:
  void ObservePhase(const std::string& kind, const std::string& phase, double seconds) EXCLUDES(mu_);
  void AddBytes(const std::string& kind, uint64_t bytes) EXCLUDES(mu_);
  void JobStarted() EXCLUDES(mu_);
  void JobFinished(const std::string& kind, bool succeeded) EXCLUDES(mu_);
  void Refused(const std::string& listener, int http_status) EXCLUDES(mu_);
  std::string Format() const EXCLUDES(mu_);
  // With the standbys waiting now and the pinned tier's gauges (read by the
  // caller, at each scrape).
  std::string Format(int64_t standby_workloads,
                     const std::optional<gpushare::control::PinnedTierGauges>& pinned_tier = std::nullopt) const
      EXCLUDES(mu_);

 private:
  mutable Mutex mu_;
  MetricsSnapshot m_ GUARDED_BY(mu_);
};

}  // namespace gpusnap::agent
