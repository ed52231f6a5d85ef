// `gpusnap cuda ACTION PID...`: the CUDA driver's checkpoint API, driven by
// gpusnap itself over many pids at once (src/cuda/checkpoint_api.h).
#include <cstdio>

#include "cli/cli.h"
#include "cuda/command.h"

namespace gpusnap::cli {

namespace {

nlohmann::json PidJson(const cuda::PidReport& p) {
  nlohmann::json j = {{"pid", p.pid}, {"ok", p.status.ok()}, {"seconds", p.seconds}, {"rolled_back", p.rolled_back}};
  j["state"] = p.state ? nlohmann::json(cuda::StateName(*p.state)) : nlohmann::json(nullptr);
  if (p.restore_tid != 0) j["restore_tid"] = p.restore_tid;
  if (!p.status.ok()) j["error"] = p.status.message();
  return j;
}

// One line per pid on stdout: "<pid> <STATE> [restore-tid <tid>] [(rolled back)] [error: ...]".
void PrintHuman(const cuda::Report& report) {
  for (const auto& p : report.pids) {
    std::string line = fmt::format("{} {}", p.pid, p.state ? cuda::StateName(*p.state) : "?");
    if (p.restore_tid != 0) line += fmt::format(" restore-tid {}", p.restore_tid);
    if (p.rolled_back) line += " (rolled back)";
    if (!p.status.ok()) line += " error: " + p.status.message();
    std::printf("%s\n", line.c_str());
  }
}

void PrintReport(Context& ctx, cuda::Action action, const cuda::CommandResult& r) {
  const cuda::Report& report = r.report;
  if (ctx.json) {
    nlohmann::json j = {{"action", cuda::ActionName(action)}, {"ok", report.ok()}, {"driver", r.driver},
                        {"timings_s", report.timings_s}};
    j["pids"] = nlohmann::json::array();
    for (const auto& p : report.pids) j["pids"].push_back(PidJson(p));
    if (!r.gpu_map.empty()) j["gpu_map"] = cuda::FormatGpuMap(r.gpu_map);
    if (!report.ok()) {
      j["error"] = report.status.message();
      j["code"] = CodeName(report.status.code());
    }
    ctx.PrintJson(j);
  } else if (report.timings_s.count("total") != 0) {  // the action ran (not stopped by loading or --gpu-map)
    PrintHuman(report);
    if (!ctx.quiet) {
      std::string phases;
      for (const char* phase : {"state", "restore-tid", "lock", "checkpoint", "restore", "unlock", "rollback", "total"})
        if (auto it = report.timings_s.find(phase); it != report.timings_s.end())
          phases += fmt::format("{}{} {:.3f} s", phases.empty() ? "" : ", ", phase, it->second);
      std::fprintf(stderr, "[cuda] %s %zu pid(s), driver %s: %s\n", cuda::ActionName(action), report.pids.size(),
                   r.driver.c_str(), phases.c_str());
    }
  }
  if (!report.ok()) {
    ctx.exit_code = 1;
    std::fprintf(stderr, "gpusnap: error: %s\n", report.status.message().c_str());
  }
}

void AddGpus(CLI::App& cuda, Context& ctx, std::shared_ptr<cuda::LoadOptions> load) {
  auto* sub = cuda.add_subcommand("gpus", "List the GPUs the driver sees: index, UUID, name, memory, compute capability");
  sub->callback([&ctx, load] {
    auto r = cuda::RunGpusCommand(*load);
    if (!r.ok()) return ctx.Fail(r.status());
    if (ctx.json) {
      nlohmann::json gpus = nlohmann::json::array();
      for (const auto& g : r->gpus)
        gpus.push_back({{"index", g.index}, {"uuid", cuda::FormatUuid(g.uuid)}, {"name", g.name},
                        {"total_bytes", g.total_bytes}, {"compute_capability", fmt::format("{}.{}", g.cc_major, g.cc_minor)}});
      return ctx.PrintJson({{"driver", r->driver}, {"gpus", gpus}});
    }
    for (const auto& g : r->gpus)
      std::printf("%d %s %s, %s, compute capability %d.%d\n", g.index, cuda::FormatUuid(g.uuid).c_str(), g.name.c_str(),
                  HumanBytes(g.total_bytes).c_str(), g.cc_major, g.cc_minor);
  });
}

}  // namespace

void AddCuda(CLI::App& app, Context& ctx) {
  auto* cuda = app.add_subcommand("cuda", "Drive the CUDA driver's checkpoint API on running processes (all pids at once)");
  cuda->require_subcommand(1);
  cuda->footer(
      "Every pid is locked before any is checkpointed and restored before any is unlocked; a failed lock unlocks\n"
      "the pids already locked. Human output: one line per pid, `<pid> <state>`. See docs/CUDA.md.");
  auto load = std::make_shared<cuda::LoadOptions>();
  cuda->add_option("--libcuda", load->library, "The CUDA driver library to dlopen")->capture_default_str();
  for (const cuda::ActionInfo& info : cuda::AllActions()) {
    auto* sub = cuda->add_subcommand(info.name, info.help);
    auto opts = std::make_shared<cuda::CommandOptions>();
    opts->action = info.action;
    sub->add_option("pid", opts->pids, "Process ids (host pids of CUDA processes)")->required();
    if (info.action == cuda::Action::kLock || info.action == cuda::Action::kSuspend)
      sub->add_option("--timeout-ms", opts->lock_timeout_ms, "Lock timeout per pid, ms (0: wait forever)")
          ->capture_default_str();
    if (info.action == cuda::Action::kRestore || info.action == cuda::Action::kResume)
      sub->add_option("--gpu-map", opts->gpu_map, "Restore onto other GPUs: FROM=TO,... (indices or GPU-UUIDs), e.g. 0=1,1=0");
    sub->callback([&ctx, opts, load] {
      opts->load = *load;
      PrintReport(ctx, opts->action, cuda::RunCommand(*opts));
    });
  }
  AddGpus(*cuda, ctx, load);
}

}  // namespace gpusnap::cli
