#include "ns/enter.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <grp.h>
#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "proc/credentials.h"
#include "proc/proc.h"
#include "util/fd.h"
#include "util/files.h"

namespace gpusnap::ns {

namespace {

struct NsFile {
  const char* name;
  int type;
};
// The mount namespace last: entering it changes what paths mean.
constexpr NsFile kNamespaces[] = {{"ipc", CLONE_NEWIPC}, {"uts", CLONE_NEWUTS},       {"net", CLONE_NEWNET},
                                  {"cgroup", CLONE_NEWCGROUP}, {"pid", CLONE_NEWPID}, {"mnt", CLONE_NEWNS}};

// What the children report, in order: the command's pid (step 0), then only
// on failure a step and its errno; the pipe closing at exec says it ran.
struct Report {
  int step = 0;
  int value = 0;  // step 0: the command's pid in the container's namespace; else an errno
};
const char* const kSteps[] = {"",
                              "joining its cgroups",
                              "entering its namespaces",
                              "entering its root",
                              "entering its working directory",
                              "forking",
                              "taking the init's uid, gid and capabilities",
                              "exec"};

void ReportAndExit(int fd, int step) {
  Report r{step, errno == 0 ? EIO : errno};
  (void)!::write(fd, &r, sizeof r);
  _exit(127);
}

// Where argv[0] may be, by the PATH of the command's own environment (not
// gpusnap's), worked out before the fork: a child of a threaded process must
// not allocate.
std::vector<std::string> ExecCandidates(const std::string& command, const std::string& path) {
  if (command.find('/') != std::string::npos) return {command};
  std::string dirs = path.empty() ? "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" : path;
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    out.push_back((end == start ? std::string(".") : dirs.substr(start, end - start)) + "/" + command);
    start = end + 1;
  }
  return out;
}

// execvpe's search: the first error other than ENOENT is the one reported.
void Exec(const std::vector<const char*>& candidates, char* const* argv, char* const* envp) {
  int first_error = ENOENT;
  for (const char* candidate : candidates) {
    ::execve(candidate, argv, envp);
    if (errno != ENOENT && first_error == ENOENT) first_error = errno;
  }
  errno = first_error;
}

// Gives up the capabilities `cred` lacks, then takes its uid and gid, then
// its capability sets and no_new_privs: a child of a threaded process, so
// raw syscalls only. False, errno set, on a refusal.
bool TakeCredentials(const proc::Credentials& cred, int last_cap) {
  for (int cap = 0; cap <= last_cap && cap < 64; ++cap)
    if (!(cred.cap_bounding >> cap & 1) && ::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
      return false;
  if (::setgroups(0, nullptr) != 0 || ::setgid(cred.gid) != 0 || ::setuid(cred.uid) != 0) return false;
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  for (int i = 0; i < 2; ++i) {
    data[i].effective = static_cast<uint32_t>(cred.cap_effective >> (32 * i));
    data[i].permitted = static_cast<uint32_t>(cred.cap_permitted >> (32 * i));
    data[i].inheritable = static_cast<uint32_t>(cred.cap_inheritable >> (32 * i));
  }
  if (::syscall(SYS_capset, &header, data) != 0) return false;
  return !cred.no_new_privs || ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0;
}

}  // namespace

Result<pid_t> SpawnInContainer(const ContainerCommand& c) {
  if (c.argv.empty()) return Status::Error(Code::kInvalidArgument, "no command to start in the container");
  std::string proc = fmt::format("/proc/{}", c.init);
  if (proc::NamespaceId(c.init, "user") != proc::NamespaceId(::getpid(), "user"))
    return Status::Error(Code::kNotSupported,
                         "the container of pid {} runs in a user namespace of its own: a rootfs restore does not "
                         "start commands in one",
                         c.init);
  // Everything the child needs is opened here, while host paths still mean the host's.
  std::vector<std::pair<UniqueFd, int>> namespaces;
  for (const auto& n : kNamespaces) {
    std::string path = fmt::format("{}/ns/{}", proc, n.name);
    if (proc::NamespaceId(c.init, n.name) == proc::NamespaceId(::getpid(), n.name)) continue;
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return Status::Errno(errno, "opening `{}`", path);
    namespaces.emplace_back(std::move(fd), n.type);
  }
  UniqueFd root(::open((proc + "/root").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return Status::Errno(errno, "opening the root of pid {}", c.init);
  std::vector<UniqueFd> cgroups;
  for (const auto& f : c.cgroup_procs) {
    UniqueFd fd(::open(f.c_str(), O_WRONLY | O_CLOEXEC));
    if (!fd.valid()) return Status::Errno(errno, "opening `{}`", f);
    cgroups.push_back(std::move(fd));
  }
  UniqueFd out(::open((proc + "/fd/1").c_str(), O_WRONLY | O_CLOEXEC));
  UniqueFd err(::open((proc + "/fd/2").c_str(), O_WRONLY | O_CLOEXEC));
  UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
  GPUSNAP_ASSIGN_OR_RETURN(proc::Credentials cred, proc::ReadTaskCredentials(c.init, c.init));
  int last_cap = 40;
  if (auto text = ReadFile("/proc/sys/kernel/cap_last_cap"); text.ok()) last_cap = std::atoi(text->c_str());
  std::vector<char*> argv, envp;
  for (const auto& a : c.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::string path_var;
  for (const auto& e : c.env) {
    envp.push_back(const_cast<char*>(e.c_str()));
    if (e.rfind("PATH=", 0) == 0) path_var = e.substr(5);
  }
  envp.push_back(nullptr);
  std::vector<std::string> candidates = ExecCandidates(c.argv[0], path_var);
  std::vector<const char*> candidate_ptrs;
  for (const auto& cand : candidates) candidate_ptrs.push_back(cand.c_str());
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return Status::Errno(errno, "pipe2");
  UniqueFd report_read(pipe_fds[0]), report_write(pipe_fds[1]);

  pid_t middle = ::fork();
  if (middle < 0) return Status::Errno(errno, "fork");
  if (middle == 0) {
    // The middle child joins everything; its child, the first task of the
    // container's pid namespace here, forks the command and exits: orphans
    // go to the reaper of their parent's namespace, so the command's parent
    // becomes the container's init.
    int w = report_write.get();
    for (const auto& fd : cgroups)
      if (::write(fd.get(), "0", 1) != 1) ReportAndExit(w, 1);
    for (const auto& [fd, type] : namespaces)
      if (::setns(fd.get(), type) != 0) ReportAndExit(w, 2);
    if (::fchdir(root.get()) != 0 || ::chroot(".") != 0) ReportAndExit(w, 3);
    if (::chdir(c.cwd.c_str()) != 0) ReportAndExit(w, 4);
    pid_t inner = ::fork();
    if (inner < 0) ReportAndExit(w, 5);
    if (inner == 0) {
      pid_t command = ::fork();
      if (command < 0) ReportAndExit(w, 5);
      if (command == 0) {
        ::setsid();
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        int in = null.valid() ? null.get() : -1;
        if (in >= 0) ::dup2(in, 0);
        ::dup2(out.valid() ? out.get() : in, 1);
        ::dup2(err.valid() ? err.get() : in, 2);
        if (!TakeCredentials(cred, last_cap)) ReportAndExit(w, 6);
        Exec(candidate_ptrs, argv.data(), envp.data());
        ReportAndExit(w, 7);
      }
      Report forked{0, command};  // its pid in the container's namespace
      (void)!::write(w, &forked, sizeof forked);
      _exit(0);
    }
    int inner_status = 0;
    while (::waitpid(inner, &inner_status, 0) < 0 && errno == EINTR) {
    }
    _exit(0);
  }
  report_write.Reset();
  int wstatus = 0;
  while (::waitpid(middle, &wstatus, 0) < 0 && errno == EINTR) {
  }
  auto next = [&report_read]() -> std::optional<Report> {
    Report r;
    ssize_t n;
    while ((n = ::read(report_read.get(), &r, sizeof r)) < 0 && errno == EINTR) {
    }
    if (n != static_cast<ssize_t>(sizeof r)) return std::nullopt;
    return r;
  };
  std::optional<Report> report = next();
  if (report && report->step == 0) {
    pid_t ns_pid = report->value;
    report = next();
    if (!report) return proc::WaitForNsPid(c.init, ns_pid);
  }
  if (!report)
    return Status::Error(Code::kInternal, "starting `{}` in the container of pid {}: the child ended without a word",
                         c.argv[0], c.init);
  int step = report->step > 0 && report->step < static_cast<int>(std::size(kSteps)) ? report->step : 0;
  return Status::Error(Code::kFailedPrecondition, "starting `{}` in the container of pid {}: {} failed: {}", c.argv[0],
                       c.init, kSteps[step], std::strerror(report->value));
}

}  // namespace gpusnap::ns
