// What a long command (checkpoint, restore) shows on stderr while it runs:
//  - on a terminal (stderr is a TTY, $TERM is not "dumb"): one bar, redrawn in
//    place with "\r" as phases finish and every 200 ms for the elapsed time
//    (util/progress_bar.h formats it), ended by Finish with its last state;
//  - otherwise: one line per finished phase, "[checkpoint] dump done (0.18 s)";
//  - with --quiet or --json: nothing.
//
// Thread-safety: Event, SetBytesTotal and Finish may be called from any
// thread; the library calls Fn()'s function from its own.
#pragma once

#include <chrono>
#include <condition_variable>
#include <string>
#include <thread>

#include "cli/cli.h"
#include "util/mutex.h"
#include "util/progress_bar.h"
#include "util/thread_annotations.h"

namespace gpusnap::cli {

class ProgressDisplay {
 public:
  ProgressDisplay(const Context& ctx, std::string operation);
  // Ends a bar that Finish did not end (as failed), so that what follows
  // starts on a line of its own.
  ~ProgressDisplay();
  ProgressDisplay(const ProgressDisplay&) = delete;
  ProgressDisplay& operator=(const ProgressDisplay&) = delete;

  // For CheckpointOptions/RestoreOptions::progress; empty when nothing shows.
  // REQUIRES: this display outlives the operation.
  ProgressFn Fn();
  void Event(const ProgressEvent& event) EXCLUDES(mu_);
  void SetBytesTotal(uint64_t total) EXCLUDES(mu_);  // 0: unknown
  // The bar's last redraw, with its newline. Once; later calls do nothing.
  void Finish(bool ok) EXCLUDES(mu_);

 private:
  enum class Mode { kNone, kLines, kBar };
  void Draw() REQUIRES(mu_);

  Mode mode_;
  std::chrono::steady_clock::time_point started_;
  Mutex mu_;
  std::condition_variable wake_;  // ended_ set
  BarState state_ GUARDED_BY(mu_);
  bool ended_ GUARDED_BY(mu_) = false;
  std::thread ticker_;
};

}  // namespace gpusnap::cli
