#include "gpushare/shim/control_server.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "gpushare/common/control_client.h"
#include "gpushare/common/protocol.h"
#include "gpushare/shim/device_memory.h"
#include "util/mutex.h"
#include "util/thread_annotations.h"

namespace gpusnap::gpushare::shim {
namespace {

Mutex g_mu;
bool g_started GUARDED_BY(g_mu) = false;
int g_listen_fd GUARDED_BY(g_mu) = -1;
std::optional<ControlSocketId> g_identity GUARDED_BY(g_mu);

uint64_t PidNamespaceInode(pid_t pid) {
  struct stat st{};
  std::string path = pid == 0 ? "/proc/self/ns/pid" : "/proc/" + std::to_string(pid) + "/ns/pid";
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// The reply line, and the fd to pass with it (export). `passed` is what the
// peer passed with its request (remap).
std::string Handle(const std::string& line, UniqueFd passed, UniqueFd& reply_fd) {
  auto req = ParseControlRequest(line);
  if (!req.ok()) return FormatControlError(req.status().message());
  DeviceMemory& memory = DeviceMemory::Get();
  if (!Real().missing.empty() && req->command != ShimCommand::kState)
    return FormatControlError("the CUDA driver lacks " + Real().missing);
  Status st;
  switch (req->command) {
    case ShimCommand::kState: break;
    case ShimCommand::kQuiesce: st = memory.Quiesce(req->timeout_ms); break;
    case ShimCommand::kRelease: st = memory.Release(req->chunk_store, req->manifest); break;
    case ShimCommand::kLoad: st = memory.Load(req->chunk_store, req->manifest); break;
    case ShimCommand::kResume: st = memory.Resume(); break;
    case ShimCommand::kExport: {
      auto fd = memory.ExportFd(req->object);
      if (!fd.ok()) return FormatControlError(fd.status().message());
      reply_fd = std::move(*fd);
      break;
    }
    case ShimCommand::kRemap:
      if (!passed.valid()) return FormatControlError("remap: no fd came with the request");
      st = memory.Remap(req->object, std::move(passed));
      break;
    case ShimCommand::kAdopt:
      if (!passed.valid()) return FormatControlError("adopt: no fd came with the request");
      st = memory.Adopt(req->object, std::move(passed));
      break;
  }
  if (!st.ok()) return FormatControlError(st.message(), st.code() == Code::kTimeout);
  return FormatControlReply(memory.Describe());
}

void Serve(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return;
  // A peer outside our pid namespace shows as pid 0 here.
  bool same_ns = cred.pid > 0 && PidNamespaceInode(cred.pid) == PidNamespaceInode(0);
  std::string reply;
  UniqueFd reply_fd;
  if (!ControlPeerAllowed(cred.uid, ::geteuid(), same_ns)) {
    reply = FormatControlError("permission denied: only root or this process's user in its pid namespace");
  } else {
    timeval tv{30, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    std::string line;
    UniqueFd passed;
    char buf[4096];
    while (line.find('\n') == std::string::npos && line.size() < 65536) {
      long n = RecvWithFd(fd, buf, sizeof(buf), passed);
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    if (line.find('\n') == std::string::npos) return;  // the peer left, or sent too much
    reply = Handle(line.substr(0, line.find('\n')), std::move(passed), reply_fd);
  }
  SendWithFd(fd, reply, reply_fd.get());
  // Closing with the peer's request unread would reset the connection before
  // the peer reads our answer: say we are done, then take what it sent, briefly.
  ::shutdown(fd, SHUT_WR);
  timeval brief{0, 100000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &brief, sizeof(brief));
  char sink[4096];
  for (int i = 0; i < 16 && ::read(fd, sink, sizeof(sink)) > 0; ++i) {
  }
}

void Loop(int listen_fd) {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EBADF || errno == EINVAL) return;  // closed in a forked child
      ::usleep(10000);
      continue;
    }
    Serve(fd);
    ::close(fd);
  }
}

// Without g_mu: the child of fork has one thread, and a parent's thread may
// have held g_mu at the fork, which no one in the child would let go of.
void ForgetInChild() NO_THREAD_SAFETY_ANALYSIS {
  // The thread did not come along with fork; the socket belongs to the parent.
  if (g_listen_fd >= 0) ::close(g_listen_fd);
  g_listen_fd = -1;
  g_started = false;
  g_identity.reset();
}

}  // namespace

void StartControlServer() {
  MutexLock lock(g_mu);
  if (g_started) return;
  g_started = true;
  static std::once_flag atfork;
  std::call_once(atfork, [] { pthread_atfork(nullptr, nullptr, ForgetInChild); });

  uint64_t ns_inode = PidNamespaceInode(0);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  std::string name;
  uint32_t generation = 0;
  bool bound = false;
  // A taken name is one of an older namespace that had this inode, kept by a
  // process restored from it: the next generation's is ours.
  while (fd >= 0 && generation < kControlSocketGenerations) {
    name = ControlSocketName(ns_inode, ::getpid(), generation);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path + 1, name.data(), std::min(name.size(), sizeof(addr.sun_path) - 2));
    socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0;
    if (bound || errno != EADDRINUSE) break;
    ++generation;
  }
  if (!bound || ::listen(fd, 8) != 0) {
    std::fprintf(stderr, "gpusnap-gpushare: no control socket @%s: %s\n", name.c_str(), std::strerror(errno));
    if (fd >= 0) ::close(fd);
    return;
  }
  g_listen_fd = fd;
  g_identity = ControlSocketId{ns_inode, ::getpid(), generation};
  std::thread(Loop, fd).detach();
}

std::optional<ControlSocketId> ControlSocketIdentity() {
  MutexLock lock(g_mu);
  return g_identity;
}

}  // namespace gpusnap::gpushare::shim
