#include "util/progress_bar.h"

#include <algorithm>

#include <fmt/format.h>

namespace gpusnap {

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

const std::vector<std::string>& PhaseOrder(const std::string& operation) {
  static const std::vector<std::string> kCheckpoint = {"resolve", "gpushare-release", "gpu-suspend", "dump",
                                                       "publish"};
  static const std::vector<std::string> kRestore = {"verify", "namespace", "criu-restore", "gpu-restore",
                                                    "gpushare-load"};
  static const std::vector<std::string> kWake = {"check", "gpu-restore", "gpushare-load"};
  static const std::vector<std::string> kNone;
  return operation == "checkpoint" ? kCheckpoint
         : operation == "restore"  ? kRestore
         : operation == "wake"     ? kWake
                                   : kNone;
}

int PhasePercent(const std::string& operation, const std::string& phase, int previous) {
  const auto& order = PhaseOrder(operation);
  auto it = std::find(order.begin(), order.end(), phase);
  if (it == order.end()) return previous;
  int at = static_cast<int>(100 * (it - order.begin() + 1) / order.size());
  return std::max(previous, std::min(at, 99));
}

std::string FormatProgressBar(const BarState& s, int columns) {
  if (columns < 20) columns = 80;
  int percent = s.end == BarState::End::kSucceeded ? 100 : std::clamp(s.percent, 0, 99);
  std::string label = s.end == BarState::End::kSucceeded ? "done"
                      : s.end == BarState::End::kFailed  ? (s.phase.empty() ? "failed" : "failed after " + s.phase)
                      : s.phase.empty()                  ? "starting"
                                                         : s.phase + " done";
  std::string bytes = s.bytes_total > 0 ? HumanBytes(s.bytes_done) + " / " + HumanBytes(s.bytes_total)
                      : s.bytes_done > 0 ? HumanBytes(s.bytes_done)
                                         : "";
  std::string tail = fmt::format("{:3d}%  {}{}{}  {:.1f} s", percent, label, bytes.empty() ? "" : "  ", bytes,
                                 s.elapsed_s);
  std::string prefix = "[" + s.operation + "] ";
  const int max_len = columns - 1;
  // "[" + bar + "] " around the bar.
  int room = max_len - static_cast<int>(prefix.size() + tail.size()) - 3;
  std::string line;
  if (room >= 8) {
    int width = std::min(room, 30);
    int filled = width * percent / 100;
    line = prefix + "[" + std::string(filled, '#') + std::string(width - filled, '-') + "] " + tail;
  } else {
    line = prefix + tail;
  }
  if (static_cast<int>(line.size()) > max_len) line.resize(max_len);
  return line;
}

}  // namespace gpusnap
