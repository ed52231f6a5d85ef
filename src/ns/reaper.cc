#include "ns/reaper.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "ns/taken_namespace_inodes.h"
#include "proc/proc.h"
#include "util/child_fds.h"
#include "util/files.h"

namespace gpusnap::ns {

namespace {

// Status lines on the pipe from the namespace to SpawnReaper:
//   reaper <host pid>          (from the intermediate child)
//   workload <ns pid>          (from the reaper: the workload was exec'd)
//   ready                      (hold mode)
//   error <errno> <what>       (from either)
void Report(int fd, const char* text) {
  if (fd >= 0) (void)!::write(fd, text, std::strlen(text));
}

// The verdict on a new namespace's inode (kept, or given up for another),
// and the intermediate child's exit when it is given up.
constexpr char kKeepNamespace = 'k';
constexpr char kGiveUpNamespace = 'r';
constexpr int kNamespaceGivenUp = 3;
constexpr int kNamespaceAttempts = 64;

// `size` bytes from `fd`, or false (EOF or an error first).
bool ReadFull(int fd, void* out, size_t size) {
  auto* p = static_cast<char*>(out);
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void ReportError(int fd, const char* what, int err) {
  char line[256];
  std::snprintf(line, sizeof line, "error %d %s\n", err, what);
  Report(fd, line);
}

[[noreturn]] void RunWorkload(char** argv, const char* log_path, const char* preload, int errpipe) {
  ::setsid();
  if (preload != nullptr) {
    // In front of anything the caller preloads already: the shim must see cuInit first.
    const char* old = ::getenv("LD_PRELOAD");
    std::string value = old && *old ? std::string(preload) + ":" + old : preload;
    ::setenv("LD_PRELOAD", value.c_str(), 1);
  }
  int log = ::open(log_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
  int null = ::open("/dev/null", O_RDONLY);
  if (log < 0 || null < 0) {
    int err = errno;
    (void)!::write(errpipe, &err, sizeof err);
    _exit(126);
  }
  ::dup2(null, 0);
  ::dup2(log, 1);
  ::dup2(log, 2);
  // Nothing from gpusnap may leak into the workload: CRIU would have to dump it.
  ::syscall(SYS_close_range, 3u, ~0u, CLOSE_RANGE_CLOEXEC);
  ::fcntl(errpipe, F_SETFD, FD_CLOEXEC);
  ::signal(SIGCHLD, SIG_DFL);
  ::execvp(argv[0], argv);
  int err = errno;
  (void)!::write(errpipe, &err, sizeof err);
  _exit(127);
}

// True when no process but us (pid 1) is left in the namespace. CRIU enters
// the namespace to dump or restore without being our child: the namespace
// must outlive it, or its death would kill CRIU mid-operation.
bool AloneInNamespace() {
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return true;
  bool alone = true;
  while (dirent* e = ::readdir(d)) {
    int pid = std::atoi(e->d_name);
    if (pid > 1) {
      alone = false;
      break;
    }
  }
  ::closedir(d);
  return alone;
}

void KillNamespace(int) {
  // As pid 1 we get only signals we handle; a stop request ends the whole tree.
  ::kill(-1, SIGKILL);
  _exit(0);
}

// Reaps until nothing is left. While `hold_fd` is open (hold mode), or
// always with `stay_when_alone` (a placeholder), an empty namespace is
// expected: CRIU has not restored the tree into it yet. In hold mode the
// holder commits what it restored with one byte (kHoldCommit) before it lets
// go; a hold that ends without it means the restore failed or its process
// died mid-way, and whatever of the tree is here goes.
int Reap(int hold_fd, bool stay_when_alone) {
  bool committed = false;
  for (;;) {
    int wstatus;
    // Held, reaping must not keep the hold from being watched.
    pid_t p = ::waitpid(-1, &wstatus, hold_fd >= 0 ? WNOHANG : 0);
    if (p > 0 || (p < 0 && errno == EINTR)) continue;
    if (hold_fd < 0 && !stay_when_alone && AloneInNamespace()) return 0;
    pollfd pfd{hold_fd, POLLIN, 0};
    if (::poll(&pfd, hold_fd >= 0 ? 1 : 0, 100) > 0) {
      char c;
      ssize_t n = ::read(hold_fd, &c, 1);
      if (n == 1 && c == kHoldCommit) committed = true;
      if (n <= 0) {
        ::close(hold_fd);
        hold_fd = -1;
        if (!committed) ::kill(-1, SIGKILL);  // every process of the namespace but this one
      }
    }
  }
}

// A caller's blocked or ignored signals survive fork and exec (the agent
// blocks SIGTERM for its sigwait, and ignores SIGPIPE): pid 1 of a namespace,
// and the workload it starts, begin with none of them.
void ResetSignals() {
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int sig : {SIGPIPE, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCHLD}) ::signal(sig, SIG_DFL);
}

}  // namespace

int ReaperMain(int argc, char** argv) {
  int status_fd = -1, hold_fd = -1;
  const char* log_path = "/dev/null";
  const char* preload = nullptr;
  int i = 0;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--status-fd" && i + 1 < argc) status_fd = std::atoi(argv[++i]);
    else if (a == "--hold-fd" && i + 1 < argc) hold_fd = std::atoi(argv[++i]);
    else if (a == "--log" && i + 1 < argc) log_path = argv[++i];
    else if (a == "--preload" && i + 1 < argc) preload = argv[++i];
    else if (a == "--") { ++i; break; }
  }
  ::prctl(PR_SET_NAME, "gpusnap-reaper");
  ResetSignals();
  ::signal(SIGTERM, KillNamespace);
  ::signal(SIGINT, KillNamespace);
  if (i < argc) {
    int errpipe[2];
    if (::pipe2(errpipe, O_CLOEXEC) != 0) {
      ReportError(status_fd, "pipe", errno);
      return 1;
    }
    pid_t w = ::fork();
    if (w < 0) {
      ReportError(status_fd, "fork", errno);
      return 1;
    }
    if (w == 0) RunWorkload(argv + i, log_path, preload, errpipe[1]);
    ::close(errpipe[1]);
    int err = 0;
    if (::read(errpipe[0], &err, sizeof err) == sizeof err) {
      ReportError(status_fd, argv[i], err);
      ::waitpid(w, nullptr, 0);
      return 1;
    }
    ::close(errpipe[0]);
    char line[64];
    std::snprintf(line, sizeof line, "workload %d\n", w);
    Report(status_fd, line);
  } else {
    Report(status_fd, "ready\n");
  }
  if (status_fd >= 0) ::close(status_fd);

  return Reap(hold_fd, /*stay_when_alone=*/false);
}

int PlaceholderMain(int argc, char** argv) {
  if (argc > 0) {
    std::fprintf(stderr, "gpusnap __placeholder: unexpected argument `%s`; it takes none\n", argv[0]);
    return 2;
  }
  // KillNamespace signals every process we can see: only safe as a pid 1.
  if (::getpid() != 1) {
    std::fprintf(stderr, "gpusnap __placeholder: must be pid 1 of its own pid namespace (a container's process)\n");
    return 2;
  }
  ::prctl(PR_SET_NAME, "gpusnap-holder");
  ResetSignals();
  ::signal(SIGTERM, KillNamespace);
  ::signal(SIGINT, KillNamespace);
  return Reap(-1, /*stay_when_alone=*/true);
}

int HighNsLastPid() {
  auto text = ReadFile("/proc/sys/kernel/pid_max");
  int pid_max = text.ok() ? std::atoi(text->c_str()) : 32768;
  return pid_max > 200000 ? 100000 : pid_max / 2;
}

Result<SpawnedReaper> SpawnReaper(const ReaperSpec& spec) {
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec) return Status::Errno(ec.value(), "finding the gpusnap binary");

  int status_pipe[2], hold_pipe[2] = {-1, -1};
  if (::pipe2(status_pipe, O_CLOEXEC) != 0) return Status::Errno(errno, "pipe");
  UniqueFd status_rd(status_pipe[0]), status_wr(status_pipe[1]);
  UniqueFd hold_rd, hold_wr;
  bool hold_mode = spec.workload_argv.empty();
  if (hold_mode) {
    if (::pipe2(hold_pipe, O_CLOEXEC) != 0) return Status::Errno(errno, "pipe");
    hold_rd.Reset(hold_pipe[0]);
    hold_wr.Reset(hold_pipe[1]);
  }

  std::vector<std::string> args{self, "__reaper", "--status-fd", std::to_string(status_wr.get())};
  if (hold_mode) {
    args.insert(args.end(), {"--hold-fd", std::to_string(hold_rd.get())});
  } else {
    if (!spec.preload.empty()) args.insert(args.end(), {"--preload", spec.preload});
    args.insert(args.end(), {"--log", spec.log_path, "--"});
    args.insert(args.end(), spec.workload_argv.begin(), spec.workload_argv.end());
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int keep_status = status_wr.get(), keep_hold = hold_rd.get();

  // The verdict on each new namespace: one whose inode a CUDA socket name
  // still carries is given up (held open meanwhile, so that the next one gets
  // another inode) and another made (ns/taken_namespace_inodes.h). The kernel
  // shows a pid namespace only once its first process exists, so the
  // intermediate child names the reaper, which waits for the verdict before
  // it mounts anything or runs.
  int candidate_pipe[2], verdict_pipe[2];
  if (::pipe2(candidate_pipe, O_CLOEXEC) != 0) return Status::Errno(errno, "pipe");
  UniqueFd candidate_rd(candidate_pipe[0]), candidate_wr(candidate_pipe[1]);
  if (::pipe2(verdict_pipe, O_CLOEXEC) != 0) return Status::Errno(errno, "pipe");
  UniqueFd verdict_rd(verdict_pipe[0]), verdict_wr(verdict_pipe[1]);
  int keep_candidate = candidate_wr.get(), keep_verdict = verdict_rd.get();
  std::vector<UniqueFd> given_up;  // closed once a namespace is kept
  pid_t mid = -1;
  for (int attempt = 1;; ++attempt) {
    mid = ::fork();
    if (mid < 0) return Status::Errno(errno, "fork");
    if (mid == 0) {
      // Only async-signal-safe calls from here: the parent may have threads.
      int go[2];
      if (::unshare(CLONE_NEWPID | CLONE_NEWNS) != 0 || ::pipe2(go, O_CLOEXEC) != 0) {
        ReportError(keep_status, "unshare(CLONE_NEWPID|CLONE_NEWNS)", errno);
        _exit(1);
      }
      pid_t reaper = ::fork();
      if (reaper < 0) {
        ReportError(keep_status, "fork", errno);
        _exit(1);
      }
      if (reaper == 0) {
        ::close(go[1]);
        char verdict = 0;
        if (::read(go[0], &verdict, 1) != 1 || verdict != kKeepNamespace) _exit(kNamespaceGivenUp);
        ::setsid();
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
            ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0) {
          ReportError(keep_status, "mounting /proc in the new namespace", errno);
          _exit(1);
        }
        DetachStdio(-1, {keep_status, keep_hold});
        ::execv(argv[0], argv.data());
        ReportError(keep_status, "exec of the reaper", errno);
        _exit(1);
      }
      (void)!::write(keep_candidate, &reaper, sizeof reaper);
      char verdict = 0;
      if (::read(keep_verdict, &verdict, 1) != 1 || verdict != kKeepNamespace) {
        ::kill(reaper, SIGKILL);
        ::waitpid(reaper, nullptr, 0);
        _exit(kNamespaceGivenUp);
      }
      (void)!::write(go[1], &verdict, 1);
      char line[64];
      std::snprintf(line, sizeof line, "reaper %d\n", reaper);
      Report(keep_status, line);
      _exit(0);
    }
    pid_t candidate = 0;
    if (ReadFull(candidate_rd.get(), &candidate, sizeof candidate) && attempt < kNamespaceAttempts) {
      std::string ns_path = "/proc/" + std::to_string(candidate) + "/ns/pid";
      UniqueFd ns(::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC));
      struct stat st{};
      auto sockets = ReadFile("/proc/net/unix");
      if (ns.valid() && ::fstat(ns.get(), &st) == 0 && sockets.ok() &&
          NamespaceInodesInCudaSocketNames(*sockets).contains(st.st_ino)) {
        given_up.push_back(std::move(ns));
        (void)!::write(verdict_wr.get(), &kGiveUpNamespace, 1);
        ::waitpid(mid, nullptr, 0);
        continue;
      }
    }
    // Free, or still taken after every attempt: then the workload may meet
    // the name at cuInit, as it would have without the check.
    (void)!::write(verdict_wr.get(), &kKeepNamespace, 1);
    break;
  }
  status_wr.Reset();
  hold_rd.Reset();
  ::waitpid(mid, nullptr, 0);

  std::string text;
  char buf[512];
  for (;;) {
    ssize_t n = ::read(status_rd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  SpawnedReaper out;
  int ns_workload = 0;
  bool ready = false;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    if (word == "reaper") {
      in >> out.reaper_pid;
    } else if (word == "workload") {
      in >> ns_workload;
    } else if (word == "ready") {
      ready = true;
    } else if (word == "error") {
      int err = 0;
      std::string what;
      in >> err;
      std::getline(in, what);
      if (!what.empty() && what[0] == ' ') what.erase(0, 1);
      if (!hold_mode && what == spec.workload_argv[0])
        return Status::Errno(err, "cannot start `{}`", what);
      return Status::Errno(err, "starting the workload's namespace ({})", what);
    }
  }
  if (out.reaper_pid <= 0 || (!ready && ns_workload <= 0))
    return Status::Error(Code::kExternal, "the workload's namespace did not start (status: `{}`)", text);
  if (!hold_mode) {
    // The workload is the reaper's only child; find its host pid.
    for (int tries = 0; tries < 200 && out.workload_pid == 0; ++tries) {
      for (pid_t c : proc::Children(out.reaper_pid)) out.workload_pid = c;
      if (out.workload_pid == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (out.workload_pid == 0)
      return Status::Error(Code::kExternal, "the workload exited immediately; see its log `{}`", spec.log_path);
  }
  out.hold = std::move(hold_wr);
  return out;
}

Status CommitHold(SpawnedReaper& reaper) {
  if (!reaper.hold.valid()) return Status::Ok();
  char c = kHoldCommit;
  ssize_t n;
  do {
    n = ::write(reaper.hold.get(), &c, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1) return Status::Errno(errno, "committing the restored tree to its reaper {}", reaper.reaper_pid);
  reaper.hold.Reset();
  return Status::Ok();
}

}  // namespace gpusnap::ns
