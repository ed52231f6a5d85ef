#include "criu/swrk.h"

#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <sstream>

#include "util/fd.h"

namespace gpusnap::criu {

namespace {

// Largest RPC message we expect from CRIU; its own limit is far smaller.
constexpr size_t kMaxMessage = 1 << 20;

// One byte of payload and room for one descriptor: the message both ends use.
struct FdMessage {
  char byte = 'F';
  iovec iov{&byte, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  FdMessage() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

bool SendFd(int over, int fd) {
  FdMessage m;
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  return ::sendmsg(over, &m.msg, MSG_NOSIGNAL) == 1;
}

int RecvFd(int over) {
  FdMessage m;
  if (::recvmsg(over, &m.msg, MSG_CMSG_CLOEXEC) != 1) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

// The launcher's grandchild, inside the target namespaces. Only
// async-signal-safe calls: we were forked from a multi-threaded process.
[[noreturn]] void ExecCriu(int ctl, int sock_fd_number, const std::vector<int>& keep, char* const* argv) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) _exit(126);
  if (!SendFd(ctl, sv[1])) _exit(126);
  ::close(sv[1]);
  if (sv[0] != sock_fd_number) {
    if (::dup2(sv[0], sock_fd_number) < 0) _exit(126);
    ::close(sv[0]);
  }
  int devnull = ::open("/dev/null", O_RDWR);
  if (devnull >= 0) {
    ::dup2(devnull, 0);
    ::dup2(devnull, 1);
    ::dup2(devnull, 2);
  }
  ::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
  ::fcntl(sock_fd_number, F_SETFD, 0);
  for (int fd : keep) ::fcntl(fd, F_SETFD, 0);
  ::execv(argv[0], argv);
  _exit(127);
}

}  // namespace

Result<Swrk> Swrk::Start(const SwrkLaunch& launch) {
  int ctl[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl) != 0) return Status::Errno(errno, "socketpair");
  UniqueFd ctl_ours(ctl[0]), ctl_theirs(ctl[1]);

  UniqueFd pid_ns, mnt_ns, last_pid;
  std::string last_pid_value = std::to_string(launch.ns_last_pid);
  if (launch.ns_last_pid > 0 && launch.ns_holder > 0) {
    // The namespace a write of it changes is the writer's pid namespace.
    last_pid.Reset(::open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC));
    if (!last_pid.valid()) return Status::Errno(errno, "opening /proc/sys/kernel/ns_last_pid");
  }
  if (launch.ns_holder > 0) {
    std::string base = "/proc/" + std::to_string(launch.ns_holder) + "/ns/";
    pid_ns.Reset(::open((base + "pid").c_str(), O_RDONLY | O_CLOEXEC));
    mnt_ns.Reset(::open((base + "mnt").c_str(), O_RDONLY | O_CLOEXEC));
    if (!pid_ns.valid() || !mnt_ns.valid())
      return Status::Errno(errno, "opening the namespaces of pid {}", launch.ns_holder);
  }

  int sock_fd_number = std::max(ctl[1], 3) + 1;
  for (int fd : launch.inherit_fds) sock_fd_number = std::max(sock_fd_number, fd + 1);
  std::vector<std::string> args = launch.bundle->Argv({"swrk", std::to_string(sock_fd_number)});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t parent = ::getpid();

  pid_t launcher = ::fork();
  if (launcher < 0) return Status::Errno(errno, "fork");
  if (launcher == 0) {
    // If gpusnap dies, the launcher goes with it; CRIU itself lives on, sees
    // its socket close and rolls back on its own.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(125);
    // "0" moves the writer: the launcher joins, and CRIU, forked next, with it.
    for (int fd : launch.cgroup_procs_fds)
      if (::write(fd, "0", 1) != 1) _exit(122);
    if (pid_ns.valid()) {
      if (::setns(pid_ns.get(), CLONE_NEWPID) != 0 || ::setns(mnt_ns.get(), CLONE_NEWNS) != 0 || ::chdir("/") != 0)
        _exit(124);
    }
    if (last_pid.valid()) {
      // A child, the first of ours in the namespace, writes it; CRIU, forked
      // after it has gone, starts above it.
      pid_t writer = ::fork();
      if (writer < 0) _exit(121);
      if (writer == 0)
        _exit(::write(last_pid.get(), last_pid_value.data(), last_pid_value.size()) ==
                      static_cast<ssize_t>(last_pid_value.size())
                  ? 0
                  : 1);
      int written = 0;
      while (::waitpid(writer, &written, 0) < 0 && errno == EINTR) {
      }
      if (!WIFEXITED(written) || WEXITSTATUS(written) != 0) _exit(121);
    }
    pid_t criu = ::fork();
    if (criu < 0) _exit(123);
    if (criu == 0) ExecCriu(ctl[1], sock_fd_number, launch.inherit_fds, argv.data());
    int wstatus = 0;
    while (::waitpid(criu, &wstatus, 0) < 0 && errno == EINTR) {
    }
    _exit(WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus));
  }
  ctl_theirs.Reset();

  Swrk s;
  s.launcher_pid_ = launcher;
  pollfd p{ctl_ours.get(), POLLIN, 0};
  int ready = ::poll(&p, 1, 30000);
  int sock = ready > 0 ? RecvFd(ctl_ours.get()) : -1;
  if (sock < 0) {
    int wstatus = 0;
    ::kill(launcher, SIGKILL);
    ::waitpid(launcher, &wstatus, 0);
    int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
    s.launcher_pid_ = -1;
    const char* why = code == 124   ? "could not enter the workload's namespaces"
                      : code == 122 ? "could not join the target's cgroups"
                      : code == 121 ? "could not set where the namespace's next pids start (ns_last_pid)"
                      : code == 126 ? "could not prepare its RPC socket"
                                    : "did not start";
    return Status::Error(Code::kExternal, "starting CRIU (`{}`): {} (launcher status {})", launch.bundle->criu, why,
                         code);
  }
  s.sock_ = sock;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) s.criu_pid_ = cred.pid;
  return s;
}

Swrk::Swrk(Swrk&& o) noexcept
    : sock_(std::exchange(o.sock_, -1)),
      launcher_pid_(std::exchange(o.launcher_pid_, -1)),
      criu_pid_(std::exchange(o.criu_pid_, -1)) {}

Swrk::~Swrk() {
  if (sock_ >= 0) ::close(sock_);
  if (launcher_pid_ > 0) {
    // Closing the socket makes a CRIU waiting on us roll back and exit; one
    // that is stuck elsewhere is killed after a grace period.
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(launcher_pid_, nullptr, WNOHANG) == launcher_pid_) return;
      ::usleep(50 * 1000);
    }
    if (criu_pid_ > 0) ::kill(criu_pid_, SIGKILL);
    ::waitpid(launcher_pid_, nullptr, 0);
  }
}

Result<criu_resp> Swrk::Call(const criu_req& req, std::chrono::steady_clock::time_point deadline,
                             const NotifyHandler& on_notify) {
  auto send = [&](const criu_req& r) -> Status {
    std::string wire;
    if (!r.SerializeToString(&wire)) return Status::Error(Code::kInternal, "serializing a CRIU request");
    if (::send(sock_, wire.data(), wire.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(wire.size()))
      return Status::Errno(errno, "sending a request to CRIU");
    return Status::Ok();
  };
  GPUSNAP_RETURN_IF_ERROR(send(req));
  std::vector<char> buf(kMaxMessage);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      if (criu_pid_ > 0) ::kill(criu_pid_, SIGKILL);
      return Status::Error(Code::kTimeout, "CRIU did not answer before the deadline; it was stopped");
    }
    pollfd p{sock_, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (r < 0 && errno != EINTR) return Status::Errno(errno, "waiting for CRIU");
    if (r <= 0) continue;
    ssize_t n = ::recv(sock_, buf.data(), buf.size(), 0);
    if (n < 0) return Status::Errno(errno, "reading from CRIU");
    if (n == 0) return Status::Error(Code::kExternal, "CRIU exited without answering");
    criu_resp resp;
    if (!resp.ParseFromArray(buf.data(), static_cast<int>(n)))
      return Status::Error(Code::kExternal, "CRIU sent a message gpusnap cannot parse ({} bytes)", n);
    if (resp.type() != NOTIFY) return resp;
    Status st = on_notify ? on_notify(resp.notify().script(), resp.notify().pid()) : Status::Ok();
    criu_req ack;
    ack.set_type(NOTIFY);
    ack.set_notify_success(st.ok());
    GPUSNAP_RETURN_IF_ERROR(send(ack));
  }
}

CriuExit CriuExitFromLauncher(int launcher_wait_status) {
  if (WIFSIGNALED(launcher_wait_status)) return {.code = 0, .signal = WTERMSIG(launcher_wait_status)};
  int code = WEXITSTATUS(launcher_wait_status);
  // 128 + a signal number; CRIU's own exit codes are small (0, 1, 255 for -1).
  if (code > 128 && code - 128 < NSIG) return {.code = 0, .signal = code - 128};
  return {.code = code, .signal = 0};
}

void Swrk::Hangup() {
  if (sock_ >= 0) ::close(std::exchange(sock_, -1));
}

std::optional<CriuExit> Swrk::Wait(std::chrono::steady_clock::time_point deadline) {
  if (launcher_pid_ <= 0) return std::nullopt;
  // Readable once the launcher has exited; without pidfds, short sleeps.
  UniqueFd exited(static_cast<int>(::syscall(SYS_pidfd_open, launcher_pid_, 0)));
  for (;;) {
    int wstatus = 0;
    pid_t r = ::waitpid(launcher_pid_, &wstatus, WNOHANG);
    if (r == launcher_pid_) {
      launcher_pid_ = -1;
      return CriuExitFromLauncher(wstatus);
    }
    if (r < 0 && errno != EINTR) return std::nullopt;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    if (exited.valid()) {
      pollfd p{exited.get(), POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    } else {
      ::usleep(10 * 1000);
    }
  }
}

std::string ErrorLines(const std::string& log_text, size_t max) {
  std::deque<std::string> lines;
  std::istringstream in(log_text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("Error") == std::string::npos) continue;
    // Printed on every run where CRIU may not raise its fd limit; harmless.
    if (line.find("RLIMIT_NOFILE") != std::string::npos) continue;
    lines.push_back(line);
    if (lines.size() > max) lines.pop_front();
  }
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : "\n") + l;
  return out;
}

}  // namespace gpusnap::criu
