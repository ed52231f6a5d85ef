// An httplib::Server (cpp-httplib 0.11, as Debian builds it) that bounds
// what one connection may take of the agent. cpp-httplib alone bounds only
// each single read, so a client that drips its header lines holds a worker
// thread for as long as it likes, and with a few connections every worker.
// Here:
//  - a request's head and body must arrive within `request_timeout_s` of
//    its first byte: past that the read fails and the answer is 408;
//  - a request's head (request line and headers) holds at most
//    `max_head_bytes`: 431 past that;
//  - the listener holds at most `max_connections` connections, served or
//    waiting for a worker, and serves at most `max_connections_per_peer` at
//    once from one peer address (0: no limit; the unix socket's callers are
//    all one peer, "", so it sets none). A connection past either is
//    answered 503 at once, before anything of it is read: one peer cannot
//    take the workers of the others. 503 means only this: nothing was done;
//  - the listen backlog is SOMAXCONN, not cpp-httplib's 5, so that many
//    callers at once queue instead of being refused;
//  - after an answer of 400 or more the connection is closed (the request's
//    body may not have been read whole);
//  - on the unix socket, a connection whose peer (SO_PEERCRED) is neither
//    root nor an allowed uid is answered 403 before anything of it is read
//    (agent/server/peer_credentials.h).
//
// It serves each connection itself (cpp-httplib's virtual
// process_and_close_socket) through a Stream of its own that keeps the
// deadline, and has cpp-httplib's process_request read and answer each
// request on it.
#pragma once

#include <atomic>
#include <cstddef>
#include <functional>
#include <optional>
#include <set>
#include <string>

#include <sys/types.h>

#include <httplib.h>

#include "agent/api/request.h"
#include "agent/server/connection_limits.h"

namespace gpusnap::agent {

struct ConnectionBounds {
  std::string listener = "unix";  // for log lines: "unix" or "tcp"
  int threads = 8;                // worker threads
  int request_timeout_s = 10;     // a request's head and body, from its first byte
  int io_timeout_s = 10;          // one read or write
  size_t max_head_bytes = 64 << 10;
  size_t max_connections = 256;
  size_t max_connections_per_peer = 0;
  std::function<void(const std::string&)> log;  // one line per refusal it makes itself
  // Set on the unix socket: besides root, the uids that may call. Unset on
  // TCP, whose callers present a token instead.
  std::optional<std::set<uid_t>> allowed_uids;
  std::function<void(int http_status)> on_refused;  // each refusal it makes itself, counted
};

class BoundedServer : public httplib::Server {
 public:
  explicit BoundedServer(ConnectionBounds bounds);

  // Call after bind_to_port or bind_to_any_port: the backlog becomes SOMAXCONN.
  bool RaiseBacklog();

  // For the handlers, on the thread answering a request: why the bounds cut
  // the request short (408 or 431), if they did.
  static std::optional<ApiError> CutShort();
  // For the handlers: the connection closes after this answer.
  static void CloseAfterAnswer();
  // For the handlers and the request log: who is at the other end of the
  // connection being served ("uid 0 (gid 0, pid 812 `gpusnap`)" on the unix
  // socket, the peer's address on TCP).
  static std::string WhoAsked();

 private:
  bool process_and_close_socket(socket_t sock) override;
  void Refuse(socket_t sock, int status, const std::string& why);

  ConnectionBounds bounds_;
  ConnectionLimits limits_;
  std::atomic<bool> full_reported_{false};
};

}  // namespace gpusnap::agent
