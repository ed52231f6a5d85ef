#include <cstdio>

#include "cli/cli.h"

namespace gpusnap::cli {

static nlohmann::json MetaSummary(const SnapshotMeta& m) {
  return {{"id", m.id},
          {"created", m.created},
          {"source", {{"kind", m.source.kind}, {"name", m.source.name}, {"pid", m.source.host_pid}}},
          {"total_bytes", m.total_bytes},
          {"timings_s", m.timings_s}};
}

void AddCheckpoint(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("checkpoint", "Checkpoint a workload (by name) or a process tree (by pid)");
  auto opts = std::make_shared<CheckpointOptions>();
  sub->add_option("target", opts->target, "Workload name or pid")->required();
  sub->add_flag("--leave-running", opts->leave_running, "Keep the source running after the checkpoint");
  sub->add_flag("--tcp-established", opts->tcp_established, "Include established TCP connections");
  sub->add_option("--store", opts->store, "Snapshot store (default $GPUSNAP_STORE or /var/lib/gpusnap)");
  sub->add_option("--id", opts->id, "Snapshot id (default: generated from the name)");
  sub->add_option("--gpu-lock-timeout-ms", opts->gpu_lock_timeout_ms, "How long each GPU process may take to drain")
      ->capture_default_str();
  sub->add_option("--criu", opts->criu_bundle, "CRIU bundle directory (default: found next to gpusnap)");
  sub->add_option("--timeout", opts->timeout_s, "Seconds CRIU may take")->capture_default_str();
  sub->add_flag("-v,--verbose", opts->verbose, "Verbose CRIU log");
  sub->add_option("--criu-config", opts->criu_config, "Extra CRIU configuration file (CRIU's own option syntax)");
  auto agent = std::make_shared<std::string>();
  sub->add_option("--agent", *agent, "Run it as a job of the node agent listening on this unix socket");
  sub->footer("Prints the snapshot id on its last line (--json: an object).");
  sub->callback([&ctx, opts, agent] {
    if (!agent->empty()) {
      if (Status st = CheckpointThroughAgent(ctx, *agent, *opts); !st.ok()) ctx.Fail(st);
      return;
    }
    opts->progress = ctx.Progress("checkpoint");
    auto meta = Checkpoint(*opts);
    if (!meta.ok()) return ctx.Fail(meta.status());
    if (ctx.json) return ctx.PrintJson(MetaSummary(*meta));
    if (!ctx.quiet)
      std::fprintf(stderr, "[checkpoint] %s: %s in %.2f s\n", meta->id.c_str(), HumanBytes(meta->total_bytes).c_str(),
                   meta->timings_s["total"]);
    std::printf("%s\n", meta->id.c_str());
  });
}

void AddRestore(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("restore", "Restore a snapshot into a fresh pid namespace, or a placeholder container's");
  auto opts = std::make_shared<RestoreOptions>();
  sub->add_option("id", opts->id, "Snapshot id (see `gpusnap ls`)")->required();
  sub->add_option("--store", opts->store, "Snapshot store (default $GPUSNAP_STORE or /var/lib/gpusnap)");
  sub->add_option("--name", opts->name, "Name of the restored workload (default: the source's)");
  sub->add_option("--criu", opts->criu_bundle, "CRIU bundle directory (default: found next to gpusnap)");
  sub->add_option("--timeout", opts->timeout_s, "Seconds CRIU may take")->capture_default_str();
  sub->add_flag("-v,--verbose", opts->verbose, "Verbose CRIU log");
  sub->add_option("--criu-config", opts->criu_config, "Extra CRIU configuration file (CRIU's own option syntax)");
  sub->add_option("--gpu-map", opts->gpu_map,
                  "Restore onto other GPUs: OLD=NEW[,...], the snapshot's GPU (index or UUID) = this machine's");
  sub->add_option("--gpus", opts->gpus, "Restore the snapshot's GPUs, in order, onto these GPU indices")->delimiter(',');
  sub->add_option("--into-container", opts->into_container,
                  "Restore into this container's namespaces and cgroups (an id or unique prefix); its init must be "
                  "an idle `gpusnap __placeholder`");
  auto agent = std::make_shared<std::string>();
  sub->add_option("--agent", *agent, "Run it as a job of the node agent listening on this unix socket");
  sub->footer("Prints the restored workload's host pid.");
  sub->callback([&ctx, opts, agent] {
    if (!agent->empty()) {
      if (Status st = RestoreThroughAgent(ctx, *agent, *opts); !st.ok()) ctx.Fail(st);
      return;
    }
    opts->progress = ctx.Progress("restore");
    auto r = Restore(*opts);
    if (!r.ok()) return ctx.Fail(r.status());
    if (ctx.json) {
      auto j = ToJson(r->workload);
      j["timings_s"] = r->timings_s;
      j["criu_log"] = r->log;
      return ctx.PrintJson(j);
    }
    if (!ctx.quiet)
      std::fprintf(stderr, "[restore] %s restored as `%s` in %.2f s\n", opts->id.c_str(), r->workload.name.c_str(),
                   r->timings_s["total"]);
    std::printf("%d\n", r->workload.pid);
  });
}

}  // namespace gpusnap::cli
