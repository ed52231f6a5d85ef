#include "registry/transfer.h"

#include <fmt/format.h>

#include <vector>

#include "util/first_failure.h"
#include "util/progress_bar.h"

namespace gpusnap::registry {

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

TransferMeter::TransferMeter(std::string verb, ProgressFn progress, uint64_t blobs, uint64_t bytes_total)
    : verb_(std::move(verb)), progress_(std::move(progress)), blobs_(blobs), bytes_total_(bytes_total) {
  if (!progress_) return;
  ticker_ = std::thread([this] {
    uint64_t reported = 0;
    MutexLock lock(mu_);
    while (!stop_) {
      lock.WaitFor(wake_, std::chrono::seconds(1));
      if (stop_) break;
      uint64_t now = bytes_moved_;
      progress_({Line(SecondsSince(start_)), SecondsSince(start_), now - reported, false});
      reported = now;
    }
  });
}

TransferMeter::~TransferMeter() {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

std::string TransferMeter::Line(double seconds) const {
  uint64_t moved = bytes_moved_;
  double rate = seconds > 0 ? double(moved) / seconds : 0;
  return fmt::format("{}: {} of {} blobs moved, {} already there; {} of {} moved, {}/s", verb_,
                     uint64_t(blobs_moved_), blobs_, uint64_t(blobs_skipped_), HumanBytes(moved),
                     HumanBytes(bytes_total_ - bytes_skipped_), HumanBytes(uint64_t(rate)));
}

void TransferMeter::Finish(TransferResult& r) {
  {
    MutexLock lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (ticker_.joinable()) ticker_.join();
  r.blobs = blobs_;
  r.blobs_moved = blobs_moved_;
  r.blobs_skipped = blobs_skipped_;
  r.bytes_moved = bytes_moved_;
  r.bytes_total = bytes_total_;
  r.seconds = SecondsSince(start_);
  if (progress_) progress_({verb_, r.seconds, 0, true});
}

Status RunEach(size_t n, int jobs, const std::function<Status(size_t)>& task) {
  std::atomic<size_t> next{0};
  FirstFailure failure;
  std::atomic<bool> failed{false};
  auto worker = [&] {
    for (size_t i; !failed && (i = next++) < n;) {
      Status st = task(i);
      if (!st.ok()) {
        failure.Record(st);
        failed = true;
      }
    }
  };
  std::vector<std::thread> threads;
  size_t count = std::min<size_t>(n, jobs < 1 ? 1 : size_t(jobs));
  for (size_t t = 1; t < count; ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
  return failure.Get();
}

}  // namespace gpusnap::registry
