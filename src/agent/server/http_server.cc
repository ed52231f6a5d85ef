#include "agent/server/http_server.h"

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "agent/server/bounded_server.h"
#include "agent/service/pod_annotations.h"
#include "agent/service/tenancy_source.h"
#include "gpusnap/snapshot.h"
#include "gpusnap/workload.h"
#include "k8s/kubeconfig.h"
#include "k8s/webhook_server.h"
#include "util/files.h"
#include "util/heap.h"

namespace gpusnap::agent {

namespace {

using Json = nlohmann::json;

void Reply(httplib::Response& res, int status, const Json& body) {
  res.status = status;
  // A message may quote a value that is not UTF-8 (a path's %FF): it is
  // answered with U+FFFD in its place, never with a 500.
  res.set_content(body.dump(2, ' ', false, Json::error_handler_t::replace) + "\n", "application/json");
}

void ReplyError(httplib::Response& res, const ApiError& e, const std::string& job_id = "") {
  Json body = {{"error", e.message}};
  if (!job_id.empty()) body["job"] = job_id;
  Reply(res, e.http_status, body);
}

// A POST's body, read through `reader` and held up to `max_bytes` (sized or
// chunked alike); nullopt once the refusal is in `res`.
std::optional<std::string> ReadBody(const httplib::ContentReader& reader, httplib::Response& res, size_t max_bytes) {
  BodyBuffer body(max_bytes);
  if (reader([&body](const char* data, size_t size) { return body.Append(data, size); })) return body.text();
  // A Content-Length over the limit: cpp-httplib said 413 without reading.
  if (body.too_large() || res.status == 413) {
    ReplyError(res, BodyTooLarge(max_bytes));
  } else if (auto cut = BoundedServer::CutShort()) {
    ReplyError(res, *cut);
  } else {
    ReplyError(res, {400, "the request body could not be read (cut short, or a malformed chunk or encoding)"});
  }
  return std::nullopt;
}

Json SnapshotSummary(const SnapshotMeta& m) {
  return {{"id", m.id},
          {"created", m.created},
          {"source", {{"kind", m.source.kind}, {"name", m.source.name}, {"hostPid", m.source.host_pid}}},
          {"totalBytes", m.total_bytes},
          {"gpus", m.gpu ? m.gpu->gpus.size() : 0}};
}

Json JobJson(const Job& job) {
  Json j = Json::parse(JobToJson(job));
  j.erase("source");   // the agent's own bookkeeping
  j.erase("lockKey");
  return j;
}

// 202 with the job's id and where to follow it, or the refusal.
void ReplyStarted(httplib::Response& res, const std::variant<Accepted, Refused>& started) {
  if (auto* r = std::get_if<Refused>(&started)) return ReplyError(res, r->error, r->job_id);
  const std::string& id = std::get<Accepted>(started).job_id;
  res.set_header("Location", "/v1/jobs/" + id);
  Reply(res, 202, {{"job", id}});
}

// `unix_socket`: the root-only socket, whose /healthz also names the store
// (the CLI compares it with the one it was given); TCP's answers without a
// token, so it says no more than that the agent runs.
void AddRoutes(httplib::Server& s, Service& service, bool unix_socket, size_t max_body_bytes) {
  s.Get("/healthz", [&service, unix_socket](const httplib::Request&, httplib::Response& res) {
    Json health = {{"ok", true}, {"runningJobs", service.RunningJobs()}};
    if (unix_socket) health["store"] = service.store_root();
    Reply(res, 200, health);
  });
  s.Get("/metrics", [&service](const httplib::Request&, httplib::Response& res) {
    res.set_content(service.metrics().Format(static_cast<int64_t>(service.StandbyWorkloads()), service.PinnedTierNow()),
                    "text/plain; version=0.0.4");
  });
  // Bodies are read by the handlers, so that no body is ever held past the
  // limit (cpp-httplib holds a chunked one whole, and refuses a form-encoded
  // one past 8 KiB).
  using Reader = httplib::ContentReader;
  s.Post("/v1/checkpoints", [&service, max_body_bytes](const httplib::Request&, httplib::Response& res,
                                                       const Reader& reader) {
    auto body = ReadBody(reader, res, max_body_bytes);
    if (!body) return;
    auto parsed = ParseCheckpointRequest(*body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return ReplyError(res, *e);
    ReplyStarted(res, service.StartCheckpoint(std::get<CheckpointRequest>(parsed)));
  });
  s.Post("/v1/restores", [&service, max_body_bytes](const httplib::Request&, httplib::Response& res,
                                                    const Reader& reader) {
    auto body = ReadBody(reader, res, max_body_bytes);
    if (!body) return;
    auto parsed = ParseRestoreRequest(*body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return ReplyError(res, *e);
    ReplyStarted(res, service.StartRestore(std::get<RestoreRequest>(parsed)));
  });
  s.Post(R"(/v1/workloads/([^/]+)/wake)", [&service, max_body_bytes](const httplib::Request& req,
                                                                      httplib::Response& res, const Reader& reader) {
    auto body = ReadBody(reader, res, max_body_bytes);
    if (!body) return;
    auto parsed = ParseWakeRequest(req.matches[1].str(), *body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return ReplyError(res, *e);
    ReplyStarted(res, service.StartWake(std::get<WakeRequest>(parsed)));
  });
  // In place (docs/GPUSHARE.md): suspend, resume, and a swap of two.
  for (const char* verb : {"suspend", "resume"}) {
    bool suspend = std::string_view(verb) == "suspend";
    s.Post(fmt::format(R"(/v1/workloads/([^/]+)/{})", verb),
           [&service, max_body_bytes, suspend](const httplib::Request& req, httplib::Response& res,
                                               const Reader& reader) {
             auto body = ReadBody(reader, res, max_body_bytes);
             if (!body) return;
             auto parsed = ParseInPlaceRequest(req.matches[1].str(), *body);
             if (auto* e = std::get_if<ApiError>(&parsed)) return ReplyError(res, *e);
             const auto& request = std::get<InPlaceRequest>(parsed);
             auto started = suspend ? service.StartSuspend(request) : service.StartResume(request);
             ReplyStarted(res, started);
           });
  }
  s.Post("/v1/workloads/swap", [&service, max_body_bytes](const httplib::Request&, httplib::Response& res,
                                                          const Reader& reader) {
    auto body = ReadBody(reader, res, max_body_bytes);
    if (!body) return;
    auto parsed = ParseSwapRequest(*body);
    if (auto* e = std::get_if<ApiError>(&parsed)) return ReplyError(res, *e);
    ReplyStarted(res, service.StartSwap(std::get<SwapRequest>(parsed)));
  });
  s.Get("/v1/workloads", [](const httplib::Request&, httplib::Response& res) {
    auto all = ListWorkloads();
    if (!all.ok()) return ReplyError(res, FromStatus(all.status()));
    Json out = Json::array();
    for (const Workload& w : *all) {
      Json j = {{"name", w.name}, {"pid", w.pid}, {"state", WorkloadState(w)}, {"started", w.started}};
      if (!w.restored_from.empty()) j["restoredFrom"] = w.restored_from;
      out.push_back(std::move(j));
    }
    Reply(res, 200, out);
  });
  // No body is read (a POST handler takes the reader form: the catch-all below has it).
  s.Post(R"(/v1/snapshots/([^/]+)/warm)", [&service](const httplib::Request& req, httplib::Response& res,
                                                     const Reader&) {
    std::string id = req.matches[1];
    if (!IsValidSnapshotId(id)) return ReplyError(res, {400, fmt::format("`{}` is not a snapshot id", id)});
    auto started = service.StartWarm(id);
    if (auto* r = std::get_if<Refused>(&started)) return ReplyError(res, r->error, r->job_id);
    const std::string& job = std::get<Accepted>(started).job_id;
    res.set_header("Location", "/v1/jobs/" + job);
    Reply(res, 202, {{"job", job}});
  });
  s.Get("/v1/jobs", [&service](const httplib::Request&, httplib::Response& res) {
    Json all = Json::array();
    for (const auto& job : service.ListJobs()) all.push_back(JobJson(job));
    Reply(res, 200, all);
  });
  s.Get(R"(/v1/jobs/(.+))", [&service](const httplib::Request& req, httplib::Response& res) {
    std::string id = req.matches[1];
    if (!IsValidJobId(id)) return ReplyError(res, {400, fmt::format("`{}` is not a job id", id)});
    auto job = service.GetJob(id);
    if (!job.ok()) return ReplyError(res, FromStatus(job.status()));
    Reply(res, 200, JobJson(*job));
  });
  s.Get("/v1/snapshots", [&service](const httplib::Request&, httplib::Response& res) {
    auto list = service.ListSnapshots();
    if (!list.ok()) return ReplyError(res, FromStatus(list.status()));
    Json all = Json::array();
    for (const auto& m : *list) all.push_back(SnapshotSummary(m));
    Reply(res, 200, all);
  });
  s.Get(R"(/v1/snapshots/(.+))", [&service](const httplib::Request& req, httplib::Response& res) {
    std::string id = req.matches[1];
    if (!IsValidSnapshotId(id)) return ReplyError(res, {400, fmt::format("`{}` is not a snapshot id", id)});
    auto meta = service.GetSnapshot(id);
    if (!meta.ok()) return ReplyError(res, FromStatus(meta.status()));
    res.status = 200;
    res.set_content(SnapshotMetaToJson(*meta), "application/json");
  });
  s.Delete(R"(/v1/snapshots/(.+))", [&service](const httplib::Request& req, httplib::Response& res) {
    std::string id = req.matches[1];
    if (!IsValidSnapshotId(id)) return ReplyError(res, {400, fmt::format("`{}` is not a snapshot id", id)});
    Status st = service.DeleteSnapshot(id);
    if (!st.ok()) return ReplyError(res, FromStatus(st));
    Reply(res, 200, {{"deleted", id}});
  });
  s.Get("/v1/processes", [&service](const httplib::Request& req, httplib::Response& res) {
    std::string all_param = req.get_param_value("all");
    if (!all_param.empty() && all_param != "true" && all_param != "false")
      return ReplyError(res, {400, fmt::format("query `all` must be true or false, got `{}`", all_param)});
    Json out = Json::array();
    for (const auto& v : service.ListProcesses(all_param == "true")) {
      const container::NodeProcess& p = v.process;
      Json j = {{"pid", p.pid}, {"ppid", p.ppid}, {"command", p.command}, {"gpu", v.gpu},
                {"containerInit", p.namespace_init}};
      j["container"] = p.container_id.empty() ? Json(nullptr) : Json(p.container_id);
      j["podUid"] = p.pod_uid.empty() ? Json(nullptr) : Json(p.pod_uid);
      j["pod"] = nullptr;
      if (v.pod)
        j["pod"] = {{"namespace", v.pod->namespace_name}, {"name", v.pod->pod}, {"container", v.pod->container}};
      out.push_back(std::move(j));
    }
    Reply(res, 200, out);
  });
  // Any other POST: refused without its body being read (the connection
  // closes after the refusal).
  s.Post(".*", [](const httplib::Request& req, httplib::Response& res, const Reader&) {
    ReplyError(res, {404, fmt::format("no endpoint {} {}", req.method, req.path)});
  });
  // Every refusal closes the connection: its body may be unread. Those
  // httplib makes itself (404 for an unknown path, 413, 400) get a JSON body,
  // and a request the bounds cut short says why (408, 431).
  s.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
    BoundedServer::CloseAfterAnswer();
    res.set_header("Connection", "close");
    if (auto cut = BoundedServer::CutShort()) {
      Reply(res, cut->http_status, {{"error", cut->message}});
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string what = res.status == 404   ? fmt::format("no endpoint {} {}", req.method, req.path)
                       : res.status == 413 ? "request body too large"
                                           : fmt::format("HTTP {}", res.status);
    Reply(res, res.status, {{"error", what}});
    return httplib::Server::HandlerResponse::Handled;
  }));
}

ConnectionBounds BoundsFor(const AgentOptions& o, const std::string& listener, Metrics& metrics) {
  ConnectionBounds b;
  b.listener = listener;
  b.threads = o.threads;
  b.request_timeout_s = o.io_timeout_s;
  b.io_timeout_s = o.io_timeout_s;
  b.max_connections = o.max_connections;
  // The unix socket's callers are root on this node, all one peer to it.
  b.max_connections_per_peer = listener == "tcp" ? o.max_connections_per_peer : 0;
  if (listener == "unix") b.allowed_uids = o.allowed_uids;
  b.log = o.service.log;
  b.on_refused = [&metrics, listener](int status) { metrics.Refused(listener, status); };
  return b;
}

// What every request passes before its body is read (RefusedBeforeTheBody).
httplib::Server::HandlerResponse CheckBeforeTheBody(const httplib::Request& req, httplib::Response& res) {
  bool has_body = req.has_header("Transfer-Encoding") ||
                  (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
  auto refused = RefusedBeforeTheBody(req.method, req.path, req.get_header_value("Content-Type"), has_body);
  if (!refused) return httplib::Server::HandlerResponse::Unhandled;
  ReplyError(res, *refused);
  return httplib::Server::HandlerResponse::Handled;
}

void Configure(httplib::Server& s, const AgentOptions& o, const std::string& listener, Metrics& metrics) {
  // One line per refused request: who asked for what, and why not.
  auto log = o.service.log;
  s.set_logger([log, listener, &metrics](const httplib::Request& req, const httplib::Response& res) {
    if (res.status < 400) return;
    metrics.Refused(listener, res.status);
    std::string why;
    if (auto body = Json::parse(res.body, nullptr, false); body.is_object() && body.contains("error"))
      why = body["error"].is_string() ? Printable(body["error"].get<std::string>()) : "";
    log(fmt::format("{} {} {} from {}: HTTP {}{}", listener, req.method, Printable(req.path),
                    BoundedServer::WhoAsked(), res.status, why.empty() ? "" : ": " + why));
  });
  s.set_payload_max_length(o.max_body_bytes);
  s.set_read_timeout(o.io_timeout_s);
  s.set_write_timeout(o.io_timeout_s);
  s.set_keep_alive_timeout(std::min(o.io_timeout_s, 5));
}

Result<std::string> ReadToken(const std::string& path) {
  GPUSNAP_ASSIGN_OR_RETURN(auto token, ReadOwnerOnlyFile(path, "token file"));
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ')) token.pop_back();
  if (token.size() < 16)
    return Status::Error(Code::kInvalidArgument, "token file `{}` holds {} characters; at least 16 are needed", path,
                         token.size());
  return token;
}

// A socket file left by a dead agent is removed; one a live agent answers on is not.
Status ClaimSocketPath(const std::string& path) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) return Status::Ok();
  if (!S_ISSOCK(st.st_mode)) return Status::Error(Code::kAlreadyExists, "`{}` exists and is not a socket", path);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.valid() && ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0)
    return Status::Error(Code::kAlreadyExists, "an agent already answers on `{}`", path);
  if (::unlink(path.c_str()) != 0) return Status::Errno(errno, "removing the stale socket `{}`", path);
  return Status::Ok();
}

}  // namespace

struct AgentServer::Impl {
  AgentOptions options;
  std::unique_ptr<Service> service;
  std::unique_ptr<BoundedServer> unix_server;
  std::unique_ptr<BoundedServer> tcp_server;
  std::string token;
  int tcp_port = 0;
  std::unique_ptr<PlaceholderWatcher> watcher;  // stopped before the service goes
};

AgentServer::AgentServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
AgentServer::~AgentServer() {
  if (impl_ && !impl_->options.socket_path.empty()) ::unlink(impl_->options.socket_path.c_str());
}
int AgentServer::tcp_port() const { return impl_->tcp_port; }

void AgentServer::Stop() {
  impl_->unix_server->stop();
  if (impl_->tcp_server) impl_->tcp_server->stop();
}

Result<std::unique_ptr<AgentServer>> AgentServer::Start(AgentOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  AgentOptions& o = impl->options;
  if (o.socket_path.empty()) return Status::Error(Code::kInvalidArgument, "the agent needs a socket path");
  if (o.socket_path.size() >= sizeof(sockaddr_un{}.sun_path))
    return Status::Error(Code::kInvalidArgument, "socket path `{}` is too long for a unix socket", o.socket_path);
  std::pair<std::string, int> host_port;
  if (!o.listen.empty()) {
    if (o.token_file.empty())
      return Status::Error(Code::kInvalidArgument, "--listen needs --token-file: TCP callers must present a token");
    GPUSNAP_ASSIGN_OR_RETURN(host_port, k8s::ParseListen(o.listen));
    GPUSNAP_ASSIGN_OR_RETURN(impl->token, ReadToken(o.token_file));
  }
  if (!o.service.log) o.service.log = [](const std::string& l) { std::fprintf(stderr, "[agent] %s\n", l.c_str()); };
  if (!o.kube.enabled && !o.kube.kubeconfig.empty())
    return Status::Error(Code::kInvalidArgument, "--kubeconfig is for --kube");
  // The API server, for what the service asks of it: a pod's annotations
  // (and the capture path recorded back on it), the registry's Secret.
  std::shared_ptr<const k8s::KubeClient> kube;
  if (o.kube.enabled) {
    auto config = o.kube.kubeconfig.empty() ? k8s::LoadInClusterConfig() : k8s::LoadKubeconfig(o.kube.kubeconfig);
    if (!config.ok()) return config.status().Wrap("kube");
    auto client = k8s::KubeClient::Create(std::move(*config));
    if (!client.ok()) return client.status().Wrap("kube");
    kube = std::move(*client);
    o.service.pod = MakePodLookup(kube);
    o.service.patch_pod = MakePodPatcher(kube);
    // Tenancy: the administrator's rules, and each namespace's own Secret.
    o.service.tenancy = MakeTenancySource(o.tenancy_file, o.service.log);
    if (auto rules = o.service.tenancy(); !rules.ok()) return rules.status();
    o.service.namespace_credentials = MakeNamespaceCredentials(kube, RunDir() + "/agent");
    o.service.warn_pod = MakePodWarner(kube, o.kube.node_name, o.service.log);
  } else if (!o.tenancy_file.empty()) {
    return Status::Error(Code::kInvalidArgument, "--tenancy is for --kube: tenants are Kubernetes namespaces");
  }
  GPUSNAP_ASSIGN_OR_RETURN(o.service.registry,
                           MakeRegistryAccess(o.registry, kube, RunDir() + "/agent", o.service.log));
  GPUSNAP_ASSIGN_OR_RETURN(impl->service, Service::Open(o.service));
  for (const auto& note : impl->service->recovery_notes()) o.service.log("recovery: " + note);

  // The unix socket: its directory and itself for root only, unless the
  // administrator allows other uids, which must then reach it; either way
  // each connection's peer is checked (BoundsFor).
  const bool others_allowed = !o.allowed_uids.empty();
  std::string dir = std::filesystem::path(o.socket_path).parent_path().string();
  // A directory the agent makes is its own to set; one that exists is the caller's to choose.
  if (!dir.empty() && ::access(dir.c_str(), F_OK) != 0) {
    GPUSNAP_RETURN_IF_ERROR(MakeDirs(dir, others_allowed ? 0711 : 0700));
  }
  GPUSNAP_RETURN_IF_ERROR(ClaimSocketPath(o.socket_path));
  Metrics& metrics = impl->service->metrics();
  impl->unix_server = std::make_unique<BoundedServer>(BoundsFor(o, "unix", metrics));
  BoundedServer& u = *impl->unix_server;
  Configure(u, o, "unix", metrics);
  u.set_pre_routing_handler(CheckBeforeTheBody);
  AddRoutes(u, *impl->service, true, o.max_body_bytes);
  u.set_address_family(AF_UNIX);
  mode_t old_mask = ::umask(0177);
  bool bound = u.bind_to_port(o.socket_path, 80);
  ::umask(old_mask);
  if (!bound) return Status::Error(Code::kIoError, "cannot bind the unix socket `{}`", o.socket_path);
  if (!u.RaiseBacklog()) return Status::Errno(errno, "listen on `{}`", o.socket_path);
  if (::chmod(o.socket_path.c_str(), others_allowed ? 0666 : 0600) != 0)
    return Status::Errno(errno, "chmod `{}`", o.socket_path);

  if (!o.listen.empty()) {
    impl->tcp_server = std::make_unique<BoundedServer>(BoundsFor(o, "tcp", metrics));
    BoundedServer& t = *impl->tcp_server;
    Configure(t, o, "tcp", metrics);
    const std::string* token = &impl->token;
    t.set_pre_routing_handler([token](const httplib::Request& req, httplib::Response& res) {
      if ((req.method == "GET" && req.path == "/healthz") || BearerMatches(req.get_header_value("Authorization"), *token))
        return CheckBeforeTheBody(req, res);
      res.set_header("WWW-Authenticate", "Bearer");
      Reply(res, 401, {{"error", "missing or wrong bearer token"}});
      return httplib::Server::HandlerResponse::Handled;
    });
    AddRoutes(t, *impl->service, false, o.max_body_bytes);
    auto& [host, port] = host_port;
    if (port == 0) {
      impl->tcp_port = t.bind_to_any_port(host);
      if (impl->tcp_port < 0) return Status::Error(Code::kIoError, "cannot bind `{}`", o.listen);
    } else {
      if (!t.bind_to_port(host, port))
        return Status::Error(Code::kIoError, "cannot bind `{}` (in use, or not an address of this host)", o.listen);
      impl->tcp_port = port;
    }
    if (!t.RaiseBacklog()) return Status::Errno(errno, "listen on `{}`", o.listen);
  }
  if (o.kube.enabled) {
    GPUSNAP_ASSIGN_OR_RETURN(impl->watcher, PlaceholderWatcher::Start(o.kube, *impl->service, o.service.log));
  }
  return std::unique_ptr<AgentServer>(new AgentServer(std::move(impl)));
}

Status AgentServer::Serve() {
  std::thread tcp;
  std::atomic<bool> tcp_ok{true};
  if (impl_->tcp_server) tcp = std::thread([this, &tcp_ok] { tcp_ok = impl_->tcp_server->listen_after_bind(); });
  bool unix_ok = impl_->unix_server->listen_after_bind();
  if (impl_->tcp_server) impl_->tcp_server->stop();
  if (tcp.joinable()) tcp.join();
  if (impl_->watcher) impl_->watcher->Stop();
  if (!unix_ok) return Status::Error(Code::kIoError, "serving on `{}` failed", impl_->options.socket_path);
  if (!tcp_ok) return Status::Error(Code::kIoError, "serving on `{}` failed", impl_->options.listen);
  return Status::Ok();
}

Status RunAgent(AgentOptions options) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts

  if (!options.service.log)
    options.service.log = [](const std::string& l) { std::fprintf(stderr, "[agent] %s\n", l.c_str()); };
  auto log = options.service.log;
  // A long-running process: its jobs' large buffers go back to the kernel when freed (util/heap.h).
  if (Status mapped = MapLargeAllocations(kLargeAllocationBytes); !mapped.ok()) log(mapped.ToString());
  std::string socket_path = options.socket_path, listen = options.listen;
  GPUSNAP_ASSIGN_OR_RETURN(auto server, AgentServer::Start(std::move(options)));
  log(fmt::format("listening on unix:{}{}", socket_path,
                  listen.empty() ? "" : fmt::format(" and http://{} (port {})", listen, server->tcp_port())));
  std::atomic<bool> served{false};
  std::thread waiter([&server, &log, &served, set] {
    int sig = 0;
    sigwait(&set, &sig);
    if (!served) log(fmt::format("signal {}: stopping", sig));
    // Stop() does nothing until the listen loop runs: repeat until Serve returns.
    while (!served) {
      server->Stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  Status st = server->Serve();
  served = true;
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return st;
}

}  // namespace gpusnap::agent
