#include <cstdio>
#include <filesystem>

#include "cli/cli.h"
#include "cli/progress.h"
#include "cli/usage.h"

namespace gpusnap::cli {

namespace {

nlohmann::json MetaSummary(const SnapshotMeta& m) {
  return {{"id", m.id},
          {"created", m.created},
          {"source", {{"kind", m.source.kind}, {"name", m.source.name}, {"pid", m.source.host_pid}}},
          {"total_bytes", m.total_bytes},
          {"capture_path",
           {{"path", CapturePathName(m.capture_path.path)},
            {"requested", CapturePathName(m.capture_path.requested)},
            {"reason", m.capture_path.reason}}},
          {"timings_s", m.timings_s}};
}

double Total(const std::map<std::string, double>& timings) {
  auto it = timings.find("total");
  return it == timings.end() ? 0 : it->second;
}

const char* kAgentFooter =
    "Runs as a job of the node agent when one answers on its socket, else in this process (docs/AGENT.md).";

void PrintCheckpoint(const Context& ctx, const CheckpointOptions&, const Checkpointed& done) {
  const SnapshotMeta& meta = done.meta;
  if (ctx.json) {
    nlohmann::json j = MetaSummary(meta);
    if (!done.job.empty()) j["job"] = done.job;
    return ctx.PrintJson(j);
  }
  if (!ctx.quiet) {
    std::fprintf(stderr, "[checkpoint] %s: %s in %.2f s\n", meta.id.c_str(), HumanBytes(meta.total_bytes).c_str(),
                 Total(meta.timings_s));
    if (meta.capture_path.path != CapturePath::kProcess || meta.capture_path.requested != CapturePath::kProcess)
      std::fprintf(stderr, "[checkpoint] capture path: %s (%s)\n",
                   std::string(CapturePathName(meta.capture_path.path)).c_str(), meta.capture_path.reason.c_str());
  }
  std::printf("%s\n", meta.id.c_str());
}

void PrintRestore(const Context& ctx, const RestoreOptions& o, const Restored& done) {
  const RestoreResult& r = done.result;
  if (!ctx.quiet && !r.fallback_reason.empty())
    std::fprintf(stderr, "[restore] restored by the rootfs path: %s\n", r.fallback_reason.c_str());
  if (ctx.json) {
    auto j = ToJson(r.workload);
    j["timings_s"] = r.timings_s;
    j["criu_log"] = r.log;
    j["restore_path"] = CapturePathName(r.restore_path);
    j["fallback_reason"] = r.fallback_reason;
    if (!done.job.empty()) j["job"] = done.job;
    return ctx.PrintJson(j);
  }
  if (!ctx.quiet) {
    std::fprintf(stderr, "[restore] %s restored as `%s`%s in %.2f s\n", o.source.ToString().c_str(),
                 r.workload.name.c_str(),
                 o.standby                    ? ", a standby (`gpusnap wake` it)"
                 : r.restore_path == CapturePath::kRootfs ? " by its rootfs capture (a cold start with its caches)"
                                              : "",
                 Total(r.timings_s));
  }
  std::printf("%d\n", r.workload.pid);
}

void PrintWake(const Context& ctx, const WakeOptions& o, const Woken& done) {
  const WakeResult& r = done.result;
  if (ctx.json) {
    auto j = ToJson(r.workload);
    j["timings_s"] = r.timings_s;
    if (!done.job.empty()) j["job"] = done.job;
    return ctx.PrintJson(j);
  }
  if (!ctx.quiet) std::fprintf(stderr, "[wake] `%s` woken in %.2f s\n", o.name.c_str(), Total(r.timings_s));
  std::printf("%d\n", r.workload.pid);
}

// The store a command names (a wake's is its standby's, which its record names).
std::string* StoreField(CheckpointOptions& o) { return &o.store; }
std::string* StoreField(RestoreOptions& o) { return &o.store; }
std::string* StoreField(WakeOptions&) { return nullptr; }

// What checkpoint, restore and wake share: the route, the progress display, the
// operation through the agent or in this process, then the result or the error.
template <typename Options, typename Done>
void RunOperation(Context& ctx, const CLI::App& sub, const AgentFlags& agent, Options& o, const char* operation,
                  const std::vector<std::string>& in_process_only,
                  Result<Done> (*through_agent)(const std::string&, const Options&, ProgressDisplay&),
                  Result<Done> (*in_process)(const Options&),
                  void (*print)(const Context&, const Options&, const Done&)) {
  std::string* store = StoreField(o);
  auto route = RouteCommand(ctx, sub, agent, store ? *store : "", in_process_only);
  if (!route.ok()) return ctx.Fail(route.status());
  ProgressDisplay progress(ctx, operation);
  Result<Done> done = Status::Error(Code::kInternal, "no {} ran", operation);
  if (route->through_agent) {
    done = through_agent(route->socket, o, progress);
  } else {
    if (store && !route->store.empty()) *store = route->store;
    o.progress = progress.Fn();
    done = in_process(o);
    o.progress = nullptr;  // it draws on `progress`, which ends here
  }
  progress.Finish(done.ok());
  if (!done.ok()) return ctx.Fail(done.status());
  print(ctx, o, *done);
}

Result<Checkpointed> CheckpointHere(const CheckpointOptions& o) {
  auto meta = Checkpoint(o);  // an empty capture path is the process path
  if (!meta.ok()) return meta.status();
  return Checkpointed{std::move(meta).value(), ""};
}

Result<Restored> RestoreHere(const RestoreOptions& o) {
  auto r = Restore(o);
  if (!r.ok()) return r.status();
  return Restored{std::move(r).value(), ""};
}

Result<Woken> WakeHere(const WakeOptions& o) {
  auto r = Wake(o);
  if (!r.ok()) return r.status();
  return Woken{std::move(r).value(), ""};
}

// --criu-config: an existing file, passed on by absolute path, since CRIU
// skips a file it cannot open without a word and reads a relative path from
// its own working directory (/).
void AddCriuConfig(CLI::App& sub, std::string& path) {
  sub.add_option("--criu-config", path, "Extra CRIU configuration file (CRIU's own option syntax; in-process)")
      ->transform([](std::string given) {
        std::error_code ec;
        auto absolute = std::filesystem::absolute(given, ec);
        return ec ? given : absolute.string();
      })
      ->check(CLI::ExistingFile);
}

// --gpu-map and --gpus, parsed into `gpus` as they are read (cuda/gpu_map.h).
void AddGpuChoice(CLI::App& sub, cuda::GpuMapSpec& gpus, const char* verb, const char* where) {
  auto* map = sub.add_option_function<std::string>(
      "--gpu-map",
      [&gpus](const std::string& text) { gpus.entries = ParsedOrUsageError(cuda::ParseGpuMap(text), "--gpu-map"); },
      fmt::format("{} onto other GPUs: OLD=NEW[,...], the snapshot's GPU (index or UUID) = this machine's", verb));
  sub.add_option_function<std::vector<int>>(
         "--gpus",
         [&gpus](const std::vector<int>& indices) {
           gpus.gpus = ParsedOrUsageError(cuda::MakeGpuMapSpec("", indices), "--gpus").gpus;
         },
         fmt::format("{} the snapshot's GPUs, in order, onto these GPU indices {}", verb, where))
      ->delimiter(',')
      ->excludes(map);
}

}  // namespace

void AddCheckpoint(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("checkpoint", "Checkpoint a workload (by name) or a process tree (by pid)");
  auto opts = std::make_shared<CheckpointOptions>();
  sub->add_option_function<std::string>(
         "target",
         [opts](const std::string& text) {
           opts->target = ParsedOrUsageError(
               ParseTargetArgument(text, [](std::string_view name) { return FindWorkload(std::string(name)).ok(); }),
               "target");
         },
         "Workload name, pid, or container id (12-64 hex digits, or a unique prefix)")
      ->required();
  sub->add_flag("--leave-running", opts->leave_running, "Keep the source running after the checkpoint");
  sub->add_option_function<std::string>(
         "--capture-path",
         [opts](const std::string& name) {
           opts->capture_path = ParseCapturePath(name);
           if (!opts->capture_path)
             throw CLI::ValidationError("--capture-path", fmt::format("`{}` is none of auto, process, rootfs, both", name));
         },
                  "process (the default here; CRIU and the GPU state: a warm restore), rootfs (the container's writable layer and "
                  "--cache directories: a cold start with warm caches; the workload runs on), both, or auto "
                  "(process when the tree is checkpointable, else rootfs). Through the agent, without this flag, the pod's "
                  "gpusnap.io/capture-path or auto; docs/CAPTURE-PATHS.md");
  sub->add_option("--cache", opts->caches,
                  "rootfs: a cache directory of the container (a container path, often a volume), archived whole; "
                  "repeatable");
  sub->add_option("--exclude", opts->exclude,
                  "rootfs: a path pattern the capture leaves out (absolute; `*`, `?`, `[...]` within a component, "
                  "`**` for any depth); repeatable");
  sub->add_option("--image", opts->image,
                  "rootfs: the image the container runs (default: its runtime's annotation "
                  "io.kubernetes.cri.image-name); a restore refuses another");
  sub->add_flag("--tcp-established", opts->tcp_established, "Include established TCP connections (in-process)");
  sub->add_option("--store", opts->store, "Snapshot store (default $GPUSNAP_STORE or /var/lib/gpusnap)");
  sub->add_option("--id", opts->id, "Snapshot id (default: generated from the name)");
  sub->add_option("--gpu-lock-timeout-ms", opts->gpu_lock_timeout_ms,
                  "How long each GPU process may take to drain; for several gpushare processes (tensor "
                  "parallel), how long to keep trying to catch them all between collectives (in-process)")
      ->capture_default_str();
  sub->add_option("--criu", opts->criu_bundle, "CRIU bundle directory (default: found next to gpusnap; in-process)");
  sub->add_option("--timeout", opts->timeout_s, "Seconds CRIU may take (in-process)")->capture_default_str();
  sub->add_flag("-v,--verbose", opts->verbose, "Verbose CRIU log (in-process)");
  AddCriuConfig(*sub, opts->criu_config);
  auto agent = std::make_shared<AgentFlags>();
  AddAgentFlags(*sub, *agent);
  sub->footer(std::string("Prints the snapshot id on its last line (--json: an object). ") + kAgentFooter);
  sub->callback([&ctx, sub, opts, agent] {
    RunOperation(ctx, *sub, *agent, *opts, "checkpoint",
                 {"--tcp-established", "--gpu-lock-timeout-ms", "--criu", "--timeout", "--verbose", "--criu-config"},
                 CheckpointThroughAgent, CheckpointHere, PrintCheckpoint);
  });
}

void AddRestore(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("restore", "Restore a snapshot into a fresh pid namespace, or a placeholder container's");
  auto opts = std::make_shared<RestoreOptions>();
  sub->add_option_function<std::string>(
         "id", [opts](const std::string& text) { opts->source = ParsedOrUsageError(ParseSnapshotRef(text), "id"); },
         "Snapshot id (see `gpusnap ls`), or a registry reference host[:port]/repository[:tag|@digest], "
         "pulled as it restores")
      ->required();
  sub->add_option("--store", opts->store, "Snapshot store (default $GPUSNAP_STORE or /var/lib/gpusnap)");
  sub->add_option("--name", opts->name, "Name of the restored workload (default: the source's)")
      ->check(WorkloadNameError);
  AddRegistryFlags(*sub, opts->registry);
  AddTrustFlags(*sub, opts->registry);
  AddRegistriesConfFlag(*sub, opts->registry);
  AddDecryptionKeyFlag(*sub, opts->registry);
  sub->add_option("--criu", opts->criu_bundle, "CRIU bundle directory (default: found next to gpusnap; in-process)");
  sub->add_option("--timeout", opts->timeout_s, "Seconds CRIU may take (in-process)")->capture_default_str();
  sub->add_flag("-v,--verbose", opts->verbose, "Verbose CRIU log (in-process)");
  AddCriuConfig(*sub, opts->criu_config);
  AddGpuChoice(*sub, opts->gpus, "Restore", "(in-process)");
  sub->add_flag("--huge-pages", opts->huge_pages,
                "Set the host's transparent huge pages to `always` while CRIU restores (faster for large images), "
                "its own mode put back after (in-process)");
  sub->add_flag("--lazy-pages", opts->lazy_pages,
                "Return once the tree runs, its memory arriving after: served on demand and copied in the "
                "background by `criu lazy-pages` (needs userfaultfd); should that server die first, the tree is "
                "killed (in-process)");
  sub->add_option("--into-container", opts->into_container,
                  "Restore into this container's namespaces and cgroups (an id or unique prefix); its init must be "
                  "an idle `gpusnap __placeholder`");
  sub->add_flag("--standby", opts->standby,
                "Restore all but the GPU: every process left stopped, holding no GPU memory, until `gpusnap wake` "
                "(a GPU snapshot, into a fresh namespace; docs/STANDBY.md)");
  auto agent = std::make_shared<AgentFlags>();
  AddAgentFlags(*sub, *agent);
  sub->footer(std::string("Prints the restored workload's host pid. ") + kAgentFooter);
  sub->callback([&ctx, sub, opts, agent] {
    RunOperation(ctx, *sub, *agent, *opts, "restore",
                 {"--criu", "--timeout", "--verbose", "--criu-config", "--gpus", "--registry-config", "--ca-file",
                  "--plain-http", "--jobs", "--registry-timeout", "--registry-min-rate", "--decryption-key",
                  "--policy", "--registries-conf",
                  "--huge-pages", "--lazy-pages"},
                 RestoreThroughAgent, RestoreHere, PrintRestore);
  });
}

void AddWake(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("wake", "Wake a standby (`gpusnap restore --standby`) onto the GPUs chosen now");
  auto opts = std::make_shared<WakeOptions>();
  sub->add_option("name", opts->name, "The standby's workload name (see `gpusnap ps`)")
      ->required()
      ->check(WorkloadNameError);
  AddGpuChoice(*sub, opts->gpus, "Wake", "");
  sub->add_option("--timeout", opts->timeout_s, "Seconds the driver's restore may take (in-process)")
      ->capture_default_str();
  auto agent = std::make_shared<AgentFlags>();
  AddAgentFlags(*sub, *agent);
  sub->footer(std::string("Checks, before touching anything, that the snapshot and its chunks are still there, "
                          "that the GPUs fit and (gpushare) have the device memory free; a refusal leaves the "
                          "standby wakeable. Prints the woken workload's host pid (docs/STANDBY.md). ") +
              kAgentFooter);
  sub->callback([&ctx, sub, opts, agent] {
    // A standby is woken from its own store, which its record names: no --store.
    RunOperation(ctx, *sub, *agent, *opts, "wake", {"--timeout"}, WakeThroughAgent, WakeHere, PrintWake);
  });
}

}  // namespace gpusnap::cli
