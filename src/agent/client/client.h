// A caller of the node agent's API over its unix socket: what `gpusnap`
// subcommands use when they go through the agent (agent/client/route.h decides).
//
// A busy agent is waited for, never taken for a missing one: a connection
// its full backlog refuses (EAGAIN), and its 503 (the agent's answer to a
// connection past its limits, made before anything was read: safe to send
// again), are retried for up to `wait`, then reported.
//
// Errors: kNotFound when the agent cannot be reached (no socket, or nothing
// listens on it) or answers 404; kTimeout when it stayed busy for `wait`;
// kAlreadyExists for 409, kNotSupported for 501, kInvalidArgument for other
// 4xx, kExternal for other 5xx or a job that failed. Messages carry the
// agent's own.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/client/route.h"
#include "gpusnap/progress.h"
#include "gpusnap/status.h"

namespace gpusnap::agent {

// How long a busy agent is waited for.
inline constexpr std::chrono::milliseconds kBusyAgentWait{10'000};

// What a connect() to a unix socket that failed with `err` says of an agent
// there (pure).
enum class ConnectVerdict {
  kAbsent,      // ENOENT, ENOTDIR: no file
  kDenied,      // EACCES, EPERM
  kNobodyHome,  // ECONNREFUSED (no process listens), EPROTOTYPE (no stream socket): no agent exists
  kTryAgain,    // EAGAIN (the backlog is full) and anything else: something may be there
};
ConnectVerdict ClassifyConnectError(int err);

// `method` ("GET", "POST" with `body`, "DELETE") on `path`; the JSON answer of
// a 2xx.
Result<nlohmann::json> CallAgent(const std::string& socket, const std::string& method, const std::string& path,
                                 const nlohmann::json* body = nullptr,
                                 std::chrono::milliseconds wait = kBusyAgentWait);

// Looks for an agent on `socket`: the file, then GET /healthz, retried while
// the agent is busy for up to `wait` (a connection not taken, or not
// answered within 5 s). Never fails: what it found is the answer.
AgentProbe ProbeAgent(const std::string& socket, std::chrono::milliseconds wait = kBusyAgentWait);

// `path` made absolute, with symbolic links resolved as far as it exists, so
// two names of one store compare equal.
std::string CanonicalPath(const std::string& path);

// Successive polls of a job turned into the library's progress events: one
// per phase as it finishes, in the order the operation runs them, with the
// bytes the job gained since the poll before on the last of them.
class JobProgress {
 public:
  std::vector<ProgressEvent> Update(const nlohmann::json& job);

 private:
  std::set<std::string> reported_;
  uint64_t bytes_ = 0;
};

// Polls job `id` (every 100 ms) until it ends, calling on_poll with each
// answer. The job's JSON if it succeeded; kExternal with its error if not.
Result<nlohmann::json> FollowJob(const std::string& socket, const std::string& id,
                                 const std::function<void(const nlohmann::json& job)>& on_poll);

}  // namespace gpusnap::agent
