#include "criu/operation.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>

#include "util/fd.h"
#include "util/files.h"

namespace gpusnap::criu {

Operation MakeOperation(const Bundle& bundle, criu_req_type type, criu_opts opts, pid_t ns_holder,
                        std::chrono::seconds timeout, std::string log_path) {
  Operation op;
  op.bundle = &bundle;
  op.type = type;
  op.inherit_fds = {opts.images_dir_fd(), opts.work_dir_fd()};
  op.opts = std::move(opts);
  op.ns_holder = ns_holder;
  op.timeout = timeout;
  op.log_path = std::move(log_path);
  return op;
}

Status CheckConfigFile(const std::string& path) {
  if (path.empty() || path[0] != '/')
    return Status::Error(Code::kInvalidArgument, "CRIU configuration file `{}` is not an absolute path", path);
  if (::access(path.c_str(), R_OK) != 0)
    return Status::Error(Code::kInvalidArgument, "CRIU configuration file `{}`: {}", path, Status::ErrnoText(errno));
  return Status::Ok();
}

Result<criu_resp> Run(const Operation& op) {
  if (op.opts.has_config_file()) GPUSNAP_RETURN_IF_ERROR(CheckConfigFile(op.opts.config_file()));
  std::vector<UniqueFd> cgroup_files;
  std::vector<int> cgroup_fds;
  for (const auto& path : op.join_cgroups) {
    cgroup_files.emplace_back(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!cgroup_files.back().valid()) return Status::Errno(errno, "opening `{}`", path);
    cgroup_fds.push_back(cgroup_files.back().get());
  }
  GPUSNAP_ASSIGN_OR_RETURN(auto swrk, Swrk::Start({.bundle = op.bundle,
                                                        .ns_holder = op.ns_holder,
                                                        .inherit_fds = op.inherit_fds,
                                                        .cgroup_procs_fds = cgroup_fds,
                                                        .ns_last_pid = op.ns_last_pid}));
  criu_req req;
  req.set_type(op.type);
  *req.mutable_opts() = op.opts;
  Status handler_status;
  auto notify = [&](const std::string& script, int pid) {
    Status st = op.on_notify ? op.on_notify(script, pid) : Status::Ok();
    if (!st.ok() && handler_status.ok()) handler_status = st;
    return st;
  };
  auto deadline = std::chrono::steady_clock::now() + op.timeout;
  auto resp = swrk.Call(req, deadline, notify);
  // How CRIU ended says what its answer may not. After an answer it exits on
  // its own (a little grace for an answer that came late); without one it is
  // told to go by the socket closing; one stopped at the deadline was killed
  // and is left to Swrk's destructor.
  std::optional<CriuExit> exit;
  auto now = std::chrono::steady_clock::now();
  if (resp.ok()) {
    exit = swrk.Wait(std::max(deadline, now + std::chrono::seconds(30)));
  } else if (resp.status().code() != Code::kTimeout) {
    swrk.Hangup();
    exit = swrk.Wait(now + std::chrono::seconds(5));
  }
  if (!handler_status.ok()) return handler_status;
  Status verdict = Verdict(op.type, resp, exit, op.timeout);
  if (verdict.ok()) return resp;
  if (verdict.code() != Code::kExternal) return verdict;
  std::string message = verdict.message();
  auto log = ReadFile(op.log_path);
  std::string lines = log.ok() ? ErrorLines(*log) : "";
  if (!lines.empty()) message += "\n" + lines;
  if (log.ok()) message += fmt::format("\n(CRIU log: {})", op.log_path);  // none when CRIU never ran
  return Status::Error(Code::kExternal, "{}", message);
}

std::string DescribeExit(const CriuExit& exit) {
  // 127: the launcher's exec of CRIU failed. It runs in the target's mount
  // namespace (a container's), where the bundle must be at the same path.
  if (exit.signal == 0 && exit.code == 127)
    return "could not be started (exit status 127): is the CRIU bundle visible at the same path inside the "
           "tree's mount namespace (a container's)?";
  if (exit.signal == 0) return fmt::format("exited with status {}", exit.code);
  const char* name = ::sigabbrev_np(exit.signal);
  return name ? fmt::format("was killed by signal {} (SIG{})", exit.signal, name)
              : fmt::format("was killed by signal {}", exit.signal);
}

Status Verdict(criu_req_type type, const Result<criu_resp>& response, const std::optional<CriuExit>& exit,
               std::chrono::seconds timeout) {
  const char* verb = type == DUMP ? "dump" : "restore";
  bool exited_0 = exit && exit->signal == 0 && exit->code == 0;
  bool exited_1 = exit && exit->signal == 0 && exit->code == 1;
  std::string ending = exit ? "CRIU " + DescribeExit(*exit) : "CRIU did not exit; it was stopped";
  if (!response.ok()) {
    if (response.status().code() == Code::kTimeout)
      return Status::Error(Code::kTimeout, "CRIU {} did not finish within {} s; it was stopped", verb, timeout.count());
    // Without an answer every ending says something, status 1 included.
    return Status::Error(Code::kExternal, "CRIU {} failed: {}; {}", verb, response.status().message(), ending);
  }
  if (!response->success()) {
    std::string why = response->has_cr_errno() && response->cr_errno() != 0
                          ? ": " + Status::ErrnoText(response->cr_errno())
                          : "";
    if (exited_1) return Status::Error(Code::kExternal, "CRIU {} failed{}", verb, why);
    return Status::Error(Code::kExternal, "CRIU {} failed{}; {}", verb, why, ending);
  }
  if (exited_0) return Status::Ok();
  if (!exit)
    return Status::Error(Code::kTimeout, "CRIU {} answered success but did not exit in time; it was stopped", verb);
  return Status::Error(Code::kExternal, "CRIU {} failed: it answered success, then {}", verb, ending);
}

}  // namespace gpusnap::criu
