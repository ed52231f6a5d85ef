// The command line: one file per subcommand, each parsing flags into the
// library's options struct and calling one library function. Nothing here
// decides anything the agent or the tests would need.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/client/route.h"
#include "gpusnap/operations.h"
#include "gpusnap/status.h"
#include "util/progress_bar.h"  // HumanBytes

namespace gpusnap::cli {

// Flags shared by every subcommand, and the exit status the chosen one sets.
struct Context {
  bool json = false;
  bool quiet = false;
  int exit_code = 0;

  // Prints `status` as one line on stderr (or as {"error": ...} with --json)
  // and sets a non-zero exit code.
  void Fail(const Status& status);
  // Prints a JSON value (with --json) or nothing.
  void PrintJson(const nlohmann::json& value) const;
  // "gpusnap: note: <line>" on stderr, unless --quiet or the line is empty.
  void Note(const std::string& line) const;
};

void AddRun(CLI::App& app, Context& ctx);
void AddPs(CLI::App& app, Context& ctx);
void AddKill(CLI::App& app, Context& ctx);
void AddWake(CLI::App& app, Context& ctx);
void AddWarm(CLI::App& app, Context& ctx);
void AddCheckpoint(CLI::App& app, Context& ctx);
void AddRestore(CLI::App& app, Context& ctx);
void AddSnapshots(CLI::App& app, Context& ctx);  // ls, inspect, rm, gc
void AddVersion(CLI::App& app, Context& ctx);
void AddWebhook(CLI::App& app, Context& ctx);
void AddAgent(CLI::App& app, Context& ctx);
void AddCuda(CLI::App& app, Context& ctx);      // cuda state|lock|checkpoint|...|gpus
void AddGpushare(CLI::App& app, Context& ctx);  // gpushare state|suspend|resume
void AddRegistry(CLI::App& app, Context& ctx);  // push, pull
// --registry-config, --ca-file, --plain-http, --jobs, --registry-timeout
void AddRegistryFlags(CLI::App& sub, RegistryAccess& access);
// --policy: what a pull trusts (registry.cc)
void AddTrustFlags(CLI::App& sub, RegistryAccess& access);
// --registries-conf: the mirrors a pull reads from, read where it enters (registry.cc)
void AddRegistriesConfFlag(CLI::App& sub, RegistryAccess& access);
// --decryption-key PRIVATE.pem (repeatable), read where it enters
void AddDecryptionKeyFlag(CLI::App& sub, RegistryAccess& access);
// --encryption-key jwe:PUBLIC.pem (repeatable) and --encryption-secret-file F;
// the returned function reads them once the flags are parsed: none given, null.
std::function<Result<std::shared_ptr<const EncryptionKeys>>()> AddEncryptionFlags(CLI::App& sub);

// Through the node agent or in-process (agent_client.cc; the rules are in
// agent/client/route.h). --agent SOCKET and --no-agent, on the subcommands that may
// go through the agent:
struct AgentFlags {
  std::string socket;
  bool no_agent = false;
};
void AddAgentFlags(CLI::App& sub, AgentFlags& flags);

// Looks at the agent's socket (unless --no-agent) and decides; prints the
// route's note. `store_flag`: the --store given, or empty. `in_process_only`:
// the flags of `sub` that only the in-process path honours; those given count.
Result<agent::Route> RouteCommand(const Context& ctx, const CLI::App& sub, const AgentFlags& flags,
                                  const std::string& store_flag, const std::vector<std::string>& in_process_only);

class ProgressDisplay;  // cli/progress.h

// What a checkpoint or restore gives, either way; `job` is the agent's job id
// (empty in-process).
struct Checkpointed {
  SnapshotMeta meta;
  std::string job;
};
struct Restored {
  RestoreResult result;
  std::string job;
};
struct Woken {
  WakeResult result;
  std::string job;
};
// The commands as jobs of the agent at `socket`, with the in-process results
// as far as the agent tells them (no CRIU log for a restore).
Result<Checkpointed> CheckpointThroughAgent(const std::string& socket, const CheckpointOptions& options,
                                            ProgressDisplay& progress);
Result<Restored> RestoreThroughAgent(const std::string& socket, const RestoreOptions& options,
                                     ProgressDisplay& progress);
Result<Woken> WakeThroughAgent(const std::string& socket, const WakeOptions& options, ProgressDisplay& progress);
// The warm job of snapshot `id` (its chunks pinned in the agent), followed to
// its end: the job's JSON.
Result<nlohmann::json> WarmThroughAgent(const std::string& socket, const std::string& id, ProgressDisplay& progress);
// The agent's store: its snapshots (ids, sources, sizes), one's metadata, removal.
Result<std::vector<SnapshotMeta>> ListThroughAgent(const std::string& socket);
Result<SnapshotMeta> LoadThroughAgent(const std::string& socket, const std::string& id);
Status RemoveThroughAgent(const std::string& socket, const std::string& id);

nlohmann::json ToJson(const Workload& w);

}  // namespace gpusnap::cli
