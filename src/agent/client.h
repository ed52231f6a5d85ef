// A caller of the node agent's API over its unix socket: what `gpusnap
// checkpoint|restore --agent SOCKET` uses.
//
// Errors: kNotFound when the agent cannot be reached or answers 404;
// kAlreadyExists for 409, kNotSupported for 501, kInvalidArgument for other
// 4xx, kExternal for 5xx or a job that failed. Messages carry the agent's own.
#pragma once

#include <functional>
#include <string>

#include <nlohmann/json.hpp>

#include "gpusnap/status.h"

namespace gpusnap::agent {

// GET (body null) or POST (body given) `path`; the JSON answer of a 2xx.
Result<nlohmann::json> CallAgent(const std::string& socket, const std::string& path,
                                 const nlohmann::json* body = nullptr);

// Polls job `id` until it ends; calls on_phase once per phase as it finishes.
// The job's JSON if it succeeded.
Result<nlohmann::json> FollowJob(const std::string& socket, const std::string& id,
                                 const std::function<void(const std::string& phase, double seconds)>& on_phase);

}  // namespace gpusnap::agent
