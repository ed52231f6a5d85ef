#include "agent/client.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <thread>

#include <httplib.h>

#include "util/fd.h"
#include "util/progress_bar.h"

namespace gpusnap::agent {

using Json = nlohmann::json;

namespace {

httplib::Client UnixClient(const std::string& socket) {
  httplib::Client client(socket);
  client.set_address_family(AF_UNIX);
  return client;
}

}  // namespace

Result<Json> CallAgent(const std::string& socket, const std::string& method, const std::string& path,
                       const Json* body) {
  httplib::Client client = UnixClient(socket);
  client.set_read_timeout(30);
  httplib::Result res = method == "POST"     ? client.Post(path.c_str(), body ? body->dump() : "{}", "application/json")
                        : method == "DELETE" ? client.Delete(path.c_str())
                                             : client.Get(path.c_str());
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

AgentProbe ProbeAgent(const std::string& socket) {
  auto denied = [](int err) { return err == EACCES || err == EPERM; };
  struct stat st{};
  if (::stat(socket.c_str(), &st) != 0) {
    int err = errno;
    if (denied(err)) return {ProbeState::kDenied, Status::ErrnoText(err), ""};
    if (err == ENOENT || err == ENOTDIR) return {ProbeState::kAbsent, Status::ErrnoText(err), ""};
    return {ProbeState::kStale, Status::ErrnoText(err), ""};
  }
  if (!S_ISSOCK(st.st_mode)) return {ProbeState::kStale, "not a socket", ""};
  sockaddr_un addr{};
  if (socket.size() >= sizeof addr.sun_path) return {ProbeState::kStale, "path too long for a unix socket", ""};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket.c_str());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return {ProbeState::kNoAnswer, Status::ErrnoText(errno), ""};
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    if (denied(err)) return {ProbeState::kDenied, Status::ErrnoText(err), ""};
    return {ProbeState::kStale, err == ECONNREFUSED ? "nothing listens on it" : Status::ErrnoText(err), ""};
  }
  fd.Reset();
  httplib::Client client = UnixClient(socket);
  client.set_connection_timeout(2);
  client.set_read_timeout(5);
  httplib::Result res = client.Get("/healthz");
  if (!res) return {ProbeState::kNoAnswer, "GET /healthz: " + httplib::to_string(res.error()), ""};
  Json health = Json::parse(res->body, nullptr, false);
  if (res->status != 200 || !health.is_object() || health.value("ok", false) != true)
    return {ProbeState::kNoAnswer, fmt::format("GET /healthz answered HTTP {}", res->status), ""};
  std::string store = health.contains("store") && health["store"].is_string() ? health["store"].get<std::string>()
                                                                                : "";
  return {ProbeState::kAnswered, "", store.empty() ? "" : CanonicalPath(store)};
}

std::string CanonicalPath(const std::string& path) {
  if (path.empty()) return path;
  std::error_code ec;
  auto canonical = std::filesystem::weakly_canonical(std::filesystem::absolute(path, ec), ec);
  if (ec) return std::filesystem::path(path).lexically_normal().string();
  std::string out = canonical.string();
  // "/a/b/" and "/a/b" name one directory.
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

std::vector<ProgressEvent> JobProgress::Update(const Json& job) {
  std::string kind = job.contains("kind") && job["kind"].is_string() ? job["kind"].get<std::string>() : "";
  const auto& order = PhaseOrder(kind);
  auto rank = [&order](const std::string& phase) {
    auto it = std::find(order.begin(), order.end(), phase);
    return it == order.end() ? std::numeric_limits<size_t>::max() : static_cast<size_t>(it - order.begin());
  };
  std::vector<std::pair<std::string, double>> finished;
  if (job.contains("timings") && job["timings"].is_object())
    for (const auto& [phase, seconds] : job["timings"].items())
      if (phase != "total" && seconds.is_number() && !reported_.count(phase))
        finished.emplace_back(phase, seconds.get<double>());
  std::sort(finished.begin(), finished.end(), [&rank](const auto& a, const auto& b) {
    return std::pair(rank(a.first), a.first) < std::pair(rank(b.first), b.first);
  });
  uint64_t bytes = job.contains("bytesDone") && job["bytesDone"].is_number_unsigned()
                       ? job["bytesDone"].get<uint64_t>()
                       : bytes_;
  std::vector<ProgressEvent> events;
  for (const auto& [phase, seconds] : finished) {
    reported_.insert(phase);
    events.push_back({phase, seconds, 0, true});
  }
  if (!events.empty() && bytes > bytes_) {
    events.back().bytes = bytes - bytes_;
    bytes_ = bytes;
  }
  return events;
}

Result<Json> FollowJob(const std::string& socket, const std::string& id,
                       const std::function<void(const Json& job)>& on_poll) {
  for (;;) {
    GPUSNAP_ASSIGN_OR_RETURN(Json job, CallAgent(socket, "GET", "/v1/jobs/" + id));
    if (on_poll) on_poll(job);
    std::string state = job.value("state", "");
    if (state == "succeeded") return job;
    if (state != "running") return Status::Error(Code::kExternal, "job {}: {}", id, job.value("error", state));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace gpusnap::agent
