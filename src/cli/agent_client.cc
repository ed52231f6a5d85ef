// `gpusnap checkpoint|restore --agent SOCKET`: the same commands, run as jobs
// by the node agent (docs/AGENT.md) instead of in this process. The client
// resolves a workload name through this machine's run directory, starts the
// job, prints its phases as they end, and prints what the in-process command
// prints.
#include <cstdio>

#include "agent/client.h"
#include "agent/request.h"
#include "cli/cli.h"

namespace gpusnap::cli {

namespace {

using Json = nlohmann::json;

std::function<void(const std::string&, double)> PhaseLines(const Context& ctx, const std::string& operation) {
  ProgressFn progress = ctx.Progress(operation);
  if (!progress) return nullptr;
  return [progress](const std::string& phase, double seconds) { progress({phase, seconds, 0, true}); };
}

}  // namespace

Status CheckpointThroughAgent(Context& ctx, const std::string& socket, const CheckpointOptions& o) {
  if (o.tcp_established || !o.store.empty() || !o.criu_bundle.empty() || !o.criu_config.empty() || o.verbose)
    return Status::Error(Code::kInvalidArgument,
                         "--tcp-established, --store, --criu, --criu-config and --verbose do not apply with --agent: "
                         "the agent uses its own settings");
  Json body = {{"leaveRunning", o.leave_running}};
  if (!o.id.empty()) body["snapshotId"] = o.id;
  pid_t pid = 0;
  if (auto w = FindWorkload(o.target); w.ok()) {
    if (!w->running) return Status::Error(Code::kNotFound, "workload `{}` (pid {}) is not running", w->name, w->pid);
    body["pid"] = w->pid;
  } else if (std::sscanf(o.target.c_str(), "%d", &pid) == 1 && std::to_string(pid) == o.target) {
    body["pid"] = pid;
  } else if (agent::IsValidContainerId(o.target)) {
    body["container"] = o.target;
  } else {
    return Status::Error(Code::kNotFound, "`{}` is no workload, pid or container id", o.target);
  }
  GPUSNAP_ASSIGN_OR_RETURN(Json started, agent::CallAgent(socket, "/v1/checkpoints", &body));
  GPUSNAP_ASSIGN_OR_RETURN(Json job,
                           agent::FollowJob(socket, started.value("job", ""), PhaseLines(ctx, "checkpoint")));
  if (ctx.json) {
    ctx.PrintJson(job);
    return Status::Ok();
  }
  std::printf("%s\n", job.value("snapshot", "").c_str());
  return Status::Ok();
}

Status RestoreThroughAgent(Context& ctx, const std::string& socket, const RestoreOptions& o) {
  if (!o.store.empty() || !o.criu_bundle.empty() || !o.criu_config.empty() || o.verbose || !o.gpus.empty())
    return Status::Error(Code::kInvalidArgument,
                         "--store, --criu, --criu-config, --verbose and --gpus do not apply with --agent: the agent "
                         "uses its own settings (--gpu-map does)");
  Json body = {{"snapshot", o.id}};
  if (!o.name.empty()) body["name"] = o.name;
  if (!o.into_container.empty()) body["target"] = {{"container", o.into_container}};
  if (!o.gpu_map.empty()) {
    Json map = Json::object();
    size_t start = 0;
    while (start < o.gpu_map.size()) {
      size_t comma = o.gpu_map.find(',', start);
      std::string pair = o.gpu_map.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      auto eq = pair.find('=');
      if (eq == std::string::npos) return Status::Error(Code::kInvalidArgument, "--gpu-map: `{}` is not OLD=NEW", pair);
      map[pair.substr(0, eq)] = pair.substr(eq + 1);
      start = comma == std::string::npos ? o.gpu_map.size() : comma + 1;
    }
    body["gpuMap"] = map;
  }
  GPUSNAP_ASSIGN_OR_RETURN(Json started, agent::CallAgent(socket, "/v1/restores", &body));
  GPUSNAP_ASSIGN_OR_RETURN(Json job, agent::FollowJob(socket, started.value("job", ""), PhaseLines(ctx, "restore")));
  if (ctx.json) {
    ctx.PrintJson(job);
    return Status::Ok();
  }
  std::printf("%d\n", job.value("restoredPid", 0));
  return Status::Ok();
}

}  // namespace gpusnap::cli
