// `gpusnap agent`: the node agent's HTTP/JSON API (docs/AGENT.md) over
//  - a unix socket, mode 0600 in a directory of mode 0700: only root may call,
//    and every connection's peer is checked (agent/server/peer_credentials.h):
//    root, or a uid of allowed_uids (then the socket is mode 0666, the
//    directory the agent makes 0711, and the check alone keeps others out);
//  - and, with `listen`, TCP, where every request but GET /healthz must carry
//    "Authorization: Bearer <token>" (the token file's content), compared in
//    constant time; 401 otherwise.
//
// Bodies larger than max_body_bytes get 413 and are not held: sized,
// chunked or form-encoded alike, a body is read only for a POST, and only up
// to the limit. A connection is bounded as agent/server/bounded_server.h says: a
// request must arrive within io_timeout_s (408), a listener holds at most
// max_connections, and TCP serves at most max_connections_per_peer from one
// address at once (503). Every answer is JSON ({"error": "..."} on refusal)
// but /metrics (Prometheus text); every refusal closes its connection.
//
// With kube.enabled, the agent also restores the placeholder pods of its node
// (agent/kube/placeholder_watcher.h) from Start() until Serve() returns, reads a
// pod's annotations when it checkpoints it and records the capture path on
// it (agent/service/pod_annotations.h), and may take registry credentials from a
// Secret (agent/service/registry_access.h); the pods' namespaces are its
// tenants (tenancy/tenancy.h, agent/service/service.h).
//
// Thread-safety: Stop() may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "agent/kube/placeholder_watcher.h"
#include "agent/service/registry_access.h"
#include "agent/service/service.h"
#include "gpusnap/status.h"

namespace gpusnap::agent {

struct AgentOptions {
  ServiceOptions service;
  std::string socket_path = "/run/gpusnap-agent/agent.sock";
  std::string listen;              // HOST:PORT, :PORT; empty: no TCP
  std::string token_file;          // REQUIRES with listen: a file only its owner may read
  std::set<uid_t> allowed_uids;    // besides root, who may call on the unix socket
  size_t max_body_bytes = 64 << 10;
  int io_timeout_s = 10;                 // a request's head and body, and each read or write
  int threads = 8;                       // worker threads per listener
  size_t max_connections = 256;          // per listener, served or waiting; 0: no limit
  size_t max_connections_per_peer = 4;   // TCP, served at once from one address; 0: no limit
  KubeOptions kube;                // the Kubernetes mode (agent/kube/placeholder_watcher.h)
  RegistrySettings registry;       // pulls and pushes (agent/service/registry_access.h)
  std::string tenancy_file;        // for kube: the administrator's tenancy rules (agent/service/tenancy_source.h)
};

class AgentServer {
 public:
  // Opens the service (journal recovery included), binds the socket(s).
  static Result<std::unique_ptr<AgentServer>> Start(AgentOptions options);
  ~AgentServer();

  int tcp_port() const;  // 0 without TCP
  // Serves until Stop(); then stops the Kubernetes watch and waits for running jobs.
  Status Serve();
  void Stop();

 private:
  struct Impl;
  explicit AgentServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Start, log where it listens, serve until SIGINT or SIGTERM.
Status RunAgent(AgentOptions options);

}  // namespace gpusnap::agent
