// The agent's GPU resources: the driver kept once for every job, and the
// pinned chunk tier (service.h, "GPU").
#include <algorithm>
#include <chrono>

#include "agent/service/service.h"
#include "cuda/driver.h"
#include "store/layout.h"
#include "util/progress_bar.h"

namespace gpusnap::agent {

namespace control = gpushare::control;

Result<GpuResources> Service::KeepGpu(uint64_t pinned_cache_bytes,
                                      const std::function<void(const std::string&)>& log) {
  GpuResources out;
  auto session = cuda::GpuSession::Open();
  Status retained = session.ok() ? (*session)->RetainAll().status() : session.status();
  if (!retained.ok()) {
    if (pinned_cache_bytes > 0) return retained.Wrap("--pinned-cache needs the CUDA driver");
    log(fmt::format("no CUDA driver kept ({}): each GPU job loads its own", retained.message()));
    return out;
  }
  out.session = std::move(session).value();
  log(fmt::format("CUDA driver {} loaded once for every job, a context kept on each GPU",
                  cuda::VersionText(out.session->driver()->version())));
  if (pinned_cache_bytes > 0) {
    GPUSNAP_ASSIGN_OR_RETURN(out.pinned_tier, control::PinnedTier::Make(out.session, pinned_cache_bytes));
    log(fmt::format("pinned chunk tier of {}", HumanBytes(out.pinned_tier->gauges().capacity_bytes)));
  }
  return out;
}

std::optional<control::PinnedTierGauges> Service::PinnedTierNow() const {
  if (!gpu_.pinned_tier) return std::nullopt;
  return gpu_.pinned_tier->gauges();
}

std::variant<Accepted, Refused> Service::StartWarm(const std::string& snapshot) {
  auto refuse = [](int status, std::string message) { return Refused{ApiError{status, std::move(message)}, ""}; };
  if (!gpu_.pinned_tier)
    return refuse(409, "this agent keeps no pinned chunks: start it with --pinned-cache SIZE (docs/AGENT.md)");
  auto meta = store_.Load(snapshot);
  if (!meta.ok()) return Refused{FromStatus(meta.status()), ""};
  if (!meta->gpu || !meta->gpu->gpushare)
    return refuse(409, fmt::format("snapshot `{}` holds no gpushare chunks: there is nothing to pin", snapshot));
  Job job;
  job.kind = "warm";
  job.lock_key = "warm:" + meta->id;
  job.target = fmt::format("snapshot {}", meta->id);
  job.snapshot = meta->id;
  return Launch(std::move(job), [this](Job& running) -> Status {
    std::string id = running.id;
    GPUSNAP_ASSIGN_OR_RETURN(SnapshotMeta held, HoldSnapshot(id, running.snapshot));
    return PinSnapshot(id, held);
  });
}

void Service::PinStandby(const std::string& id) {
  std::string snapshot;
  {
    MutexLock lock(mu_);
    snapshot = jobs_.at(id).snapshot;
  }
  auto meta = store_.Load(snapshot);
  Status st = meta.ok() ? PinSnapshot(id, *meta) : meta.status();
  if (!st.ok()) options_.log(fmt::format("job {}: the standby's chunks were not pinned: {}", id, st.ToString()));
}

Status Service::PinSnapshot(const std::string& id, const SnapshotMeta& meta) {
  if (!meta.gpu || !meta.gpu->gpushare) return Status::Ok();
  auto started = std::chrono::steady_clock::now();
  GPUSNAP_ASSIGN_OR_RETURN(
      auto refs, control::PreloadedChunks(store_.SnapshotDir(meta.id) + "/" + SnapshotFiles::kGpuDir,
                                          meta.gpu->ns_pids));
  GPUSNAP_ASSIGN_OR_RETURN(chunks::ChunkStore chunk_store, chunks::ChunkStore::Open(store_.root()));
  {
    MutexLock lock(mu_);
    Job& job = jobs_.at(id);
    job.phase = "pin";
    // A warm job's bytes are the pinning's; a restore's stay the snapshot's.
    if (job.kind == "warm") {
      job.bytes_done = 0;
      job.bytes_total = 0;
      for (const chunks::ChunkRef& r : refs) job.bytes_total += r.length;
    }
    Journal(job);
  }
  auto admitted = gpu_.pinned_tier->Admit(chunk_store, refs, [this, id](uint64_t done, uint64_t total) {
    MutexLock lock(mu_);
    Job& job = jobs_.at(id);
    if (job.kind != "warm") return;
    // The admission's threads report out of order: the most yet counts.
    job.bytes_done = std::max(job.bytes_done, done);
    job.bytes_total = total;
    Journal(job);
  });
  if (!admitted.ok()) return admitted.status().Wrap(fmt::format("snapshot `{}`", meta.id));
  MutexLock lock(mu_);
  Job& job = jobs_.at(id);
  job.timings_s["pin"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  Journal(job);
  options_.log(fmt::format("job {}: pinned {} chunks of `{}` ({}), {} there already, {} left out (the tier is full)",
                           id, admitted->admitted, meta.id, HumanBytes(admitted->bytes), admitted->present,
                           admitted->left_out));
  return Status::Ok();
}

}  // namespace gpusnap::agent
