// A CRIU process in service-worker mode (`criu swrk <fd>`), driven over its
// RPC socket (rpc.proto).
//
// CRIU runs inside the pid and mount namespace of a given holder process (the
// workload's reaper), because a tree is dumped from inside its own namespace
// and restored into a fresh one (docs/ARCHITECTURE.md, "Why CRIU runs inside
// the workload's namespace"). The RPC socket is created by the process that
// becomes CRIU, so CRIU's SO_PEERCRED lookup of the images directory fd
// (/proc/<peer>/fd/<n>) resolves to its own descriptor.
//
// Lifetime: the destructor kills a CRIU still running and reaps it.
// Thread-safety: one thread at a time.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "criu/bundle.h"
#include "gpusnap/status.h"
#include "rpc.pb.h"

namespace gpusnap::criu {

struct SwrkLaunch {
  const Bundle* bundle = nullptr;   // REQUIRES: non-null, outlives the Swrk
  pid_t ns_holder = 0;              // enter this pid's pid+mnt namespaces; 0 = stay
  std::vector<int> inherit_fds;     // descriptors CRIU must inherit, same numbers
  // Open cgroup.procs files CRIU joins before it starts (a restore into a
  // container: the tree it forks lands in the container's cgroups).
  std::vector<int> cgroup_procs_fds;
  // > 0 (a restore into ns_holder's namespace): its next pids start above this before CRIU
  // is forked into it, so that neither CRIU nor its helpers take a pid the
  // restored tree needs back ("Can't fork for <pid>: File exists"). Written
  // by gpusnap's privilege from inside the pid namespace, through the host's
  // /proc: a placeholder's init may lack the capability (CAP_SYS_ADMIN or
  // CAP_CHECKPOINT_RESTORE) and its /proc/sys is read-only in a container.
  int ns_last_pid = 0;
};

// Called for each notification (post-dump, post-restore, ...). CRIU waits for
// the answer: a non-OK status makes CRIU fail the operation and roll back.
using NotifyHandler = std::function<Status(const std::string& script, int pid)>;

// How CRIU's process ended: its exit code, or the signal that killed it.
struct CriuExit {
  int code = 0;    // when signal == 0
  int signal = 0;  // > 0: killed by it
};

// The launcher (CRIU's parent inside the namespace) exits with CRIU's exit
// code, or 128 + the signal that killed CRIU; this reads a launcher's wait
// status back into CRIU's ending. A launcher killed itself reads as killed.
CriuExit CriuExitFromLauncher(int launcher_wait_status);

class Swrk {
 public:
  static Result<Swrk> Start(const SwrkLaunch& launch);
  Swrk(Swrk&&) noexcept;
  Swrk& operator=(Swrk&&) = delete;
  ~Swrk();

  // Sends `req` and answers notifications until the final response or the
  // deadline. On timeout CRIU is killed (kTimeout). The response may report
  // failure (resp.success() false); the caller turns that into a Status with
  // the log's Error lines (ErrorLines below).
  Result<criu_resp> Call(const criu_req& req, std::chrono::steady_clock::time_point deadline,
                         const NotifyHandler& on_notify);

  // Closes the RPC socket: a CRIU still waiting on gpusnap rolls back and exits.
  void Hangup();

  // Waits for CRIU to exit, at most until `deadline`; nullopt when it has not
  // by then (the destructor then stops it) or was already waited for.
  std::optional<CriuExit> Wait(std::chrono::steady_clock::time_point deadline);

  pid_t host_pid() const { return criu_pid_; }

 private:
  Swrk() = default;
  int sock_ = -1;
  pid_t launcher_pid_ = -1;  // our child, which waits for CRIU
  pid_t criu_pid_ = -1;      // CRIU as the host sees it
};

// The `Error` lines of a CRIU log (at most `max`, the last ones), for error
// messages: CRIU's reason, not just "failed".
std::string ErrorLines(const std::string& log_text, size_t max = 6);

}  // namespace gpusnap::criu
