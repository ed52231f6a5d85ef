#include "agent/client/client.h"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <thread>

#include <httplib.h>

#include "util/fd.h"
#include "util/progress_bar.h"

namespace gpusnap::agent {

using Json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;

httplib::Client UnixClient(const std::string& socket) {
  httplib::Client client(socket);
  client.set_address_family(AF_UNIX);
  return client;
}

// A connect() to `socket` that does not wait: 0, or its errno (EAGAIN for a
// full backlog). What cpp-httplib's own failed connect does not tell.
int ConnectOnce(const std::string& socket) {
  sockaddr_un addr{};
  if (socket.size() >= sizeof addr.sun_path) return ENAMETOOLONG;
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket.c_str());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return errno;
  return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 ? 0 : errno;
}

// SIGPIPE held back on this thread for a request: cpp-httplib's client
// writes without MSG_NOSIGNAL, and an agent that refuses a connection (503)
// closes it while the request may still be going out. One raised meanwhile
// is taken off again; the write then fails as EPIPE.
class SigpipeHeldBack {
 public:
  SigpipeHeldBack() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &before_);
  }
  ~SigpipeHeldBack() {
    if (sigismember(&before_, SIGPIPE)) return;  // the caller blocks it itself
    sigset_t pending;
    timespec now{};
    if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) sigtimedwait(&pipe_, nullptr, &now);
    pthread_sigmask(SIG_SETMASK, &before_, nullptr);
  }
  SigpipeHeldBack(const SigpipeHeldBack&) = delete;
  SigpipeHeldBack& operator=(const SigpipeHeldBack&) = delete;

 private:
  sigset_t pipe_{}, before_{};
};

// The agent's error message in an answer, or its body.
std::string ErrorIn(const httplib::Response& res) {
  Json reply = Json::parse(res.body, nullptr, false);
  return reply.is_object() && reply.contains("error") && reply["error"].is_string() ? reply["error"].get<std::string>()
                                                                                     : res.body;
}

// What a request came to once retried while the agent was busy.
struct Exchange {
  std::optional<httplib::Response> response;  // an answer other than 503
  ConnectVerdict verdict = ConnectVerdict::kTryAgain;  // without one: what the socket said
  std::string detail;                          // without one: why, in words
  bool busy = false;                           // without one: the wait ran out
};

// Sends until an answer other than 503 comes, the socket says no agent is
// there, or `wait` is spent. A failed connection, a request the agent
// closed the connection on before it was all written, and a 503 are retried
// (the agent acts only on a request it has read whole); an answer that did
// not come after the request went out is retried only if `retry_unanswered`
// (the request changes nothing).
Exchange SendWhileBusy(const std::string& socket, std::chrono::milliseconds wait, int read_timeout_s,
                       bool retry_unanswered, const std::function<httplib::Result(httplib::Client&)>& send) {
  const auto end = Clock::now() + wait;
  std::chrono::milliseconds pause{10};
  std::string last;
  for (;;) {
    httplib::Client client = UnixClient(socket);
    client.set_connection_timeout(2);
    client.set_read_timeout(read_timeout_s);
    httplib::Result res = [&] {
      SigpipeHeldBack held;
      return send(client);
    }();
    if (res && res->status != 503) return {res.value(), ConnectVerdict::kTryAgain, "", false};
    if (res) {
      last = "it answered HTTP 503: " + ErrorIn(*res);
    } else if (res.error() == httplib::Error::Connection) {
      int err = ConnectOnce(socket);
      ConnectVerdict verdict = err == 0 ? ConnectVerdict::kTryAgain : ClassifyConnectError(err);
      if (verdict != ConnectVerdict::kTryAgain) return {std::nullopt, verdict, Status::ErrnoText(err), false};
      last = err == EAGAIN ? "its listen backlog is full" : err == 0 ? "a connection failed" : Status::ErrnoText(err);
    } else if (res.error() == httplib::Error::Write) {
      last = "it closed the connection before the request was written";
    } else if (retry_unanswered) {
      last = httplib::to_string(res.error());
    } else {
      return {std::nullopt, ConnectVerdict::kTryAgain, httplib::to_string(res.error()), false};
    }
    auto now = Clock::now();
    if (now >= end)
      return {std::nullopt, ConnectVerdict::kTryAgain,
              fmt::format("no answer within {:g} s; last: {}", static_cast<double>(wait.count()) / 1000, last), true};
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, end - now));
    pause = std::min(pause * 2, std::chrono::milliseconds(250));
  }
}

}  // namespace

ConnectVerdict ClassifyConnectError(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR: return ConnectVerdict::kAbsent;
    case EACCES:
    case EPERM: return ConnectVerdict::kDenied;
    case ECONNREFUSED:
    case EPROTOTYPE: return ConnectVerdict::kNobodyHome;
    default: return ConnectVerdict::kTryAgain;
  }
}

Result<Json> CallAgent(const std::string& socket, const std::string& method, const std::string& path,
                       const Json* body, std::chrono::milliseconds wait) {
  std::string payload = body ? body->dump() : "{}";
  Exchange ex = SendWhileBusy(socket, wait, 30, method == "GET", [&](httplib::Client& client) {
    return method == "POST"     ? client.Post(path.c_str(), payload, "application/json")
           : method == "DELETE" ? client.Delete(path.c_str())
                                : client.Get(path.c_str());
  });
  if (!ex.response) {
    if (ex.busy) return Status::Error(Code::kTimeout, "the agent on `{}` is busy ({})", socket, ex.detail);
    return Status::Error(Code::kNotFound, "cannot reach the agent at `{}`: {}", socket, ex.detail);
  }
  const httplib::Response* res = &*ex.response;
  Json reply = Json::parse(res->body, nullptr, false);
  if (res->status >= 400) {
    std::string why = ErrorIn(*res);
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

AgentProbe ProbeAgent(const std::string& socket, std::chrono::milliseconds wait) {
  auto denied = [](int err) { return err == EACCES || err == EPERM; };
  struct stat st{};
  if (::stat(socket.c_str(), &st) != 0) {
    int err = errno;
    if (denied(err)) return {ProbeState::kDenied, Status::ErrnoText(err), ""};
    if (err == ENOENT || err == ENOTDIR) return {ProbeState::kAbsent, Status::ErrnoText(err), ""};
    return {ProbeState::kStale, Status::ErrnoText(err), ""};
  }
  if (!S_ISSOCK(st.st_mode)) return {ProbeState::kStale, "not a socket", ""};
  if (socket.size() >= sizeof(sockaddr_un{}.sun_path))
    return {ProbeState::kStale, "path too long for a unix socket", ""};
  Exchange ex = SendWhileBusy(socket, wait, 5, true, [](httplib::Client& client) { return client.Get("/healthz"); });
  if (!ex.response) {
    switch (ex.verdict) {
      case ConnectVerdict::kAbsent: return {ProbeState::kAbsent, ex.detail, ""};
      case ConnectVerdict::kDenied: return {ProbeState::kDenied, ex.detail, ""};
      case ConnectVerdict::kNobodyHome:
        return {ProbeState::kStale, ex.detail == Status::ErrnoText(ECONNREFUSED) ? "nothing listens on it" : ex.detail,
                ""};
      case ConnectVerdict::kTryAgain: return {ProbeState::kBusy, ex.detail, ""};
    }
  }
  const httplib::Response* res = &*ex.response;
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
    auto polled = CallAgent(socket, "GET", "/v1/jobs/" + id);
    // The job may go on, or be recovered, in an agent that answers again.
    if (!polled.ok())
      return polled.status().Wrap(fmt::format("following job {} (the agent's `GET /v1/jobs/{}`, or its journal "
                                              "<state dir>/jobs/{}.json, tells what became of it)",
                                              id, id, id));
    Json job = std::move(polled).value();
    if (on_poll) on_poll(job);
    std::string state = job.value("state", "");
    if (state == "succeeded") return job;
    if (state != "running") return Status::Error(Code::kExternal, "job {}: {}", id, job.value("error", state));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace gpusnap::agent
