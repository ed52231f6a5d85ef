#include <unistd.h>

#include <cstdio>

#include "cli/cli.h"

namespace gpusnap::cli {

void Context::Fail(const Status& status) {
  exit_code = 1;
  if (json) {
    std::printf("%s\n", nlohmann::json{{"error", status.message()}, {"code", CodeName(status.code())}}.dump(2).c_str());
  }
  std::fprintf(stderr, "gpusnap: error: %s\n", status.message().c_str());
}

void Context::PrintJson(const nlohmann::json& value) const {
  if (json) std::printf("%s\n", value.dump(2).c_str());
}

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

ProgressFn Context::Progress(const std::string& operation) const {
  if (quiet || json) return nullptr;
  return [operation](const ProgressEvent& e) {
    std::string bytes = e.bytes ? fmt::format(", {}", HumanBytes(e.bytes)) : "";
    std::fprintf(stderr, "[%s] %s %s (%.2f s%s)\n", operation.c_str(), e.phase.c_str(), e.done ? "done" : "...",
                 e.seconds, bytes.c_str());
  };
}

nlohmann::json ToJson(const Workload& w) {
  return {{"name", w.name},       {"pid", w.pid},         {"reaper_pid", w.reaper_pid},
          {"cmdline", w.cmdline}, {"log", w.log},         {"started", w.started},
          {"running", w.running}, {"restored_from", w.restored_from}};
}

}  // namespace gpusnap::cli
