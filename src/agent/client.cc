#include "agent/client.h"

#include <sys/socket.h>

#include <chrono>
#include <set>
#include <thread>

#include <httplib.h>

namespace gpusnap::agent {

using Json = nlohmann::json;

Result<Json> CallAgent(const std::string& socket, const std::string& path, const Json* body) {
  httplib::Client client(socket);
  client.set_address_family(AF_UNIX);
  client.set_read_timeout(30);
  httplib::Result res = body ? client.Post(path.c_str(), body->dump(), "application/json") : client.Get(path.c_str());
  if (!res)
    return Status::Error(Code::kNotFound, "cannot reach the agent at `{}`: {}", socket,
                         httplib::to_string(res.error()));
  Json reply = Json::parse(res->body, nullptr, false);
  if (res->status >= 400) {
    std::string why = reply.is_object() && reply.contains("error") && reply["error"].is_string()
                          ? reply["error"].get<std::string>()
                          : res->body;
    Code code = res->status == 404   ? Code::kNotFound
                : res->status == 409 ? Code::kAlreadyExists
                : res->status == 501 ? Code::kNotSupported
                : res->status < 500  ? Code::kInvalidArgument
                                     : Code::kExternal;
    return Status::Error(code, "the agent refused (HTTP {}): {}", res->status, why);
  }
  if (reply.is_discarded()) return Status::Error(Code::kExternal, "the agent's answer to {} is not JSON", path);
  return reply;
}

Result<Json> FollowJob(const std::string& socket, const std::string& id,
                       const std::function<void(const std::string&, double)>& on_phase) {
  std::set<std::string> reported;
  for (;;) {
    GPUSNAP_ASSIGN_OR_RETURN(Json job, CallAgent(socket, "/v1/jobs/" + id));
    if (on_phase && job.contains("timings") && job["timings"].is_object())
      for (const auto& [phase, seconds] : job["timings"].items())
        if (phase != "total" && seconds.is_number() && reported.insert(phase).second)
          on_phase(phase, seconds.get<double>());
    std::string state = job.value("state", "");
    if (state == "succeeded") return job;
    if (state != "running") return Status::Error(Code::kExternal, "job {}: {}", id, job.value("error", state));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace gpusnap::agent
