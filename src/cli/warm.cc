// `gpusnap warm ID`: the node agent pins a snapshot's gpushare chunks ahead
// of need (docs/AGENT.md, "Warm"). Only the agent lives long enough to hold
// them: there is no in-process way.
#include <cstdio>
#include <cstdlib>

#include "agent/client/client.h"
#include "agent/client/route.h"
#include "cli/cli.h"
#include "cli/progress.h"
#include "util/progress_bar.h"

namespace gpusnap::cli {

void AddWarm(CLI::App& app, Context& ctx) {
  auto* sub = app.add_subcommand("warm", "Have the node agent pin a snapshot's gpushare chunks in host memory");
  auto id = std::make_shared<std::string>();
  auto socket = std::make_shared<std::string>();
  sub->add_option("id", *id, "The snapshot (see `gpusnap ls`)")->required()->check([](const std::string& v) {
    return IsValidSnapshotId(v) ? std::string() : "`" + v + "` is not a snapshot id";
  });
  sub->add_option("--agent", *socket,
                  "The node agent's unix socket (default: $GPUSNAP_AGENT_SOCKET or /run/gpusnap-agent/agent.sock)");
  sub->footer("The agent must have a pinned tier (`gpusnap agent --pinned-cache SIZE`); a snapshot larger than the "
              "tier keeps its first chunks. A later wake or restore through the agent copies them to the GPU from "
              "there (docs/GPUSHARE.md).");
  sub->callback([&ctx, id, socket] {
    const char* env = std::getenv(agent::kAgentSocketEnv);
    std::string path = !socket->empty() ? *socket : agent::AgentSocketFrom(env ? env : "");
    agent::AgentProbe probe = agent::ProbeAgent(path);
    if (probe.state != agent::ProbeState::kAnswered)
      return ctx.Fail(Status::Error(Code::kFailedPrecondition,
                                    "`gpusnap warm` pins chunks in the node agent, and no agent answers on `{}`: {}",
                                    path, probe.detail));
    ProgressDisplay progress(ctx, "warm");
    auto job = WarmThroughAgent(path, *id, progress);
    progress.Finish(job.ok());
    if (!job.ok()) return ctx.Fail(job.status());
    uint64_t bytes = job->value("bytesDone", uint64_t{0}), total = job->value("bytesTotal", uint64_t{0});
    double seconds = job->contains("timings") ? (*job)["timings"].value("pin", 0.0) : 0.0;
    if (ctx.json)
      return ctx.PrintJson({{"snapshot", *id}, {"job", job->value("id", "")}, {"pinned_bytes", bytes},
                            {"chunk_bytes", total}, {"seconds", seconds}});
    if (!ctx.quiet)
      std::fprintf(stderr, "[warm] `%s`: %s of its %s of chunks pinned in %.2f s\n", id->c_str(),
                   HumanBytes(bytes).c_str(), HumanBytes(total).c_str(), seconds);
  });
}

}  // namespace gpusnap::cli
