// `gpusnap restore --lazy-pages`: CRIU restores the tree with its private
// anonymous memory left to a `criu lazy-pages` daemon (criu/lazy_pages.h),
// which serves the pages the tree faults on and copies the rest in the
// background; the restore returns once the tree runs, before all of its
// memory is in.
//
// Missing memory must never run: once the daemon's userfaultfds close, a
// fault on a page it did not deliver is no longer caught (the tree would
// read zeros). So the daemon runs under a keeper (`gpusnap __lazy-pages`, not
// gpusnap's child: it outlives the restore) that lives until the daemon
// exits. A clean exit (every page delivered) is recorded and the keeper goes;
// any other ending (a non-zero status, a signal) makes it SIGKILL the
// restored tree (a fresh namespace as a whole through its reaper; in a
// placeholder, the processes restored into it), and write why into the
// workload's log, its own log and the state file `gpusnap ps` shows.
//
// Until the restore commits it (Commit, just before the workload is
// recorded) the keeper is held by a pipe, as the reaper is: a hold that
// closes without the commit (the restore failed, or gpusnap died) ends the
// daemon. A daemon that died before the commit fails the restore through its
// undo, which says so.
//
// Files, in the restore's work dir (<run dir>/lazy-pages/<name>-<pid>-<n>):
// CRIU's restore log, `lazy-pages.socket` (where the restore finds the
// daemon), `lazy-pages.log` (the daemon's), `keeper.log`, and `state`, one
// line: "serving: ...", "done: ..." or "failed: ...".
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>

#include "criu/bundle.h"
#include "gpusnap/status.h"
#include "util/fd.h"

namespace gpusnap::criu {

struct LazyPagesSpec {
  const Bundle* bundle = nullptr;        // REQUIRES: non-null
  std::string images_dir;                // REQUIRES: absolute, the snapshot's CRIU images
  std::string work_dir;                  // REQUIRES: absolute, exists; the restore's CRIU work dir too
  pid_t reaper_pid = 0;                  // REQUIRES: > 0, pid 1 of the namespace the tree is restored into
  bool into_container = false;           // that pid 1 is a placeholder's: kill only what was restored into it
  std::string workload_name;             // for the messages
  std::string workload_log;              // told why, should the tree be killed ("" for none)
  bool verbose = false;                  // the daemon's log at level 4
};

// The state file of a work dir, and its line ("" when there is none).
std::string LazyPagesStateFile(const std::string& work_dir);
std::string ReadLazyPagesState(const std::string& work_dir);

// A new work dir for one lazy restore of `name` under <run_dir>/lazy-pages
// (the workloads' run directory, gpusnap/workload.h's RunDir()).
Result<std::string> MakeLazyPagesWorkDir(const std::string& run_dir, const std::string& name);

class LazyPagesServer {
 public:
  // Starts the keeper and, under it, the daemon; returns once the daemon
  // listens on the work dir's socket. kExternal (with the Error lines of the
  // daemon's log) when it does not start.
  static Result<LazyPagesServer> Start(const LazyPagesSpec& spec);

  LazyPagesServer(LazyPagesServer&&) noexcept = default;
  LazyPagesServer& operator=(LazyPagesServer&&) noexcept = default;
  ~LazyPagesServer() { (void)Stop(); }

  // OK while the daemon serves or has delivered every page; kExternal with
  // why when it died (the keeper has killed the tree then). Waits up to
  // `wait` for the keeper's word on a daemon that died.
  Status Check(std::chrono::milliseconds wait = std::chrono::milliseconds(0));

  // CRIU's notifications while it restores (only a test hook acts on one).
  Status OnCriuNotify(const std::string& script);

  // The restore is whole: the daemon is the keeper's for good. kExternal when
  // it died before that (see Check); REQUIRES: not stopped.
  Status Commit();

  // The undo of Start before Commit: the daemon is stopped and the keeper
  // gone when it returns (it kills nothing of the tree: the restore's undo
  // does). Idempotent; nothing after Commit.
  Status Stop();

  pid_t daemon_pid() const { return daemon_pid_; }
  const std::string& work_dir() const { return work_dir_; }

 private:
  LazyPagesServer() = default;
  // The keeper's next line, waiting until `deadline`; "" at its end (EOF) or the deadline.
  std::string NextLine(std::chrono::steady_clock::time_point deadline, bool* eof);

  std::string work_dir_;
  pid_t daemon_pid_ = 0;
  UniqueFd status_;  // the keeper's lines
  UniqueFd hold_;    // ours: 'c' commits, closing without it abandons
  std::string buffered_;
  std::string failure_;  // the keeper's "failed" line, once read
};

// The keeper's main (argv after "__lazy-pages"). Exit status 0 when the
// daemon delivered every page (or the restore was abandoned), 1 otherwise.
int LazyPagesKeeperMain(int argc, char** argv);

}  // namespace gpusnap::criu
