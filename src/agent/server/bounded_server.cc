#include "agent/server/bounded_server.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "agent/server/peer_credentials.h"
#include "agent/server/request_head.h"

namespace gpusnap::agent {

namespace {

using Clock = std::chrono::steady_clock;

// poll() on one descriptor for `events`, at most `timeout` (EINTR retried).
bool PollFor(int fd, short events, Clock::duration timeout) {
  auto end = Clock::now() + timeout;
  for (;;) {
    auto left = std::chrono::ceil<std::chrono::milliseconds>(end - Clock::now()).count();
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 0)));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

// A socket's address as text: the peer's (getpeername) or ours
// (getsockname). Empty for a unix socket; `port` is then the peer's pid.
void AddressOf(int sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  auto* sa = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? ::getpeername(sock, sa, &len) : ::getsockname(sock, sa, &len)) != 0) return;
  if (addr.ss_family == AF_UNIX) {
    ucred cred{};
    socklen_t cred_len = sizeof cred;
    if (peer && ::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) == 0) port = cred.pid;
    return;
  }
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (::getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) return;
  ip = host;
  port = std::atoi(serv);
}

std::string PeerAddress(int sock) {
  std::string ip;
  int port = -1;
  AddressOf(sock, true, ip, port);
  return ip;
}

// One JSON answer written straight to the socket, for what is refused
// before (or without) cpp-httplib answering: never blocks.
void WriteAnswer(int sock, int status, const char* reason, const std::string& error) {
  std::string body = nlohmann::json{{"error", error}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  body += "\n";
  std::string answer = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n{}\r\n{}",
      status, reason, body.size(), status == 503 ? "Retry-After: 1\r\n" : "", body);
  (void)::send(sock, answer.data(), answer.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

// Why a request was cut short.
enum class Cut { kNone, kTimeout, kHeadTooLarge };

// The connection as cpp-httplib reads and writes it, with the request's
// deadline and the head's size kept. One per connection (a request may
// have read ahead into the next one's bytes); BeginRequest starts each.
class BoundedStream : public httplib::Stream {
 public:
  BoundedStream(int sock, const ConnectionBounds& bounds) : sock_(sock), bounds_(bounds) {}

  void BeginRequest() {
    head_ = RequestHeadScanner();
    deadline_ = Clock::now() + std::chrono::seconds(bounds_.request_timeout_s);
    cut_ = Cut::kNone;
    wrote_ = false;
  }
  bool has_buffered() const { return offset_ < length_; }
  Cut cut() const { return cut_; }
  bool wrote() const { return wrote_; }
  bool close_after = false;

  bool is_readable() const override {
    if (has_buffered()) return true;
    auto now = Clock::now();
    if (now >= deadline_) {
      cut_ = Cut::kTimeout;
      return false;
    }
    Clock::duration io_timeout = std::chrono::seconds(bounds_.io_timeout_s);
    bool until_deadline = deadline_ - now <= io_timeout;
    if (PollFor(sock_, POLLIN, until_deadline ? deadline_ - now : io_timeout)) return true;
    if (until_deadline) cut_ = Cut::kTimeout;
    return false;
  }

  bool is_writable() const override {
    return PollFor(sock_, POLLOUT, std::chrono::seconds(bounds_.io_timeout_s));
  }

  ssize_t read(char* ptr, size_t size) override {
    if (cut_ != Cut::kNone) return -1;
    if (!has_buffered()) {
      if (!is_readable()) return -1;
      ssize_t n;
      do {
        n = ::recv(sock_, buffer_, sizeof buffer_, 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      offset_ = 0;
      length_ = static_cast<size_t>(n);
    }
    size_t n = std::min(size, length_ - offset_);
    if (!head_.complete()) {
      head_.Feed(std::string_view(buffer_ + offset_, n));
      if (head_.head_bytes() > bounds_.max_head_bytes) {
        cut_ = Cut::kHeadTooLarge;
        return -1;
      }
    }
    std::memcpy(ptr, buffer_ + offset_, n);
    offset_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n > 0) wrote_ = true;
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { AddressOf(sock_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { AddressOf(sock_, false, ip, port); }
  socket_t socket() const override { return sock_; }

 private:
  int sock_;
  const ConnectionBounds& bounds_;
  RequestHeadScanner head_;
  Clock::time_point deadline_ = Clock::time_point::max();
  mutable Cut cut_ = Cut::kNone;
  bool wrote_ = false;
  char buffer_[4096];
  size_t offset_ = 0, length_ = 0;
};

// The stream of the connection this thread serves, for CutShort() and
// CloseAfterAnswer(); and whether this thread is the listener's, refusing a
// connection past max_connections.
thread_local BoundedStream* t_stream = nullptr;
thread_local const ConnectionBounds* t_bounds = nullptr;
thread_local bool t_listener_full = false;
thread_local const std::string* t_who = nullptr;

// The workers, and the count of connections the listener holds (queued or
// served). One past the limit is handed to process_and_close_socket on the
// listener's thread, which refuses it at once.
class BoundedQueue : public httplib::TaskQueue {
 public:
  BoundedQueue(size_t threads, ConnectionLimits& limits) : limits_(limits), pool_(threads) {}

  void enqueue(std::function<void()> fn) override {
    if (!limits_.EnterListener()) {
      t_listener_full = true;
      fn();
      t_listener_full = false;
      return;
    }
    pool_.enqueue([this, fn = std::move(fn)] {
      fn();
      limits_.LeaveListener();
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  ConnectionLimits& limits_;
  httplib::ThreadPool pool_;
};

std::optional<ApiError> CutError(Cut cut, const ConnectionBounds& bounds) {
  switch (cut) {
    case Cut::kTimeout:
      return ApiError{408, fmt::format("the request did not arrive within {} s (--io-timeout)",
                                       bounds.request_timeout_s)};
    case Cut::kHeadTooLarge:
      return ApiError{431, fmt::format("request head larger than {} bytes", bounds.max_head_bytes)};
    case Cut::kNone:
      break;
  }
  return std::nullopt;
}

const char* Reason(int status) {
  switch (status) {
    case 403: return "Forbidden";
    case 408: return "Request Timeout";
    case 431: return "Request Header Fields Too Large";
    default: return "Service Unavailable";
  }
}

}  // namespace

BoundedServer::BoundedServer(ConnectionBounds bounds)
    : bounds_(std::move(bounds)), limits_(bounds_.max_connections, bounds_.max_connections_per_peer) {
  if (!bounds_.log) bounds_.log = [](const std::string&) {};
  size_t threads = static_cast<size_t>(std::max(bounds_.threads, 1));
  new_task_queue = [this, threads] { return new BoundedQueue(threads, limits_); };
}

bool BoundedServer::RaiseBacklog() {
  // listen() again on a listening socket only changes its backlog (Linux).
  return svr_sock_ != INVALID_SOCKET && ::listen(svr_sock_, SOMAXCONN) == 0;
}

std::optional<ApiError> BoundedServer::CutShort() {
  if (!t_stream || !t_bounds) return std::nullopt;
  return CutError(t_stream->cut(), *t_bounds);
}

void BoundedServer::CloseAfterAnswer() {
  if (t_stream) t_stream->close_after = true;
}

std::string BoundedServer::WhoAsked() { return t_who ? *t_who : "local"; }

void BoundedServer::Refuse(socket_t sock, int status, const std::string& why) {
  if (bounds_.on_refused) bounds_.on_refused(status);
  WriteAnswer(sock, status, Reason(status), why);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

bool BoundedServer::process_and_close_socket(socket_t sock) {
  std::string peer = PeerAddress(sock);
  std::string from = peer.empty() ? "local" : peer;
  if (bounds_.allowed_uids) {
    auto cred = PeerCredentialsOf(sock);
    from = cred ? DescribePeer(*cred) : "a peer the kernel does not name";
    if (!cred || !UidMayCall(cred->uid, *bounds_.allowed_uids)) {
      std::string who_may = "only root";
      for (uid_t uid : *bounds_.allowed_uids) who_may += fmt::format(", uid {}", uid);
      bounds_.log(fmt::format("{}: refusing {}: {} may call the agent", bounds_.listener, from, who_may));
      Refuse(sock, 403, fmt::format("{} may call the agent; this connection is from uid {}", who_may,
                                    cred ? std::to_string(cred->uid) : "unknown"));
      return false;
    }
  }
  if (t_listener_full) {
    if (!full_reported_.exchange(true))
      bounds_.log(fmt::format("{}: refusing connections: the listener is full (--max-connections {})",
                              bounds_.listener, limits_.max_in_all()));
    Refuse(sock, 503,
           fmt::format("the agent's {} listener is full (--max-connections {}): retry later",
                       bounds_.listener, limits_.max_in_all()));
    return false;
  }
  full_reported_ = false;
  auto verdict = limits_.EnterPeer(peer);
  if (verdict != ConnectionLimits::PeerVerdict::kAdmitted) {
    std::string why = fmt::format("too many connections from {} (at most {} at once)", from,
                                  limits_.max_per_peer());
    if (verdict == ConnectionLimits::PeerVerdict::kRefused)
      bounds_.log(fmt::format("{}: refusing connections from {}: {}", bounds_.listener, from, why));
    Refuse(sock, 503, why);
    return false;
  }

  BoundedStream stream(sock, bounds_);
  t_stream = &stream;
  t_bounds = &bounds_;
  t_who = &from;
  bool ok = false;
  size_t left = keep_alive_max_count_;
  auto idle = std::chrono::seconds(keep_alive_timeout_sec_);
  for (; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
    // The next request's first byte, watching for stop() meanwhile.
    bool readable = stream.has_buffered();
    for (auto end = Clock::now() + idle; !readable && svr_sock_ != INVALID_SOCKET && Clock::now() < end;)
      readable = PollFor(sock, POLLIN, std::min<Clock::duration>(end - Clock::now(), std::chrono::milliseconds(200)));
    if (!readable) break;
    stream.BeginRequest();
    bool connection_closed = false;
    ok = process_request(stream, left == 1, connection_closed, nullptr);
    if (auto cut = CutError(stream.cut(), bounds_); cut && !stream.wrote()) {
      // Cut before cpp-httplib answered (in the request line): answered here.
      WriteAnswer(sock, cut->http_status, Reason(cut->http_status), cut->message);
      if (bounds_.on_refused) bounds_.on_refused(cut->http_status);
      bounds_.log(fmt::format("{} request from {}: HTTP {}: {}", bounds_.listener, from, cut->http_status,
                              cut->message));
      ok = false;
    }
    if (!ok || connection_closed || stream.close_after) break;
  }
  t_stream = nullptr;
  t_bounds = nullptr;
  t_who = nullptr;
  limits_.LeavePeer(peer);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return ok;
}

}  // namespace gpusnap::agent
