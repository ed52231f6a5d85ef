#include "criu/lazy_pages_keeper.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "criu/lazy_pages.h"
#include "criu/operation.h"
#include "criu/swrk.h"
#include "proc/proc.h"
#include "util/child_fds.h"
#include "util/clock.h"
#include "util/files.h"

namespace gpusnap::criu {

namespace {

// The keeper's lines to gpusnap, over their socket:
//   ready <daemon pid>     the daemon listens
//   error <why>            it did not start (the keeper exits)
//   committed              the answer to the commit byte, the daemon still serving or done
//   failed <why>           the daemon died; the tree was killed (the keeper exits)
constexpr char kCommit = 'c';
constexpr auto kStartTimeout = std::chrono::seconds(30);
constexpr auto kAnswerTimeout = std::chrono::seconds(30);
constexpr auto kStopTimeout = std::chrono::seconds(10);

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool SendAll(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    text.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// ---- the keeper ------------------------------------------------------------

struct KeeperArgs {
  int sock_fd = -1;
  std::string dir, bundle, images, name, workload_log;
  pid_t reaper = 0;
  bool placeholder = false;
  bool verbose = false;
};

class Keeper {
 public:
  explicit Keeper(KeeperArgs a) : a_(std::move(a)) {
    std::string path = a_.dir + "/keeper.log";
    log_.Reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  }

  int Run();

 private:
  void Log(const std::string& line) {
    if (log_.valid()) (void)WriteAll(log_.get(), NowRfc3339() + " " + line + "\n", "keeper.log");
  }
  void SetState(const std::string& line) {
    (void)WriteFileAtomic(LazyPagesStateFile(a_.dir), line + "\n");
    Log("state: " + line);
  }
  void Tell(const std::string& line) {
    if (a_.sock_fd >= 0 && !SendAll(a_.sock_fd, line + "\n")) {
      ::close(a_.sock_fd);
      a_.sock_fd = -1;
    }
  }
  // What was restored goes: a fresh namespace as a whole (its pid 1, the
  // reaper, takes everything in it along); in a placeholder, all but its pid 1.
  void KillTree();
  Status StartDaemon();

  KeeperArgs a_;
  UniqueFd log_;
  UniqueFd reaper_fd_;  // a pidfd: the reaper, not a process that reused its pid
  pid_t daemon_ = 0;
  UniqueFd daemon_fd_;  // a pidfd: readable once it exits
};

void Keeper::KillTree() {
  if (!a_.placeholder) {
    if (reaper_fd_.valid() && ::syscall(SYS_pidfd_send_signal, reaper_fd_.get(), SIGKILL, nullptr, 0) == 0) return;
    if (!reaper_fd_.valid()) ::kill(a_.reaper, SIGKILL);
    return;
  }
  // Restored processes may still be forking: until none is left, a few rounds.
  for (int round = 0; round < 20; ++round) {
    bool any = false;
    for (pid_t p : proc::Tree(a_.reaper))
      if (p != a_.reaper && ::kill(p, SIGKILL) == 0) any = true;
    if (!any) return;
    ::usleep(10 * 1000);
  }
}

Status Keeper::StartDaemon() {
  GPUSNAP_ASSIGN_OR_RETURN(Bundle bundle, FindBundle(a_.bundle));
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) return Status::Errno(errno, "pipe");
  UniqueFd ready_rd(ready[0]), ready_wr(ready[1]);
  std::vector<std::string> args = bundle.Argv(LazyPagesArgs(
      {.images_dir = a_.images, .work_dir = a_.dir, .status_fd = ready_wr.get(), .verbose = a_.verbose}));
  std::string line;
  for (const auto& s : args) line += (line.empty() ? "" : " ") + s;
  Log("starting: " + line);
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  int keep = ready_wr.get(), log = log_.valid() ? log_.get() : -1;
  pid_t d = ::fork();
  if (d < 0) return Status::Errno(errno, "fork");
  if (d == 0) {
    DetachStdio(log, {keep});
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  daemon_ = d;
  daemon_fd_.Reset(PidfdOpen(d));
  ready_wr.Reset();
  // One byte once it listens; its end first if it fails.
  auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      ::kill(d, SIGKILL);
      ::waitpid(d, nullptr, 0);
      return Status::Error(Code::kTimeout, "criu lazy-pages (pid {}) was not listening within {} s; it was stopped",
                           d, kStartTimeout.count());
    }
    pollfd p{ready_rd.get(), POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char c;
    ssize_t n = ::read(ready_rd.get(), &c, 1);
    if (n == 1) return Status::Ok();
    if (n < 0 && errno == EINTR) continue;
    // Closed without the byte: it ended (or is ending).
    int wstatus = 0;
    ::waitpid(d, &wstatus, 0);
    std::string why = DescribeExit(CriuExitFromLauncher(wstatus));
    auto text = ReadFile(a_.dir + "/" + kLazyPagesLog);
    std::string lines = text.ok() ? ErrorLines(*text) : "";
    return Status::Error(Code::kExternal, "criu lazy-pages {} before it listened{}{} (its log: {}/{})", why,
                         lines.empty() ? "" : ": ", lines, a_.dir, kLazyPagesLog);
  }
}

int Keeper::Run() {
  reaper_fd_.Reset(PidfdOpen(a_.reaper));
  if (Status started = StartDaemon(); !started.ok()) {
    std::string why = started.message();
    for (char& c : why)
      if (c == '\n') c = ' ';
    Log("the lazy-pages server did not start: " + why);
    Tell("error " + why);
    return 1;
  }
  auto started = std::chrono::steady_clock::now();
  SetState(fmt::format("serving: pages arriving (criu lazy-pages pid {}, since {})", daemon_, NowRfc3339()));
  Tell(fmt::format("ready {}", daemon_));

  bool committed = false, delivered = false;
  double delivered_s = 0, committed_s = 0;
  auto done = [&] {
    double after = delivered_s - committed_s;
    SetState(after > 0 ? fmt::format("done: every page delivered in {:.2f} s ({:.2f} s after the restore returned)",
                                      delivered_s, after)
                       : fmt::format("done: every page delivered in {:.2f} s (before the restore returned)",
                                     delivered_s));
    ::unlink((a_.dir + "/" + kLazyPagesSocket).c_str());
    return 0;
  };
  for (;;) {
    std::vector<pollfd> fds;
    if (!delivered) fds.push_back({daemon_fd_.get(), POLLIN, 0});
    if (a_.sock_fd >= 0 && !committed) fds.push_back({a_.sock_fd, POLLIN, 0});
    if (fds.empty()) return done();
    // Without a pidfd, the daemon's end is looked for every 100 ms.
    int timeout = !delivered && !daemon_fd_.valid() ? 100 : -1;
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) return 1;

    if (!delivered) {
      int wstatus = 0;
      pid_t r = ::waitpid(daemon_, &wstatus, WNOHANG);
      if (r == daemon_) {
        CriuExit exit = CriuExitFromLauncher(wstatus);
        if (exit.signal == 0 && exit.code == 0) {
          delivered = true;
          delivered_s = SecondsSince(started);
          Log(fmt::format("criu lazy-pages exited 0 after {:.2f} s", delivered_s));
          if (committed) return done();
        } else {
          KillTree();
          std::string why = fmt::format(
              "the lazy-pages server (criu lazy-pages, pid {}) {} before every page of the restored memory was "
              "delivered; the restored tree of `{}` was killed, as its memory was incomplete (the server's log: "
              "{}/{})",
              daemon_, DescribeExit(exit), a_.name, a_.dir, kLazyPagesLog);
          SetState("failed: " + why);
          // Before the commit the restore fails and says so itself.
          if (committed && !a_.workload_log.empty()) {
            UniqueFd wl(::open(a_.workload_log.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC));
            if (wl.valid()) (void)WriteAll(wl.get(), "gpusnap: " + why + "\n", a_.workload_log);
          }
          Tell("failed " + why);
          ::unlink((a_.dir + "/" + kLazyPagesSocket).c_str());
          return 1;
        }
      }
    }

    if (a_.sock_fd >= 0 && !committed) {
      pollfd p{a_.sock_fd, POLLIN, 0};
      if (::poll(&p, 1, 0) <= 0) continue;
      char c = 0;
      ssize_t got = ::recv(a_.sock_fd, &c, 1, 0);
      if (got < 0 && errno == EINTR) continue;
      if (got == 1 && c == kCommit) {
        committed = true;
        committed_s = SecondsSince(started);
        Log(fmt::format("the restore committed after {:.2f} s", committed_s));
        Tell("committed");
        ::close(a_.sock_fd);
        a_.sock_fd = -1;
        if (delivered) return done();
        continue;
      }
      if (got <= 0) {
        // The restore failed, or its gpusnap died: nothing of it may stay.
        Log("the restore ended without committing: the tree and the server go");
        KillTree();
        if (!delivered) {
          ::kill(daemon_, SIGKILL);
          ::waitpid(daemon_, nullptr, 0);
        }
        SetState("abandoned: the restore did not complete");
        ::unlink((a_.dir + "/" + kLazyPagesSocket).c_str());
        return 0;
      }
    }
  }
}

std::string ShellWords(const std::vector<std::string>& args) {
  std::string out;
  for (const auto& a : args) out += (out.empty() ? "" : " ") + a;
  return out;
}

}  // namespace

std::string LazyPagesStateFile(const std::string& work_dir) { return work_dir + "/state"; }

std::string ReadLazyPagesState(const std::string& work_dir) {
  auto text = ReadFile(LazyPagesStateFile(work_dir));
  if (!text.ok()) return "";
  std::string line = *text;
  while (!line.empty() && line.back() == '\n') line.pop_back();
  return line;
}

Result<std::string> MakeLazyPagesWorkDir(const std::string& run_dir, const std::string& name) {
  static std::atomic<int> counter{0};
  std::string parent = run_dir + "/lazy-pages";
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(parent, 0700));
  std::string dir = std::filesystem::absolute(fmt::format("{}/{}-{}-{}", parent, name, ::getpid(), counter++)).string();
  if (::mkdir(dir.c_str(), 0700) != 0) return Status::Errno(errno, "creating `{}`", dir);
  return dir;
}

Result<LazyPagesServer> LazyPagesServer::Start(const LazyPagesSpec& spec) {
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return Status::Errno(ec.value(), "finding the gpusnap binary");
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return Status::Errno(errno, "socketpair");
  UniqueFd ours(sv[0]), theirs(sv[1]);
  std::vector<std::string> args{self,          "__lazy-pages", "--sock-fd", std::to_string(theirs.get()),
                                "--dir",       spec.work_dir,  "--bundle",  spec.bundle->dir,
                                "--images",    spec.images_dir, "--reaper", std::to_string(spec.reaper_pid),
                                "--name",      spec.workload_name};
  if (!spec.workload_log.empty()) args.insert(args.end(), {"--workload-log", spec.workload_log});
  if (spec.into_container) args.push_back("--placeholder");
  if (spec.verbose) args.push_back("--verbose");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int keep = theirs.get();

  // Not our child: the keeper outlives this gpusnap (in its own session).
  pid_t mid = ::fork();
  if (mid < 0) return Status::Errno(errno, "fork");
  if (mid == 0) {
    // Only async-signal-safe calls: the parent may have threads.
    ::setsid();
    pid_t keeper = ::fork();
    if (keeper != 0) _exit(keeper < 0 ? 1 : 0);
    DetachStdio(-1, {keep});
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  theirs.Reset();
  int wstatus = 0;
  while (::waitpid(mid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  LazyPagesServer s;
  s.work_dir_ = spec.work_dir;
  s.status_ = std::move(ours);
  bool eof = false;
  std::string line = s.NextLine(std::chrono::steady_clock::now() + kStartTimeout + std::chrono::seconds(5), &eof);
  if (line.starts_with("ready ")) {
    s.daemon_pid_ = std::atoi(line.c_str() + 6);
    return s;
  }
  s.status_.Reset();
  if (line.starts_with("error "))
    return Status::Error(Code::kExternal, "the lazy-pages server did not start: {}", line.substr(6));
  return Status::Error(Code::kExternal, "the lazy-pages server's keeper (`{}`) {} before the server listened",
                       ShellWords({args[0], args[1]}), eof ? "ended" : "did not answer");
}

std::string LazyPagesServer::NextLine(std::chrono::steady_clock::time_point deadline, bool* eof) {
  *eof = false;
  for (;;) {
    if (auto nl = buffered_.find('\n'); nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    if (!status_.valid()) {
      *eof = true;
      return "";
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{status_.get(), POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return "";
    char buf[1024];
    ssize_t n = ::recv(status_.get(), buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *eof = true;
      return "";
    }
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

Status LazyPagesServer::Check(std::chrono::milliseconds wait) {
  if (!failure_.empty()) return Status::Error(Code::kExternal, "{}", failure_);
  if (!status_.valid()) return Status::Ok();
  auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    bool eof = false;
    std::string line = NextLine(deadline, &eof);
    if (line.starts_with("failed ")) {
      failure_ = line.substr(7);
      return Status::Error(Code::kExternal, "{}", failure_);
    }
    if (eof)
      return Status::Error(Code::kExternal,
                           "the lazy-pages server's keeper ended while the restore needed it (see {}/keeper.log)",
                           work_dir_);
    if (line.empty()) return Status::Ok();  // nothing said by the deadline
  }
}

Status LazyPagesServer::OnCriuNotify(const std::string& script) {
  // util/test_hooks.h: from here on CRIU touches none of the lazy memory, and
  // the daemon copies nothing in the background before CRIU says it is done.
  if (script == "post-restore" && daemon_pid_ > 0 && std::getenv("GPUSNAP_TEST_LAZY_PAGES_STOPPED"))
    ::kill(daemon_pid_, SIGSTOP);
  return Status::Ok();
}

Status LazyPagesServer::Commit() {
  GPUSNAP_RETURN_IF_ERROR(Check());
  if (!SendAll(status_.get(), std::string(1, kCommit)))
    return Status::Errno(errno, "handing the lazy-pages server to its keeper");
  auto deadline = std::chrono::steady_clock::now() + kAnswerTimeout;
  for (;;) {
    bool eof = false;
    std::string line = NextLine(deadline, &eof);
    if (line == "committed") {
      status_.Reset();
      return Status::Ok();
    }
    if (line.starts_with("failed ")) {
      failure_ = line.substr(7);
      return Status::Error(Code::kExternal, "{}", failure_);
    }
    if (eof || line.empty())
      return Status::Error(Code::kExternal, "the lazy-pages server's keeper {} the commit (see {}/keeper.log)",
                           eof ? "ended before it answered" : "did not answer", work_dir_);
  }
}

Status LazyPagesServer::Stop() {
  if (!status_.valid()) return Status::Ok();
  ::shutdown(status_.get(), SHUT_WR);  // the keeper reads the end: abandoned
  auto deadline = std::chrono::steady_clock::now() + kStopTimeout;
  for (;;) {
    bool eof = false;
    std::string line = NextLine(deadline, &eof);
    if (eof) break;
    if (line.empty() && std::chrono::steady_clock::now() >= deadline) {
      status_.Reset();
      return Status::Error(Code::kTimeout, "the lazy-pages server's keeper did not end within {} s (see {}/keeper.log)",
                           kStopTimeout.count(), work_dir_);
    }
  }
  status_.Reset();
  return Status::Ok();
}

int LazyPagesKeeperMain(int argc, char** argv) {
  KeeperArgs a;
  for (int i = 0; i < argc; ++i) {
    std::string k = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (k == "--placeholder") a.placeholder = true;
    else if (k == "--verbose") a.verbose = true;
    else if (v == nullptr) break;
    else if (k == "--sock-fd") a.sock_fd = std::atoi(argv[++i]);
    else if (k == "--dir") a.dir = argv[++i];
    else if (k == "--bundle") a.bundle = argv[++i];
    else if (k == "--images") a.images = argv[++i];
    else if (k == "--reaper") a.reaper = std::atoi(argv[++i]);
    else if (k == "--name") a.name = argv[++i];
    else if (k == "--workload-log") a.workload_log = argv[++i];
  }
  if (a.sock_fd < 0 || a.dir.empty() || a.bundle.empty() || a.images.empty() || a.reaper <= 0) {
    std::fprintf(stderr, "gpusnap __lazy-pages: internal; started by `gpusnap restore --lazy-pages` only\n");
    return 2;
  }
  ::prctl(PR_SET_NAME, "gpusnap-lazy");
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGCHLD, SIG_DFL);
  // Its end, or the daemon's, kills the tree: the kernel's OOM killer should pick neither.
  if (UniqueFd adj(::open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC)); adj.valid())
    (void)!::write(adj.get(), "-1000", 5);
  return Keeper(std::move(a)).Run();
}

}  // namespace gpusnap::criu
