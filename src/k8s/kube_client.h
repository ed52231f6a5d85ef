// A small client of the Kubernetes API server's REST API: JSON GET, POST and
// merge PATCH, and watch streams, over HTTPS verified against the
// configuration's CA (and the server's name or address, as in its
// certificate), with its bearer token. Only what the agent needs.
//
// Paths are absolute API paths with their query ("/api/v1/pods?watch=true&...").
// Query values must be escaped by the caller (QueryEscape).
//
// Errors name the method, the path and the API server's own message:
//   kIoError            the server could not be reached, or the connection broke
//   kNotFound           404
//   kAlreadyExists      409 (a conflict: the object changed, or exists)
//   kFailedPrecondition 401, 403 (who we are, or what we may do)
//   kInvalidArgument    400, 415, 422
//   kExternal           any other status, or a body that is not JSON
//
// Thread-safety: every method may be called from any thread, concurrently;
// each request uses a connection of its own.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "gpusnap/status.h"
#include "k8s/kubeconfig.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace httplib {
class Client;
}

namespace gpusnap::k8s {

// Percent-encoding of a query value (RFC 3986 unreserved characters kept).
std::string QueryEscape(std::string_view value);

class KubeClient {
 public:
  // kInvalidArgument for a server URL that is not http(s)://host[:port][/prefix],
  // an https server without a CA, or a CA that holds no PEM certificate.
  static Result<std::unique_ptr<KubeClient>> Create(ApiServerConfig config, int timeout_s = 30);
  ~KubeClient();

  Result<nlohmann::json> Get(const std::string& path) const;
  Result<nlohmann::json> Post(const std::string& path, const nlohmann::json& body) const;
  // application/merge-patch+json (RFC 7386).
  Result<nlohmann::json> MergePatch(const std::string& path, const nlohmann::json& patch) const;

  enum class WatchEnd {
    kClosed,   // the server ended the stream (its timeoutSeconds): watch again from the last resourceVersion
    kExpired,  // HTTP 410 before the stream: list again
    kStopped,  // Stop() was called, or on_line asked to stop
  };
  // Streams `path` (a watch) and calls on_line with each line as it arrives;
  // on_line returns false to end the watch. The read times out after
  // read_timeout_s without data.
  Result<WatchEnd> Watch(const std::string& path, int read_timeout_s,
                         const std::function<bool(std::string_view line)>& on_line) EXCLUDES(watch_mu_);

  // Ends a Watch in progress and makes later ones return kStopped at once.
  // A Watch that has not yet connected may miss it: call again until the
  // watching thread has returned.
  void Stop() EXCLUDES(watch_mu_);

  const std::string& server() const { return config_.server; }

 private:
  struct Endpoint {
    std::string scheme_host_port;  // for httplib
    std::string path_prefix;       // "" or "/prefix"
  };
  KubeClient(ApiServerConfig config, Endpoint endpoint, int timeout_s);
  Result<std::unique_ptr<httplib::Client>> Connect(int read_timeout_s) const;
  Result<nlohmann::json> Send(const char* method, const std::string& path, const std::string& body,
                              const char* content_type) const;

  ApiServerConfig config_;
  Endpoint endpoint_;
  int timeout_s_;
  std::atomic<bool> stopped_{false};
  Mutex watch_mu_;
  httplib::Client* watching_ GUARDED_BY(watch_mu_) = nullptr;
};

}  // namespace gpusnap::k8s
