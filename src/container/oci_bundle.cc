#include "container/oci_bundle.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "proc/proc.h"
#include "util/files.h"

namespace gpusnap::container {

std::string BundleConfig::image() const {
  auto it = annotations.find(kImageNameAnnotation);
  return it == annotations.end() ? "" : it->second;
}

std::string BundleConfig::image_id() const {
  auto it = annotations.find(kImageIdAnnotation);
  return it == annotations.end() ? "" : it->second;
}

Result<BundleConfig> ParseBundleConfig(std::string_view text, std::string_view where) {
  auto bad = [&](std::string_view why) {
    return Status::Error(Code::kCorruption, "`{}` is no OCI runtime config: {}", where, why);
  };
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  BundleConfig c;
  c.path = std::string(where);
  auto process = j.find("process");
  if (process == j.end() || !process->is_object()) return bad("it has no `process` object");
  auto args = process->find("args");
  if (args == process->end() || !args->is_array() || args->empty()) return bad("`process.args` is missing or empty");
  for (const auto& a : *args) {
    if (!a.is_string()) return bad("`process.args` holds a value that is not a string");
    c.args.push_back(a.get<std::string>());
  }
  if (auto cwd = process->find("cwd"); cwd != process->end() && cwd->is_string())
    c.cwd = cwd->get<std::string>();
  if (c.cwd.empty()) c.cwd.push_back('/');
  if (auto env = process->find("env"); env != process->end() && env->is_array())
    for (const auto& e : *env)
      if (e.is_string()) c.env.push_back(e.get<std::string>());
  if (auto an = j.find("annotations"); an != j.end() && an->is_object())
    for (const auto& [k, v] : an->items())
      if (v.is_string()) c.annotations[k] = v.get<std::string>();
  return c;
}

Result<BundleConfig> ReadContainerBundle(pid_t init) {
  GPUSNAP_ASSIGN_OR_RETURN(auto st, proc::ReadStat(init));
  std::string path = fmt::format("/proc/{}/cwd/config.json", st.ppid);
  auto text = ReadFile(path);
  if (!text.ok())
    return Status::Error(Code::kNotFound,
                         "the container of pid {} has no OCI bundle config where its runtime's shim (pid {}) runs: {}",
                         init, st.ppid, text.status().message());
  return ParseBundleConfig(*text, fmt::format("config.json of the container of pid {}", init));
}

}  // namespace gpusnap::container
