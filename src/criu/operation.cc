#include "criu/operation.h"

#include <fcntl.h>
#include <unistd.h>

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
  const char* verb = op.type == DUMP ? "dump" : "restore";
  if (op.opts.has_config_file()) GPUSNAP_RETURN_IF_ERROR(CheckConfigFile(op.opts.config_file()));
  std::vector<UniqueFd> cgroup_files;
  std::vector<int> cgroup_fds;
  for (const auto& path : op.join_cgroups) {
    cgroup_files.emplace_back(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
    if (!cgroup_files.back().valid()) return Status::Errno(errno, "opening `{}`", path);
    cgroup_fds.push_back(cgroup_files.back().get());
  }
  GPUSNAP_ASSIGN_OR_RETURN(auto swrk, Swrk::Start({op.bundle, op.ns_holder, op.inherit_fds, cgroup_fds}));
  criu_req req;
  req.set_type(op.type);
  *req.mutable_opts() = op.opts;
  Status handler_status;
  auto notify = [&](const std::string& script, int pid) {
    Status st = op.on_notify ? op.on_notify(script, pid) : Status::Ok();
    if (!st.ok() && handler_status.ok()) handler_status = st;
    return st;
  };
  auto resp = swrk.Call(req, std::chrono::steady_clock::now() + op.timeout, notify);
  int exit_status = resp.ok() ? swrk.Wait() : -1;
  (void)exit_status;
  if (!handler_status.ok()) return handler_status;
  auto explain = [&](std::string head) {
    auto log = ReadFile(op.log_path);
    std::string lines = log.ok() ? ErrorLines(*log) : "";
    if (!lines.empty()) head += "\n" + lines;
    head += fmt::format("\n(CRIU log: {})", op.log_path);
    return Status::Error(Code::kExternal, "{}", head);
  };
  if (!resp.ok()) {
    if (resp.status().code() == Code::kTimeout)
      return Status::Error(Code::kTimeout, "CRIU {} did not finish within {} s; it was stopped", verb, op.timeout.count());
    return explain(fmt::format("CRIU {} failed: {}", verb, resp.status().message()));
  }
  if (!resp->success()) {
    std::string why = resp->has_cr_errno() && resp->cr_errno() != 0 ? ": " + Status::ErrnoText(resp->cr_errno()) : "";
    return explain(fmt::format("CRIU {} failed{}", verb, why));
  }
  return resp;
}

}  // namespace gpusnap::criu
