// `gpusnap gpushare state|suspend|resume PID...|NAME`, `swap NAME NAME`: the
// gpushare shim inside running processes, driven in place (the stories of
// src/snapshot/in_place.cc).
#include <charconv>
#include <cstdio>

#include "cli/cli.h"
#include "gpu/processes.h"
#include "gpushare/control/tree.h"
#include "gpusnap/operations.h"
#include "proc/proc.h"

namespace gpusnap::cli {

namespace {

struct GpushareArgs {
  std::vector<std::string> targets;  // pids, or one workload name
  std::string store;
  int timeout_ms = 10000;
};

// The arguments as the stories take them: all pids, or one workload name.
Result<InPlaceOptions> InPlaceTargets(const GpushareArgs& args) {
  InPlaceOptions o;
  o.store = args.store;
  o.quiesce_timeout_ms = args.timeout_ms;
  for (const std::string& t : args.targets) {
    pid_t pid = 0;
    auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), pid);
    if (ec == std::errc() && end == t.data() + t.size() && pid > 0) {
      o.pids.push_back(pid);
      continue;
    }
    if (args.targets.size() > 1)
      return Status::Error(Code::kInvalidArgument, "`{}` is not a pid: give pids, or one workload name", t);
    GPUSNAP_RETURN_IF_ERROR(CheckWorkloadName(t));
    o.name = t;
  }
  return o;
}

std::string Summary(const nlohmann::json& j) {
  return fmt::format("{} allocation(s), {} ({} released){}", j.value("allocations", 0),
                     HumanBytes(j.value("bytes", uint64_t{0})), HumanBytes(j.value("released_bytes", uint64_t{0})),
                     j.value("held_calls", 0) > 0 ? fmt::format(", {} call(s) held", j.value("held_calls", 0)) : "");
}

// The state of every process, printed; false when one could not be asked.
bool PrintStates(Context& ctx, const std::vector<gpushare::control::ShimProcess>& procs, const char* action,
                 const std::map<std::string, double>& timings) {
  nlohmann::json out = {{"action", action}, {"timings_s", timings}, {"pids", nlohmann::json::array()}};
  bool ok = true;
  for (const auto& p : procs) {
    auto st = gpushare::control::Send(p, {gpushare::ShimCommand::kState, "", "", 10000}, 30000);
    if (!st.ok()) {
      ok = false;
      out["pids"].push_back({{"pid", p.pid}, {"error", st.status().message()}});
      if (!ctx.json) std::printf("%d error: %s\n", p.pid, st.status().message().c_str());
      continue;
    }
    nlohmann::json j = *st;
    j.erase("ok");
    j["pid"] = p.pid;
    j["socket"] = "@" + p.socket;
    out["pids"].push_back(j);
    if (!ctx.json) std::printf("%d %s %s\n", p.pid, j.value("state", "?").c_str(), Summary(j).c_str());
  }
  if (ctx.json) ctx.PrintJson(out);
  return ok;
}

// The GPU processes of a workload's tree.
std::vector<pid_t> GpuProcessesOf(const Workload& w) { return gpu::FindGpuProcesses(proc::Tree(w.pid)); }

void PrintDone(Context& ctx, const InPlaceResult& done, const char* action) {
  auto procs = gpushare::control::ShimProcessesOf(done.pids);
  if (!procs.ok()) return ctx.Fail(procs.status());
  if (!PrintStates(ctx, *procs, action, done.timings_s)) ctx.exit_code = 1;
}

}  // namespace

void AddGpushare(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("gpushare", "Drive the gpushare shim inside running GPU processes");
  cmd->require_subcommand(1);
  cmd->footer(
      "The processes must have been started with the shim (`gpusnap run --gpushare`).\n"
      "  state    each process's shim state (running, quiesced, released) and device memory\n"
      "  suspend  hold new GPU work, drain, save device memory to the chunk store and free it\n"
      "  resume   load device memory back at the same addresses and let held work go\n"
      "  swap     suspend one workload, then resume another (undone if the resume fails)\n"
      "suspend and resume take pids, or one workload name (`gpusnap ps` then shows it suspended).");
  auto args = std::make_shared<GpushareArgs>();
  auto add = [&](const char* name, const char* help) {
    auto* sub = cmd->add_subcommand(name, help);
    sub->add_option("targets", args->targets, "Process ids, or a workload name")->required();
    return sub;
  };
  add("state", "Show the shim's state in each process")->callback([&ctx, args] {
    auto targets = InPlaceTargets(*args);
    if (!targets.ok()) return ctx.Fail(targets.status());
    std::vector<pid_t> pids = targets->pids;
    if (!targets->name.empty()) {
      auto w = FindWorkload(targets->name);
      if (!w.ok()) return ctx.Fail(w.status());
      pids = GpuProcessesOf(*w);
    }
    auto procs = gpushare::control::ShimProcessesOf(pids);
    if (!procs.ok()) return ctx.Fail(procs.status());
    if (!PrintStates(ctx, *procs, "state", {})) ctx.exit_code = 1;
  });
  auto* suspend = add("suspend", "Free the device memory of the processes (all or none), keeping them alive");
  suspend->add_option("--store", args->store, "Snapshot store whose chunk store receives the memory (default $GPUSNAP_STORE or /var/lib/gpusnap)");
  suspend->add_option("--timeout-ms", args->timeout_ms, "How long running GPU work may take to drain")
      ->check(CLI::Range(1, 3600000));
  suspend->callback([&ctx, args] {
    auto targets = InPlaceTargets(*args);
    if (!targets.ok()) return ctx.Fail(targets.status());
    auto done = SuspendInPlace(*targets);
    if (!done.ok()) return ctx.Fail(done.status().Wrap("gpushare suspend (every process was resumed)"));
    PrintDone(ctx, *done, "suspend");
  });
  auto* resume = add("resume", "Give the processes their device memory back and let them run");
  resume->add_option("--store", args->store, "The store given to suspend");
  resume->callback([&ctx, args] {
    auto targets = InPlaceTargets(*args);
    if (!targets.ok()) return ctx.Fail(targets.status());
    auto done = ResumeInPlace(*targets);
    if (!done.ok()) return ctx.Fail(done.status().Wrap("gpushare resume"));
    PrintDone(ctx, *done, "resume");
  });
  auto swap = std::make_shared<SwapOptions>();
  auto* sw = cmd->add_subcommand("swap", "Suspend one workload in place, then resume another (one GPU, two models)");
  sw->add_option("suspend", swap->suspend, "The running workload to suspend first")->required();
  sw->add_option("resume", swap->resume, "The suspended workload to resume after")->required();
  sw->add_option("--store", swap->store, "Snapshot store whose chunk store receives the memory");
  sw->add_option("--timeout-ms", swap->quiesce_timeout_ms, "How long running GPU work may take to drain")
      ->check(CLI::Range(1, 3600000));
  sw->callback([&ctx, swap] {
    auto done = SwapWorkloads(*swap);
    if (!done.ok()) return ctx.Fail(done.status());
    if (ctx.json)
      return ctx.PrintJson({{"suspended", ToJson(done->suspended)}, {"resumed", ToJson(done->resumed)},
                            {"timings_s", done->timings_s}});
    std::printf("%s suspended, %s running (%.3f s)\n", done->suspended.name.c_str(), done->resumed.name.c_str(),
                done->timings_s.count("total") ? done->timings_s.at("total") : 0.0);
  });
}

}  // namespace gpusnap::cli
