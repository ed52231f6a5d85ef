// One CRIU dump or restore, start to finish: start `criu swrk` in the right
// namespace, send the request, answer its notifications, wait for it, and on
// failure explain with the Error lines of CRIU's own log.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "criu/bundle.h"
#include "criu/swrk.h"
#include "gpusnap/status.h"

namespace gpusnap::criu {

struct Operation {
  const Bundle* bundle = nullptr;  // REQUIRES: non-null
  criu_req_type type = DUMP;       // DUMP or RESTORE
  criu_opts opts;                  // from DumpOptions / RestoreOptions
  pid_t ns_holder = 0;
  int ns_last_pid = 0;             // a restore: where the namespace's next pids start (SwrkLaunch)
  std::vector<int> inherit_fds;    // the images and work directory fds in opts
  std::vector<std::string> join_cgroups;  // cgroup.procs files CRIU is moved into before it starts
  std::chrono::seconds timeout{600};
  std::string log_path;            // CRIU's log as gpusnap can read it
  NotifyHandler on_notify;
};

// The fields both directions fill alike.
Operation MakeOperation(const Bundle& bundle, criu_req_type type, criu_opts opts, pid_t ns_holder,
                        std::chrono::seconds timeout, std::string log_path);

// A CRIU configuration file CRIU will read: an absolute path (CRIU reads a
// relative one from its own working directory, /) to a readable file (CRIU
// skips one it cannot open without a word). kInvalidArgument otherwise,
// naming the path.
Status CheckConfigFile(const std::string& path);

// Refuses a configuration file in `op.opts` that CheckConfigFile refuses
// before starting CRIU.
// kExternal when CRIU reports failure, or reports success but then exits
// non-zero or dies by a signal: "CRIU <verb> failed: <its message>" (with how
// CRIU ended) followed by the Error lines of its log. kTimeout when it was
// stopped at the deadline. A notify handler's own failure is returned as is
// (it is the real cause).
Result<criu_resp> Run(const Operation& op);

// "exited with status 3", "was killed by signal 9 (SIGKILL)".
std::string DescribeExit(const CriuExit& exit);

// The verdict on one run from CRIU's final response (or why none came) and
// how its process ended (nullopt: it had not exited by the deadline), without
// the log's lines, which Run adds to a kExternal verdict. OK only when CRIU
// answered success and exited 0. CRIU ends a failed request with status 1,
// which goes unsaid; any other ending is told.
Status Verdict(criu_req_type type, const Result<criu_resp>& response, const std::optional<CriuExit>& exit,
               std::chrono::seconds timeout);

}  // namespace gpusnap::criu
