#include <chrono>
#include <cstdio>

#include "cli/cli.h"
#include "criu/lazy_pages_keeper.h"

namespace gpusnap::cli {

void AddPs(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("ps", "List workloads started by `gpusnap run` or restored");
  sub->callback([&ctx] {
    auto all = ListWorkloads();
    if (!all.ok()) return ctx.Fail(all.status());
    if (ctx.json) {
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& w : *all) arr.push_back(ToJson(w));
      return ctx.PrintJson(arr);
    }
    std::printf("%-24s %-8s %-8s %-24s %s\n", "NAME", "PID", "STATUS", "STARTED", "COMMAND");
    for (const auto& w : *all) {
      std::string cmd;
      for (const auto& a : w.cmdline) cmd += (cmd.empty() ? "" : " ") + a;
      std::printf("%-24s %-8d %-8s %-24s %s\n", w.name.c_str(), w.pid, WorkloadState(w), w.started.c_str(),
                  cmd.c_str());
      // A lazy restore's memory: arriving, in, or why its server's end killed the tree.
      if (!w.lazy_pages.empty())
        if (std::string state = criu::ReadLazyPagesState(w.lazy_pages); !state.empty())
          std::printf("%-24s memory %s\n", "", state.c_str());
    }
  });
}

void AddKill(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("kill", "End a workload, running or standby: its namespace and every process in it");
  auto name = std::make_shared<std::string>();
  sub->add_option("name", *name, "Workload name (see `gpusnap ps`)")->required();
  sub->footer("Its record stays, as exited, until the name is used again.");
  sub->callback([&ctx, name] {
    if (Status st = EndWorkload(*name, std::chrono::seconds(10)); !st.ok())
      return ctx.Fail(st.Wrap(fmt::format("kill `{}`", *name)));
    if (ctx.json) return ctx.PrintJson({{"killed", *name}});
    std::printf("%s\n", name->c_str());
  });
}

void AddRun(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand(
      "run", "Start a command in a new pid + mount namespace, detached, ready to be checkpointed");
  auto opts = std::make_shared<RunOptions>();
  sub->add_option("--name", opts->name, "Workload name (letters, digits, . _ -)")->required();
  sub->add_option("--log", opts->log, "File for the command's stdout and stderr (default: <run dir>/logs/NAME.log)");
  sub->add_flag("--gpushare", opts->gpushare,
                "Preload the gpushare shim: device memory is then checkpointed through the chunk store");
  sub->add_option("command", opts->argv, "The command and its arguments (after --)")->required();
  sub->footer("Example: gpusnap run --name counter -- python3 -u count.py\nPrints the workload's host pid.");
  sub->callback([&ctx, opts] {
    auto w = RunWorkload(*opts);
    if (!w.ok()) return ctx.Fail(w.status().Wrap(fmt::format("run `{}`", opts->name)));
    if (ctx.json) return ctx.PrintJson(ToJson(*w));
    std::printf("%d\n", w->pid);
  });
}

}  // namespace gpusnap::cli
