// `gpusnap gpushare state|suspend|resume PID...`: the gpushare shim inside
// running processes, driven in place (src/gpushare/control/tree.h).
#include <cstdio>

#include "cli/cli.h"
#include "gpushare/control/tree.h"

namespace gpusnap::cli {

namespace {

struct GpushareArgs {
  std::vector<pid_t> pids;
  std::string store;
  int timeout_ms = 10000;
};

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

}  // namespace

void AddGpushare(CLI::App& app, Context& ctx) {
  auto* cmd = app.add_subcommand("gpushare", "Drive the gpushare shim inside running GPU processes");
  cmd->require_subcommand(1);
  cmd->footer(
      "The processes must have been started with the shim (`gpusnap run --gpushare`).\n"
      "  state    each process's shim state (running, quiesced, released) and device memory\n"
      "  suspend  hold new GPU work, drain, save device memory to the chunk store and free it\n"
      "  resume   load device memory back at the same addresses and let held work go");
  auto args = std::make_shared<GpushareArgs>();
  auto add = [&](const char* name, const char* help) {
    auto* sub = cmd->add_subcommand(name, help);
    sub->add_option("pids", args->pids, "Process ids")->required()->check(CLI::PositiveNumber);
    return sub;
  };
  add("state", "Show the shim's state in each process")->callback([&ctx, args] {
    auto procs = gpushare::control::ShimProcessesOf(args->pids);
    if (!procs.ok()) return ctx.Fail(procs.status());
    if (!PrintStates(ctx, *procs, "state", {})) ctx.exit_code = 1;
  });
  auto* suspend = add("suspend", "Free the device memory of the processes (all or none), keeping them alive");
  suspend->add_option("--store", args->store, "Snapshot store whose chunk store receives the memory (default $GPUSNAP_STORE or /var/lib/gpusnap)");
  suspend->add_option("--timeout-ms", args->timeout_ms, "How long running GPU work may take to drain")
      ->check(CLI::Range(1, 3600000));
  suspend->callback([&ctx, args] {
    auto procs = gpushare::control::ShimProcessesOf(args->pids);
    if (!procs.ok()) return ctx.Fail(procs.status());
    std::string store = StoreOrDefault(args->store);
    std::map<std::string, double> timings;
    Status st = gpushare::control::SuspendInPlace(*procs, store, args->timeout_ms, timings);
    if (!st.ok()) return ctx.Fail(st.Wrap("gpushare suspend (every process was resumed)"));
    if (!PrintStates(ctx, *procs, "suspend", timings)) ctx.exit_code = 1;
  });
  auto* resume = add("resume", "Give the processes their device memory back and let them run");
  resume->add_option("--store", args->store, "The store given to suspend");
  resume->callback([&ctx, args] {
    auto procs = gpushare::control::ShimProcessesOf(args->pids);
    if (!procs.ok()) return ctx.Fail(procs.status());
    std::string store = StoreOrDefault(args->store);
    std::map<std::string, double> timings;
    Status st = gpushare::control::ResumeInPlace(*procs, store, timings);
    if (!st.ok()) return ctx.Fail(st.Wrap("gpushare resume"));
    if (!PrintStates(ctx, *procs, "resume", timings)) ctx.exit_code = 1;
  });
}

}  // namespace gpusnap::cli
