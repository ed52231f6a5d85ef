// What push and pull share: running blob transfers a few at a time, and the
// running account of them that the progress shows (blobs moved and skipped,
// bytes, rate) about once a second.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "gpusnap/distribution.h"
#include "util/mutex.h"

namespace gpusnap::registry {

class TransferMeter {
 public:
  // `verb`: "push" or "pull", the phase name of the progress events.
  TransferMeter(std::string verb, ProgressFn progress, uint64_t blobs, uint64_t bytes_total);
  ~TransferMeter();  // stops the ticker

  void Moved(uint64_t bytes) { bytes_moved_ += bytes; }
  void BlobMoved() { ++blobs_moved_; }
  void BlobSkipped(uint64_t bytes) {
    ++blobs_skipped_;
    bytes_skipped_ += bytes;
  }

  // The final account into `r`, and the last event (done).
  void Finish(TransferResult& r);

 private:
  std::string Line(double seconds) const;

  std::string verb_;
  ProgressFn progress_;
  uint64_t blobs_, bytes_total_;
  std::atomic<uint64_t> bytes_moved_{0}, blobs_moved_{0}, blobs_skipped_{0}, bytes_skipped_{0};
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  Mutex mu_;
  bool stop_ GUARDED_BY(mu_) = false;
  std::condition_variable wake_;
  std::thread ticker_;
};

// Runs task(0..n-1) on `jobs` threads; once one fails the others start no new
// task. Returns the first failure.
Status RunEach(size_t n, int jobs, const std::function<Status(size_t)>& task);

}  // namespace gpusnap::registry
