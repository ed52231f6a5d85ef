#include "cuda/command.h"

#include "cuda/gpu_map.h"

namespace gpusnap::cuda {

// Resolves --gpu-map text against the driver's GPUs.
static Result<GpuMap> ResolveGpuMap(const Driver& driver, const std::string& text) {
  if (text.empty()) return GpuMap{};
  GPUSNAP_ASSIGN_OR_RETURN(auto entries, ParseGpuMap(text));
  GPUSNAP_ASSIGN_OR_RETURN(auto gpus, ListGpus(driver));
  return TranslateGpuMap(entries, gpus, gpus);
}

CommandResult RunCommand(const CommandOptions& options) {
  CommandResult out;
  for (pid_t pid : options.pids) {
    out.report.pids.emplace_back();
    out.report.pids.back().pid = pid;
  }
  auto driver = Driver::Load(options.load);
  if (!driver.ok()) {
    out.report.status = driver.status();
    return out;
  }
  out.driver = VersionText(driver->version());
  auto map = ResolveGpuMap(*driver, options.gpu_map);
  if (!map.ok()) {
    out.report.status = map.status();
    return out;
  }
  out.gpu_map = *map;
  ActionArgs args;
  args.lock_timeout_ms = options.lock_timeout_ms;
  args.gpu_map = *map;
  out.report = RunAction(*driver, options.action, options.pids, args);
  return out;
}

Result<GpusResult> RunGpusCommand(const LoadOptions& load) {
  GPUSNAP_ASSIGN_OR_RETURN(Driver driver, Driver::Load(load));
  GpusResult out;
  out.driver = VersionText(driver.version());
  GPUSNAP_ASSIGN_OR_RETURN(out.gpus, ListGpus(driver));
  return out;
}

}  // namespace gpusnap::cuda
