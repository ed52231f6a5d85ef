// A long operation's progress as one line of text, for the CLI to redraw in
// place on a terminal (src/cli/progress.cc). Pure: no I/O, no clock.
//
// The library reports a phase as it finishes (ProgressEvent in
// include/gpusnap/progress.h), so the bar stands at the share of the
// operation's phases that have finished, in the order the library runs them;
// the bytes are shown as they are known.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpusnap {

// "812 B", "1.5 KiB", "3.4 GiB".
std::string HumanBytes(uint64_t bytes);

// The phases of "checkpoint" and "restore" in the order they run
// (src/snapshot/checkpoint.cc, restore.cc), the optional GPU ones included;
// empty for any other operation.
const std::vector<std::string>& PhaseOrder(const std::string& operation);

// The percentage once `phase` has finished: its place in PhaseOrder, at most
// 99 (100 is for an operation that has ended). `previous` for a phase not in
// the order, or one that would move the bar back.
int PhasePercent(const std::string& operation, const std::string& phase, int previous);

struct BarState {
  enum class End { kRunning, kSucceeded, kFailed };
  std::string operation;     // "checkpoint", "restore"
  std::string phase;         // the last phase that finished; empty before the first
  int percent = 0;           // 0..99 while running (PhasePercent)
  uint64_t bytes_done = 0;
  uint64_t bytes_total = 0;  // 0: unknown
  double elapsed_s = 0;
  End end = End::kRunning;
};

// One line of at most `columns` - 1 characters (so the terminal never wraps
// it), without control characters:
//   [checkpoint] [############--------]  60%  dump done  812.0 KiB  1.2 s
//   [restore] [####################] 100%  done  1.6 MiB / 1.6 MiB  0.8 s
// The bar is dropped when the line would not fit with it; `columns` < 20
// counts as 80 (a terminal that did not say).
std::string FormatProgressBar(const BarState& state, int columns);

}  // namespace gpusnap
