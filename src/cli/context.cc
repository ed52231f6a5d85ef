#include <unistd.h>

#include <cstdio>

#include "cli/cli.h"
#include "criu/lazy_pages_keeper.h"

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

void Context::Note(const std::string& line) const {
  if (!quiet && !line.empty()) std::fprintf(stderr, "gpusnap: note: %s\n", line.c_str());
}

nlohmann::json ToJson(const Workload& w) {
  nlohmann::json j = {{"name", w.name},       {"pid", w.pid},         {"reaper_pid", w.reaper_pid},
                      {"cmdline", w.cmdline}, {"log", w.log},         {"started", w.started},
                      {"running", w.running}, {"restored_from", w.restored_from}, {"state", WorkloadState(w)},
                      {"standby", w.running && w.standby}, {"suspended", w.running && w.suspended}};
  if (!w.lazy_pages.empty())
    j["lazy_pages"] = {{"dir", w.lazy_pages}, {"state", criu::ReadLazyPagesState(w.lazy_pages)}};
  return j;
}

}  // namespace gpusnap::cli
