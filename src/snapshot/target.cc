#include "snapshot/target.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "gpusnap/workload.h"
#include "proc/proc.h"
#include "util/files.h"

namespace gpusnap {

namespace {

constexpr unsigned kPfKthread = 0x00200000;  // PF_KTHREAD, include/linux/sched.h

// The init (pid 1) of `pid`'s pid namespace, as the host sees it: the nearest
// ancestor whose innermost pid is 1.
Result<pid_t> NamespaceInit(pid_t pid) {
  uint64_t ns = proc::NamespaceId(pid, "pid");
  for (pid_t p = pid; p > 1;) {
    GPUSNAP_ASSIGN_OR_RETURN(auto nspids, proc::NsPids(p));
    if (!nspids.empty() && nspids.back() == 1 && proc::NamespaceId(p, "pid") == ns) return p;
    GPUSNAP_ASSIGN_OR_RETURN(auto st, proc::ReadStat(p));
    p = st.ppid;
  }
  return Status::Error(Code::kNotFound, "cannot find the init of pid {}'s namespace", pid);
}

Result<Target> FromPid(pid_t pid, std::string name) {
  GPUSNAP_ASSIGN_OR_RETURN(auto st, proc::ReadStat(pid));
  if (st.state == 'Z') return Status::Error(Code::kNotFound, "pid {} has exited (zombie)", pid);
  if (pid == ::getpid()) return Status::Error(Code::kFailedPrecondition, "pid {} is this gpusnap process", pid);
  // CRIU cannot dump a kernel thread, and would only say "No such process".
  if (st.flags & kPfKthread) {
    auto comm = ReadFile(fmt::format("/proc/{}/comm", pid));
    std::string what = comm.ok() ? comm->substr(0, comm->find('\n')) : "?";
    return Status::Error(Code::kFailedPrecondition,
                         "pid {} is a kernel thread ({}); only user processes can be checkpointed", pid, what);
  }
  GPUSNAP_ASSIGN_OR_RETURN(auto nspids, proc::NsPids(pid));
  Target t;
  t.name = std::move(name);
  t.host_pid = pid;
  t.ns_pid = nspids.back();
  if (pid == 1 || (nspids.size() > 1 && t.ns_pid == 1))
    return Status::Error(Code::kFailedPrecondition,
                         "pid {} is the init of its pid namespace; checkpoint the workload under it instead", pid);
  if (proc::NamespaceId(pid, "pid") != proc::NamespaceId(::getpid(), "pid")) {
    GPUSNAP_ASSIGN_OR_RETURN(t.ns_holder, NamespaceInit(pid));
  }
  t.tree = proc::Tree(pid);
  t.parent = st.ppid;
  t.cmdline = proc::Cmdline(pid);
  // A session led from outside the tree (a shell's job) needs CRIU's shell-job mode.
  t.shell_job = st.session != pid && std::find(t.tree.begin(), t.tree.end(), st.session) == t.tree.end();
  return t;
}

}  // namespace

pid_t InitToHoldDuringDump(const Target& target, bool leave_running) {
  if (leave_running || target.workload || target.ns_holder <= 1 || target.ns_holder != target.parent) return 0;
  return target.ns_holder;
}

Result<Target> ResolveTarget(const std::string& name_or_pid) {
  if (name_or_pid.empty()) return Status::Error(Code::kInvalidArgument, "no workload name or pid given");
  pid_t pid = 0;
  auto [end, ec] = std::from_chars(name_or_pid.data(), name_or_pid.data() + name_or_pid.size(), pid);
  bool numeric = ec == std::errc() && end == name_or_pid.data() + name_or_pid.size();
  if (numeric) {
    if (pid <= 0) return Status::Error(Code::kInvalidArgument, "invalid pid `{}`", name_or_pid);
    if (!proc::Exists(pid)) return Status::Error(Code::kNotFound, "no process with pid {}", pid);
    // A pid that gpusnap started keeps its workload's name and log.
    if (auto all = ListWorkloads(); all.ok())
      for (const auto& w : *all)
        if (w.running && w.pid == pid) return ResolveTarget(w.name);
    return FromPid(pid, "");
  }
  GPUSNAP_ASSIGN_OR_RETURN(auto w, FindWorkload(name_or_pid));
  if (!w.running) return Status::Error(Code::kNotFound, "workload `{}` (pid {}) is not running", w.name, w.pid);
  GPUSNAP_ASSIGN_OR_RETURN(auto t, FromPid(w.pid, w.name));
  t.workload = true;
  t.cmdline = w.cmdline;
  t.log = w.log;
  t.started = w.started;
  return t;
}

SnapshotMeta DescribeSource(const Target& target, const std::string& id, const std::string& criu_version,
                            bool tcp_established) {
  SnapshotMeta m;
  m.id = id;
  m.created = NowRfc3339();
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  m.hostname = host;
  struct utsname u{};
  if (::uname(&u) == 0) m.kernel = u.release;
  m.source.kind = target.name.empty() ? "pid" : "workload";
  m.source.name = target.name;
  m.source.host_pid = target.host_pid;
  m.source.ns_pid = target.ns_pid;
  m.source.cmdline = target.cmdline;
  m.source.log = target.log;
  m.criu_version = criu_version;
  m.tcp_established = tcp_established;
  m.shell_job = target.shell_job;
  m.pids.assign(target.tree.begin(), target.tree.end());
  return m;
}

}  // namespace gpusnap
