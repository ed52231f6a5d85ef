#include "k8s/webhook_server.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <thread>

#include <httplib.h>

#include "k8s/admission.h"
#include "k8s/cert_reloader.h"

namespace gpusnap::k8s {

struct WebhookServer::Impl {
  WebhookOptions options;
  std::shared_ptr<CertReloader> certs;  // outlives the server's SSL_CTX (declared first)
  std::unique_ptr<httplib::SSLServer> server;
  std::string host;
  int port = 0;
};

namespace {

void LogToStderr(const std::string& line) { std::fprintf(stderr, "[webhook] %s\n", line.c_str()); }

void AddRoutes(httplib::SSLServer& server, const WebhookOptions& o) {
  server.Post("/mutate", [&o](const httplib::Request& req, httplib::Response& res) {
    AdmissionReply reply = Admit(req.body, o.mutate);
    res.status = reply.http_status;
    res.set_content(reply.body, reply.content_type.c_str());
    o.log(reply.log_line);
  });
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) { res.set_content("ok\n", "text/plain"); });
  // Refusals httplib makes itself (413, 404, 405, ...) get a body and a log line.
  server.set_error_handler(
      httplib::Server::HandlerWithResponse([&o](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;  // ours, logged already
        res.set_content(fmt::format("HTTP {}\n", res.status), "text/plain");
        o.log(fmt::format("{} {} from {}: HTTP {}", req.method, req.path, req.remote_addr, res.status));
        return httplib::Server::HandlerResponse::Handled;
      }));
}

}  // namespace

Result<std::pair<std::string, int>> ParseListen(const std::string& listen) {
  auto colon = listen.rfind(':');
  if (colon == std::string::npos) return Status::Error(Code::kInvalidArgument, "listen address `{}` has no :PORT", listen);
  std::string host = listen.substr(0, colon);
  std::string port = listen.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) host = "0.0.0.0";
  int p = -1;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p < 0 || p > 65535 ||
      host.find_first_of("[]") != std::string::npos)
    return Status::Error(Code::kInvalidArgument, "listen address `{}` is not HOST:PORT", listen);
  return std::pair{host, p};
}

WebhookServer::WebhookServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WebhookServer::~WebhookServer() = default;
int WebhookServer::port() const { return impl_->port; }
const std::string& WebhookServer::host() const { return impl_->host; }
std::string WebhookServer::CertificateFingerprint() const { return impl_->certs->Fingerprint(); }
void WebhookServer::Stop() { impl_->server->stop(); }

Result<std::unique_ptr<WebhookServer>> WebhookServer::Bind(WebhookOptions options) {
  if (options.cert_file.empty() || options.key_file.empty())
    return Status::Error(Code::kInvalidArgument, "the webhook needs --cert and --key");
  if (options.mutate.reaper_command.empty()) return Status::Error(Code::kInvalidArgument, "empty reaper command");
  if (!options.log) options.log = LogToStderr;
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  const WebhookOptions& o = impl->options;
  GPUSNAP_ASSIGN_OR_RETURN(auto hp, ParseListen(o.listen));
  std::tie(impl->host, impl->port) = hp;
  GPUSNAP_ASSIGN_OR_RETURN(impl->certs, CertReloader::Load(o.cert_file, o.key_file, o.log));

  CertReloader* certs = impl->certs.get();
  impl->server = std::make_unique<httplib::SSLServer>([certs](SSL_CTX& ctx) {
    SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
    SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
    certs->Install(&ctx);
    return true;
  });
  httplib::SSLServer& s = *impl->server;
  if (!s.is_valid()) return Status::Error(Code::kInternal, "cannot set up a TLS context");
  s.set_payload_max_length(o.max_body_bytes);
  s.set_read_timeout(o.io_timeout_s);
  s.set_write_timeout(o.io_timeout_s);
  s.set_keep_alive_timeout(std::min(o.io_timeout_s, 5));
  s.set_keep_alive_max_count(100);
  int threads = o.threads > 0 ? o.threads : 1;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  AddRoutes(s, o);

  if (impl->port == 0) {
    impl->port = s.bind_to_any_port(impl->host);
    if (impl->port < 0) return Status::Error(Code::kIoError, "cannot bind `{}`", o.listen);
  } else if (!s.bind_to_port(impl->host, impl->port)) {
    return Status::Error(Code::kIoError, "cannot bind `{}` (in use, or not an address of this host)", o.listen);
  }
  return std::unique_ptr<WebhookServer>(new WebhookServer(std::move(impl)));
}

Status WebhookServer::Serve() {
  if (!impl_->server->listen_after_bind())
    return Status::Error(Code::kIoError, "serving on port {} failed", impl_->port);
  return Status::Ok();
}

Status RunWebhook(WebhookOptions options) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before any thread starts

  if (!options.log) options.log = LogToStderr;
  auto log = options.log;
  GPUSNAP_ASSIGN_OR_RETURN(auto server, WebhookServer::Bind(std::move(options)));
  log(fmt::format("listening on https://{}:{} (certificate sha256 {})", server->host(), server->port(),
                  server->CertificateFingerprint()));
  std::atomic<bool> served{false};
  std::thread waiter([&server, &log, &served, set] {
    int sig = 0;
    sigwait(&set, &sig);
    if (!served && (sig == SIGINT || sig == SIGTERM)) log(fmt::format("signal {}: stopping", sig));
    // Stop() does nothing until the listen loop runs: a signal right after
    // the bind must not be lost, so repeat until Serve has returned.
    while (!served) {
      server->Stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  Status st = server->Serve();
  served = true;
  pthread_kill(waiter.native_handle(), SIGTERM);  // wakes the waiter if Serve ended on its own
  waiter.join();
  return st;
}

}  // namespace gpusnap::k8s
