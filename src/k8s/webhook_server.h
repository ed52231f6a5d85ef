// `gpusnap webhook`: the mutating admission webhook's HTTPS server.
//
// Endpoints:
//   POST /mutate   an AdmissionReview v1 (k8s/admission.h says what comes back)
//   GET  /healthz  200 "ok" (for the Deployment's probes)
// A body larger than max_body_bytes is refused with 413 (discarded unparsed);
// reads and writes (the TLS handshake included) time out after io_timeout_s.
// One log line per review (uid, pod, what was done) and per refused request.
//
// TLS: TLS 1.2 or newer, the certificate and key from PEM files, read again
// when they change (k8s/cert_reloader.h). No client certificates.
//
// Thread-safety: Stop() may be called from any thread; the rest from one.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "gpusnap/status.h"
#include "k8s/mutate.h"

namespace gpusnap::k8s {

struct WebhookOptions {
  std::string cert_file;              // REQUIRES: non-empty; PEM, leaf first, then intermediates
  std::string key_file;               // REQUIRES: non-empty; PEM, matching the certificate
  std::string listen = "0.0.0.0:8443";  // HOST:PORT, [V6]:PORT or :PORT; port 0 picks a free one
  MutateConfig mutate;
  size_t max_body_bytes = 4 << 20;
  int io_timeout_s = 10;
  // Each connection holds a thread while open, idle keep-alive ones for up to
  // 5 s: enough for a few API servers' connection pools.
  int threads = 16;
  std::function<void(const std::string&)> log;  // one line each; default: stderr with a [webhook] prefix
};

// Splits "HOST:PORT", "[V6]:PORT" or ":PORT" (host 0.0.0.0).
// kInvalidArgument quoting `listen` otherwise.
Result<std::pair<std::string, int>> ParseListen(const std::string& listen);

class WebhookServer {
 public:
  // Loads the certificate and binds the socket (so port() is known before
  // Serve). kInvalidArgument for bad options or certificate files,
  // kIoError when the address cannot be bound.
  static Result<std::unique_ptr<WebhookServer>> Bind(WebhookOptions options);
  ~WebhookServer();

  int port() const;
  const std::string& host() const;
  std::string CertificateFingerprint() const;  // SHA-256, hex, of the certificate now served
  // Serves until Stop(). kIoError if the server fails.
  Status Serve();
  void Stop();

 private:
  struct Impl;
  explicit WebhookServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Bind, log "listening on https://HOST:PORT", and serve until SIGINT or
// SIGTERM. Blocks both signals in the calling thread (and so in the server's
// threads) and waits for them on a thread of its own.
Status RunWebhook(WebhookOptions options);

}  // namespace gpusnap::k8s
