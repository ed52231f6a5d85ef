#include "snapshot/target.h"

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include "container/cgroup.h"
#include "gpusnap/workload.h"
#include "proc/proc.h"
#include "util/clock.h"
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

TargetSpec TargetSpec::Workload(std::string name) {
  TargetSpec spec;
  spec.workload = std::move(name);
  return spec;
}

TargetSpec TargetSpec::Pid(pid_t pid) {
  TargetSpec spec;
  spec.kind = Kind::kPid;
  spec.pid = pid;
  return spec;
}

TargetSpec TargetSpec::Container(std::string id) {
  TargetSpec spec;
  spec.kind = Kind::kContainer;
  spec.container = std::move(id);
  return spec;
}

TargetSpec TargetSpec::Pod(container::PodRef pod) {
  TargetSpec spec;
  spec.kind = Kind::kPod;
  spec.pod = std::move(pod);
  return spec;
}

std::string TargetSpec::ToString() const {
  switch (kind) {
    case Kind::kWorkload: return workload;
    case Kind::kPid: return std::to_string(pid);
    case Kind::kContainer: return container;
    case Kind::kPod: return fmt::format("{}/{}/{}", pod.namespace_name, pod.name, pod.container);
  }
  return "";
}

Result<TargetSpec> ParseTargetArgument(std::string_view text,
                                       const std::function<bool(std::string_view)>& is_workload) {
  if (text.empty()) return Status::Error(Code::kInvalidArgument, "no workload name, pid or container id given");
  bool digits = std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (digits) {
    pid_t pid = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), pid);
    if (ec != std::errc() || end != text.data() + text.size() || pid <= 0)
      return Status::Error(Code::kInvalidArgument, "invalid pid `{}`", text);
    return TargetSpec::Pid(pid);
  }
  bool hex = std::all_of(text.begin(), text.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  if (hex && text.size() >= 12 && text.size() <= 64 && !(is_workload && is_workload(text)))
    return TargetSpec::Container(std::string(text));
  GPUSNAP_RETURN_IF_ERROR(CheckWorkloadName(text));
  return TargetSpec::Workload(std::string(text));
}

std::string SnapshotIdPrefix(const Target& target) {
  if (!target.name.empty()) return target.name;
  if (!target.container_id.empty()) return "ctr-" + target.container_id.substr(0, 12);
  return "pid" + std::to_string(target.host_pid);
}

Result<Target> ResolveTarget(const TargetSpec& spec, const std::string& kubelet_log_dir) {
  pid_t pid = spec.pid;
  std::string container_id;
  switch (spec.kind) {
    case TargetSpec::Kind::kWorkload: {
      GPUSNAP_ASSIGN_OR_RETURN(auto w, FindWorkload(spec.workload));
      if (!w.running) return Status::Error(Code::kNotFound, "workload `{}` (pid {}) is not running", w.name, w.pid);
      GPUSNAP_ASSIGN_OR_RETURN(auto t, FromPid(w.pid, w.name));
      t.workload = true;
      t.cmdline = w.cmdline;
      t.log = w.log;
      t.started = w.started;
      return t;
    }
    case TargetSpec::Kind::kPid:
      if (pid <= 0) return Status::Error(Code::kInvalidArgument, "invalid pid `{}`", pid);
      if (!proc::Exists(pid)) return Status::Error(Code::kNotFound, "no process with pid {}", pid);
      // A pid that gpusnap started keeps its workload's name and log.
      if (auto all = ListWorkloads(); all.ok())
        for (const auto& w : *all)
          if (w.running && w.pid == pid) return ResolveTarget(TargetSpec::Workload(w.name));
      break;
    case TargetSpec::Kind::kContainer:
    case TargetSpec::Kind::kPod: {
      // A container's tree: the one child of its init.
      std::vector<container::NodeProcess> processes = container::ScanProcesses();
      auto id = spec.kind == TargetSpec::Kind::kPod
                    ? container::ContainerIdOfPod(kubelet_log_dir, spec.pod, processes)
                    : container::ExpandContainerId(processes, spec.container);
      if (!id.ok()) return id.status();
      container_id = *id;
      GPUSNAP_ASSIGN_OR_RETURN(pid, container::ContainerTreeRoot(processes, container_id));
      break;
    }
  }
  GPUSNAP_ASSIGN_OR_RETURN(Target t, FromPid(pid, ""));
  t.container_id = container_id;
  if (t.container_id.empty())
    if (auto cg = ReadFile(fmt::format("/proc/{}/cgroup", pid)); cg.ok())
      t.container_id = container::ParseProcCgroup(*cg).container_id;
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
