// The command line: one file per subcommand, each parsing flags into the
// library's options struct and calling one library function. Nothing here
// decides anything the agent or the tests would need.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "gpusnap/operations.h"
#include "gpusnap/status.h"

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
  // Human progress lines on stderr, unless --quiet or --json.
  ProgressFn Progress(const std::string& operation) const;
};

void AddRun(CLI::App& app, Context& ctx);
void AddPs(CLI::App& app, Context& ctx);
void AddCheckpoint(CLI::App& app, Context& ctx);
void AddRestore(CLI::App& app, Context& ctx);
void AddSnapshots(CLI::App& app, Context& ctx);  // ls, inspect, rm
void AddVersion(CLI::App& app, Context& ctx);
void AddWebhook(CLI::App& app, Context& ctx);
void AddAgent(CLI::App& app, Context& ctx);
void AddCuda(CLI::App& app, Context& ctx);      // cuda state|lock|checkpoint|...|gpus
void AddGpushare(CLI::App& app, Context& ctx);  // gpushare state|suspend|resume

// --agent SOCKET: the command runs as a job of the node agent (agent_client.cc).
Status CheckpointThroughAgent(Context& ctx, const std::string& socket, const CheckpointOptions& options);
Status RestoreThroughAgent(Context& ctx, const std::string& socket, const RestoreOptions& options);

nlohmann::json ToJson(const Workload& w);
std::string HumanBytes(uint64_t bytes);

}  // namespace gpusnap::cli
