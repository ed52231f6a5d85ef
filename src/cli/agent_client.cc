// Through the node agent or in-process: the look at the agent's socket, the
// route (agent/client/route.h), and the commands as jobs of the agent (docs/AGENT.md,
// "From the CLI"). What goes through the agent prints what the in-process
// command prints: a workload name is resolved through this machine's run
// directory, the job's phases show as the library's progress events, and the
// results are read back from the agent in the in-process commands' shapes.
#include <cstdio>
#include <cstdlib>

#include "agent/api/request.h"
#include "agent/client/client.h"
#include "cli/cli.h"
#include "cli/progress.h"

namespace gpusnap::cli {

namespace {

using Json = nlohmann::json;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Polls the job to its end, feeding `progress`.
Result<Json> FollowWithProgress(const std::string& socket, const Json& started, ProgressDisplay& progress) {
  agent::JobProgress phases;
  return agent::FollowJob(socket, started.value("job", ""), [&](const Json& job) {
    progress.SetBytesTotal(job.value("bytesTotal", uint64_t{0}));
    for (const auto& e : phases.Update(job)) progress.Event(e);
  });
}

std::map<std::string, double> Timings(const Json& job) {
  std::map<std::string, double> out;
  if (job.contains("timings") && job["timings"].is_object())
    for (const auto& [phase, seconds] : job["timings"].items())
      if (seconds.is_number()) out[phase] = seconds.get<double>();
  return out;
}

}  // namespace

void AddAgentFlags(CLI::App& sub, AgentFlags& flags) {
  auto* agent = sub.add_option("--agent", flags.socket,
                               "Run it through the node agent on this unix socket (default: the agent on "
                               "$GPUSNAP_AGENT_SOCKET or /run/gpusnap-agent/agent.sock, when one answers)");
  sub.add_flag("--no-agent", flags.no_agent, "Run it in this process even when a node agent answers")
      ->excludes(agent);
}

Result<agent::Route> RouteCommand(const Context& ctx, const CLI::App& sub, const AgentFlags& flags,
                                  const std::string& store_flag, const std::vector<std::string>& in_process_only) {
  agent::RouteInputs in;
  in.agent_flag = flags.socket;
  in.no_agent = flags.no_agent;
  in.socket = flags.socket.empty() ? agent::AgentSocketFrom(Env(agent::kAgentSocketEnv)) : flags.socket;
  in.store_flag = agent::CanonicalPath(store_flag);
  in.store_env = agent::CanonicalPath(Env("GPUSNAP_STORE"));
  for (const auto& flag : in_process_only)
    if (sub.count(flag) > 0) in.in_process_only.push_back(flag);
  agent::AgentProbe probe;
  if (!flags.no_agent) probe = agent::ProbeAgent(in.socket);
  GPUSNAP_ASSIGN_OR_RETURN(auto route, agent::ChooseRoute(in, probe));
  ctx.Note(route.note);
  return route;
}

Result<Checkpointed> CheckpointThroughAgent(const std::string& socket, const CheckpointOptions& o,
                                            ProgressDisplay& progress) {
  agent::CheckpointRequest request;
  switch (o.target.kind) {
    case TargetSpec::Kind::kWorkload: {  // this machine's run directory names it
      GPUSNAP_ASSIGN_OR_RETURN(Workload w, FindWorkload(o.target.workload));
      if (!w.running) return Status::Error(Code::kNotFound, "workload `{}` (pid {}) is not running", w.name, w.pid);
      request.pid = w.pid;
      break;
    }
    case TargetSpec::Kind::kPid: request.pid = o.target.pid; break;
    case TargetSpec::Kind::kContainer: request.container = o.target.container; break;
    case TargetSpec::Kind::kPod: request.pod = o.target.pod; break;
  }
  request.leave_running = o.leave_running;
  request.snapshot_id = o.id;
  // Without --capture-path the agent chooses (the pod's annotation, else auto).
  request.capture_path = o.capture_path;
  if (!o.caches.empty()) request.caches = o.caches;
  if (!o.exclude.empty()) request.exclude = o.exclude;
  request.image = o.image;
  Json body = Json::parse(agent::CheckpointRequestBody(request));
  GPUSNAP_ASSIGN_OR_RETURN(Json started, agent::CallAgent(socket, "POST", "/v1/checkpoints", &body));
  GPUSNAP_ASSIGN_OR_RETURN(Json job, FollowWithProgress(socket, started, progress));
  Checkpointed out;
  out.job = job.value("id", "");
  GPUSNAP_ASSIGN_OR_RETURN(out.meta, LoadThroughAgent(socket, job.value("snapshot", "")));
  out.meta.timings_s = Timings(job);
  return out;
}

Result<Restored> RestoreThroughAgent(const std::string& socket, const RestoreOptions& o,
                                     ProgressDisplay& progress) {
  agent::RestoreRequest request;
  request.source = o.source;
  request.name = o.name;
  request.target_container = o.into_container;
  request.standby = o.standby;
  request.gpus = o.gpus;
  Json body = Json::parse(agent::RestoreRequestBody(request));
  GPUSNAP_ASSIGN_OR_RETURN(Json started, agent::CallAgent(socket, "POST", "/v1/restores", &body));
  GPUSNAP_ASSIGN_OR_RETURN(Json job, FollowWithProgress(socket, started, progress));
  Restored out;
  out.job = job.value("id", "");
  Workload& w = out.result.workload;
  w.name = job.value("restoredName", "");
  w.pid = job.value("restoredPid", 0);
  // The agent's record, where it shares this machine's run directory.
  if (auto recorded = FindWorkload(w.name); recorded.ok() && recorded->pid == w.pid) {
    w = *recorded;
  } else {
    w.running = true;
    w.restored_from = job.value("snapshot", "");
    w.standby = o.standby;
  }
  out.result.restore_path =
      ParseCapturePath(job.value("restorePath", "")).value_or(CapturePath::kProcess);
  out.result.fallback_reason = job.value("fallbackReason", "");
  out.result.timings_s = Timings(job);
  return out;
}

Result<Woken> WakeThroughAgent(const std::string& socket, const WakeOptions& o, ProgressDisplay& progress) {
  GPUSNAP_RETURN_IF_ERROR(CheckWorkloadName(o.name));
  Json body = Json::parse(agent::WakeRequestBody({.name = o.name, .gpus = o.gpus}));
  GPUSNAP_ASSIGN_OR_RETURN(Json started, agent::CallAgent(socket, "POST", "/v1/workloads/" + o.name + "/wake", &body));
  GPUSNAP_ASSIGN_OR_RETURN(Json job, FollowWithProgress(socket, started, progress));
  Woken out;
  out.job = job.value("id", "");
  Workload& w = out.result.workload;
  w.name = o.name;
  w.pid = job.value("restoredPid", 0);
  // The agent's record, where it shares this machine's run directory.
  if (auto recorded = FindWorkload(w.name); recorded.ok() && recorded->pid == w.pid) {
    w = *recorded;
  } else {
    w.running = true;
    w.restored_from = job.value("snapshot", "");
  }
  out.result.timings_s = Timings(job);
  return out;
}

Result<nlohmann::json> WarmThroughAgent(const std::string& socket, const std::string& id, ProgressDisplay& progress) {
  GPUSNAP_ASSIGN_OR_RETURN(Json started, agent::CallAgent(socket, "POST", "/v1/snapshots/" + id + "/warm"));
  return FollowWithProgress(socket, started, progress);
}

Result<std::vector<SnapshotMeta>> ListThroughAgent(const std::string& socket) {
  GPUSNAP_ASSIGN_OR_RETURN(Json list, agent::CallAgent(socket, "GET", "/v1/snapshots"));
  std::vector<SnapshotMeta> out;
  for (const auto& s : list) {
    SnapshotMeta m;
    m.id = s.value("id", "");
    m.created = s.value("created", "");
    m.total_bytes = s.value("totalBytes", uint64_t{0});
    if (s.contains("source") && s["source"].is_object()) {
      m.source.kind = s["source"].value("kind", "");
      m.source.name = s["source"].value("name", "");
      m.source.host_pid = s["source"].value("hostPid", 0);
    }
    out.push_back(std::move(m));
  }
  return out;
}

Result<SnapshotMeta> LoadThroughAgent(const std::string& socket, const std::string& id) {
  GPUSNAP_ASSIGN_OR_RETURN(Json meta, agent::CallAgent(socket, "GET", "/v1/snapshots/" + id));
  return SnapshotMetaFromJson(meta.dump());
}

Status RemoveThroughAgent(const std::string& socket, const std::string& id) {
  return agent::CallAgent(socket, "DELETE", "/v1/snapshots/" + id).status();
}

}  // namespace gpusnap::cli
