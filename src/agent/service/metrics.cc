#include "agent/service/metrics.h"

#include <fmt/format.h>

namespace gpusnap::agent {

namespace {

// Label values are ours (kinds, phase names), but escape as the format asks.
std::string Escape(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

}  // namespace

void Histogram::Observe(double seconds) {
  for (size_t i = 0; i < kDurationBuckets.size(); ++i) {
    if (seconds <= kDurationBuckets[i]) {
      ++buckets[i];
      break;
    }
  }
  ++count;
  sum += seconds;
}

std::string FormatMetrics(const MetricsSnapshot& m) {
  std::string out;
  out += "# HELP gpusnap_operation_duration_seconds Time spent in each phase of checkpoints and restores.\n";
  out += "# TYPE gpusnap_operation_duration_seconds histogram\n";
  for (const auto& [key, h] : m.durations) {
    std::string labels = fmt::format("kind=\"{}\",phase=\"{}\"", Escape(key.first), Escape(key.second));
    uint64_t cumulative = 0;
    for (size_t i = 0; i < kDurationBuckets.size(); ++i) {
      cumulative += h.buckets[i];
      out += fmt::format("gpusnap_operation_duration_seconds_bucket{{{},le=\"{}\"}} {}\n", labels, kDurationBuckets[i],
                         cumulative);
    }
    out += fmt::format("gpusnap_operation_duration_seconds_bucket{{{},le=\"+Inf\"}} {}\n", labels, h.count);
    out += fmt::format("gpusnap_operation_duration_seconds_sum{{{}}} {}\n", labels, h.sum);
    out += fmt::format("gpusnap_operation_duration_seconds_count{{{}}} {}\n", labels, h.count);
  }
  out += "# HELP gpusnap_operation_bytes_total Bytes of snapshots written (checkpoint) or read (restore).\n";
  out += "# TYPE gpusnap_operation_bytes_total counter\n";
  for (const auto& [kind, bytes] : m.bytes)
    out += fmt::format("gpusnap_operation_bytes_total{{kind=\"{}\"}} {}\n", Escape(kind), bytes);
  out += "# HELP gpusnap_operations_total Finished checkpoint, restore and wake jobs.\n";
  out += "# TYPE gpusnap_operations_total counter\n";
  for (const auto& [key, n] : m.operations)
    out += fmt::format("gpusnap_operations_total{{kind=\"{}\",result=\"{}\"}} {}\n", Escape(key.first),
                       Escape(key.second), n);
  out += "# HELP gpusnap_jobs_in_flight Checkpoint and restore jobs running now.\n";
  out += "# TYPE gpusnap_jobs_in_flight gauge\n";
  out += fmt::format("gpusnap_jobs_in_flight {}\n", m.jobs_in_flight);
  if (m.standby_workloads >= 0) {
    out += "# HELP gpusnap_standby_workloads Standby workloads waiting for a wake.\n";
    out += "# TYPE gpusnap_standby_workloads gauge\n";
    out += fmt::format("gpusnap_standby_workloads {}\n", m.standby_workloads);
  }
  out += "# HELP gpusnap_agent_refusals_total Requests and connections the agent's API refused.\n";
  out += "# TYPE gpusnap_agent_refusals_total counter\n";
  for (const auto& [key, n] : m.refusals)
    out += fmt::format("gpusnap_agent_refusals_total{{listener=\"{}\",status=\"{}\"}} {}\n", Escape(key.first),
                       key.second, n);
  if (const auto& t = m.pinned_tier) {
    out += "# HELP gpusnap_agent_pinned_tier_bytes The pinned chunk tier's bound and the bytes of its slots in use.\n";
    out += "# TYPE gpusnap_agent_pinned_tier_bytes gauge\n";
    out += fmt::format("gpusnap_agent_pinned_tier_bytes{{kind=\"capacity\"}} {}\n", t->capacity_bytes);
    out += fmt::format("gpusnap_agent_pinned_tier_bytes{{kind=\"used\"}} {}\n", t->used_bytes);
    out += "# HELP gpusnap_agent_pinned_tier_chunks Chunks in the pinned tier.\n";
    out += "# TYPE gpusnap_agent_pinned_tier_chunks gauge\n";
    out += fmt::format("gpusnap_agent_pinned_tier_chunks {}\n", t->chunks);
    out += "# HELP gpusnap_agent_pinned_tier_admissions_pending Batches of chunks waiting to enter the pinned tier, "
           "or entering it.\n";
    out += "# TYPE gpusnap_agent_pinned_tier_admissions_pending gauge\n";
    out += fmt::format("gpusnap_agent_pinned_tier_admissions_pending {}\n", t->admissions_pending);
    const std::pair<const char*, uint64_t> counters[] = {
        {"hits", t->hits}, {"misses", t->misses}, {"evictions", t->evictions}};
    const char* help[] = {"Chunks fills copied from the pinned tier.",
                          "Chunks fills read from the chunk store, not found in the pinned tier.",
                          "Chunks the pinned tier let go to make room for others."};
    for (size_t i = 0; i < std::size(counters); ++i) {
      out += fmt::format("# HELP gpusnap_agent_pinned_tier_{}_total {}\n", counters[i].first, help[i]);
      out += fmt::format("# TYPE gpusnap_agent_pinned_tier_{}_total counter\n", counters[i].first);
      out += fmt::format("gpusnap_agent_pinned_tier_{}_total {}\n", counters[i].first, counters[i].second);
    }
  }
  return out;
}

void Metrics::ObservePhase(const std::string& kind, const std::string& phase, double seconds) {
  MutexLock lock(mu_);
  m_.durations[{kind, phase}].Observe(seconds);
}

void Metrics::AddBytes(const std::string& kind, uint64_t bytes) {
  MutexLock lock(mu_);
  m_.bytes[kind] += bytes;
}

void Metrics::JobStarted() {
  MutexLock lock(mu_);
  ++m_.jobs_in_flight;
}

void Metrics::JobFinished(const std::string& kind, bool succeeded) {
  MutexLock lock(mu_);
  --m_.jobs_in_flight;
  ++m_.operations[{kind, succeeded ? "succeeded" : "failed"}];
}

void Metrics::Refused(const std::string& listener, int http_status) {
  MutexLock lock(mu_);
  ++m_.refusals[{listener, http_status}];
}

std::string Metrics::Format() const {
  MutexLock lock(mu_);
  return FormatMetrics(m_);
}

std::string Metrics::Format(int64_t standby_workloads,
                            const std::optional<gpushare::control::PinnedTierGauges>& pinned_tier) const {
  MetricsSnapshot m;
  {
    MutexLock lock(mu_);
    m = m_;
  }
  m.standby_workloads = standby_workloads;
  m.pinned_tier = pinned_tier;
  return FormatMetrics(m);
}

}  // namespace gpusnap::agent
