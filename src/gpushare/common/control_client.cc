#include "gpushare/common/control_client.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

namespace gpusnap::gpushare {

bool SendWithFd(int sock, const std::string& data, int fd) {
  size_t off = 0;
  if (fd >= 0) {
    iovec iov{const_cast<char*>(data.data()), data.size()};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
    ssize_t n;
    do n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n <= 0) return false;
    off = static_cast<size_t>(n);
  }
  while (off < data.size()) {
    ssize_t n = ::send(sock, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

long RecvWithFd(int sock, char* buf, size_t len, UniqueFd& fd) {
  iovec iov{buf, len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) return -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (i == 0) fd.Reset(got);
      else ::close(got);  // one fd per message is the protocol: more are dropped
    }
  }
  return n;
}

Result<ControlExchange> ExchangeControlLine(const std::string& socket_name, const std::string& line, int timeout_ms,
                                            int send_fd, const std::string& what) {
  auto fail = [&](int err, const char* how) {
    return Status::Errno(err, "{}: {} control socket @{}", what, how, socket_name);
  };
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return fail(errno, "creating a socket for the");
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_name.size() + 2 > sizeof(addr.sun_path))
    return Status::Error(Code::kInvalidArgument, "{}: socket name too long", what);
  std::memcpy(addr.sun_path + 1, socket_name.data(), socket_name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + socket_name.size());
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return fail(errno, "cannot reach its");
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (!SendWithFd(fd.get(), line, send_fd)) return fail(errno, "cannot write to its");
  ControlExchange out;
  char buf[4096];
  while (out.reply.find('\n') == std::string::npos) {
    long n = RecvWithFd(fd.get(), buf, sizeof(buf), out.passed_fd);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return Status::Error(Code::kTimeout, "{}: no answer within {} ms", what, timeout_ms);
    if (n < 0) return fail(errno, "cannot read from its");
    if (n == 0) return Status::Error(Code::kExternal, "{}: the process closed its control socket", what);
    out.reply.append(buf, static_cast<size_t>(n));
  }
  out.reply.resize(out.reply.find('\n'));
  return out;
}

}  // namespace gpusnap::gpushare
