// Usage errors (a flag, argument or command the command line does not take)
// in gpusnap's own words: one line on stderr, `gpusnap: error: `, naming the
// flag or command at fault (and, for a flag of other commands, which ones),
// exit status 2. CLI11 finds the error; this says it about gpusnap.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <utility>

#include "gpusnap/status.h"

namespace gpusnap::cli {

inline constexpr int kUsageExitCode = 2;

// The line for `error`, thrown by `top.parse` (so `top` still holds what was
// parsed: the command chosen and the arguments left over), without the prefix.
std::string UsageErrorLine(const CLI::App& top, const CLI::ParseError& error);

// Prints `gpusnap: error: <UsageErrorLine>` on stderr; returns kUsageExitCode.
int ReportUsageError(const CLI::App& top, const CLI::ParseError& error);

// A flag's (or argument's) value parsed where it enters, for an option
// callback: the typed value, or a usage error naming `flag` and why.
template <typename T>
T ParsedOrUsageError(Result<T> parsed, const std::string& flag) {
  if (!parsed.ok()) throw CLI::ValidationError(flag, parsed.status().message());
  return std::move(parsed).value();
}

// A CLI11 check of a workload name: the rule's one message (CheckWorkloadName).
std::string WorkloadNameError(const std::string& name);

}  // namespace gpusnap::cli
