// A caller of the node agent's API over its unix socket: what `gpusnap`
// subcommands use when they go through the agent (agent/route.h decides).
//
// Errors: kNotFound when the agent cannot be reached or answers 404;
// kAlreadyExists for 409, kNotSupported for 501, kInvalidArgument for other
// 4xx, kExternal for 5xx or a job that failed. Messages carry the agent's own.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/route.h"
#include "gpusnap/operations.h"
#include "gpusnap/status.h"

namespace gpusnap::agent {

// `method` ("GET", "POST" with `body`, "DELETE") on `path`; the JSON answer of
// a 2xx.
Result<nlohmann::json> CallAgent(const std::string& socket, const std::string& method, const std::string& path,
                                 const nlohmann::json* body = nullptr);

// Looks for an agent on `socket`: the file, a connection, then GET /healthz
// (a few seconds at most). Never fails: what it found is the answer.
AgentProbe ProbeAgent(const std::string& socket);

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
