// A pid + mount namespace of its own, whose pid 1 is a small reaper (the
// gpusnap binary run as `gpusnap __reaper`).
//
// Why: CRIU dumps a tree cleanly from inside its own namespace and restores it
// into a fresh one without pid collisions (docs/ARCHITECTURE.md, "Why CRIU
// runs inside the workload's namespace").
// The namespace has a private /proc (CUDA needs it), and no descriptor from
// outside is left open inside it. Its inode is one that no CUDA socket name of
// a restored process still carries (ns/taken_namespace_inodes.h): a namespace
// given such an inode is given up and another made.
//
// Two uses:
//  - run: the reaper starts the workload as a session leader (pid 2) with
//    stdio on a log file, then reaps until the workload's tree is gone;
//  - hold: the reaper starts nothing and stays while the caller holds `hold`
//    open, so CRIU can restore a tree into the namespace. The caller commits
//    the tree (CommitHold) once it is whole; a hold that closes without that
//    (the restore failed, or gpusnap died) kills what the namespace holds.
//    Once `hold` closes and no child is left, the reaper exits and the
//    namespace with it.
// A container's placeholder (`gpusnap __placeholder`) is hold mode as a
// container's own pid 1, held by the container's lifetime instead of a pipe.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "gpusnap/status.h"
#include "util/fd.h"

namespace gpusnap::ns {

struct ReaperSpec {
  std::vector<std::string> workload_argv;  // empty: hold mode
  std::string log_path;                    // REQUIRES (run): absolute; opened for append
  std::string preload;                     // run: a library put first in the workload's LD_PRELOAD
};

struct SpawnedReaper {
  pid_t reaper_pid = 0;    // as the host sees it
  pid_t workload_pid = 0;  // as the host sees it; 0 in hold mode
  UniqueFd hold;           // hold mode only
};

inline constexpr char kHoldCommit = 'c';

// Tells a hold-mode reaper that the tree restored into its namespace is whole
// and stays, then lets go of the hold.
Status CommitHold(SpawnedReaper& reaper);

// Starts the namespace. The reaper is not our child: it outlives gpusnap.
// Errors: kNotFound when the workload's program cannot be executed (errno
// kept), kIoError when the log cannot be opened, kExternal otherwise.
Result<SpawnedReaper> SpawnReaper(const ReaperSpec& spec);

// The reaper's own main (argv after "__reaper"). Never returns on success.
int ReaperMain(int argc, char** argv);

// `gpusnap __placeholder` (argv after it): a container's pid 1 that holds its
// pid namespace for a later restore into it (restore's into_container). Hold
// mode without a caller: it reaps, stays when it has no children, and on
// SIGTERM kills its namespace and exits 0. Refuses to run unless it is pid 1
// (exit 2). It needs no privilege: the restore sets where the namespace's
// next pids start (criu/swrk.h, SwrkLaunch::ns_last_pid).
int PlaceholderMain(int argc, char** argv);

// Where the next pids of a namespace that CRIU restores into start (a
// restore's SwrkLaunch::ns_last_pid): far above the pids the tree needs back,
// so CRIU's own processes take none of them.
int HighNsLastPid();

}  // namespace gpusnap::ns
