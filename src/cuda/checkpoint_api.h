// The CUDA driver's checkpoint API over many pids at once, driven from this
// one process with one cuInit (the Driver's).
//
// Every action runs the phases of plan.h: in each phase every pid gets its own
// thread, and a phase starts only when the previous one has finished for every
// pid. Before the first phase the state of every pid is queried; if one is in a
// state that does not fit the action, nothing is done to any pid.
//
// All or nothing where the driver allows it:
//  - a failed lock unlocks the pids this call locked (lock, suspend);
//  - a failed checkpoint restores the pids this call checkpointed (checkpoint),
//    and then unlocks every pid (suspend);
//  - a failed restore undoes nothing and unlocks nothing (resume): peers
//    must never run without each other; the report says where each pid is;
//  - a failed unlock is reported; the unlocked pids keep running.
//
// Messages name the action, the pid and the CUresult
// ("lock pid 4711: CUDA_ERROR_NOT_SUPPORTED (801)"); the rolled-back pids and
// every pid's state afterwards are appended.
//
// Thread-safety: each call is independent; calls on the same pids from several
// threads at once race in the driver, as they would from several processes.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cuda/driver.h"
#include "cuda/gpu_map.h"
#include "cuda/names.h"
#include "cuda/plan.h"
#include "gpusnap/status.h"

namespace gpusnap::cuda {

inline constexpr int kDefaultLockTimeoutMs = 10000;

struct ActionArgs {
  // cuCheckpointProcessLock's timeoutMs for every pid (concurrently, so the
  // whole lock phase takes about this long at most). 0: wait forever.
  int lock_timeout_ms = kDefaultLockTimeoutMs;
  // Restore onto other GPUs (TranslateGpuMap). Empty: the same GPUs.
  // Non-empty needs Driver::SupportsGpuRemap(), else kNotSupported.
  GpuMap gpu_map;
};

struct PidReport {
  pid_t pid = 0;
  Status status;                       // this pid's own failure, OK if none
  std::optional<ProcessState> state;   // after the action; re-queried after a failure
  int restore_tid = 0;                 // Action::kRestoreTid only
  bool rolled_back = false;            // what this call did to it was undone
  double seconds = 0;                  // time spent in driver calls for this pid
};

struct [[nodiscard]] Report {
  // OK iff every pid went through the whole action. Otherwise the code of the
  // first failing pid (kExternal, kNotSupported for 801, kTimeout for a lock
  // timeout, kFailedPrecondition for a state that does not fit, kInvalidArgument
  // for bad pids) and a message covering every pid.
  Status status;
  std::vector<PidReport> pids;              // in the order given
  std::map<std::string, double> timings_s;  // "state", "lock", "checkpoint", "restore", "unlock", "rollback", "total"
  bool ok() const { return status.ok(); }
};

// Runs `action` on `pids`. REQUIRES: `driver` loaded. Errors (in
// Report::status): kInvalidArgument for an empty list, a pid <= 0 or a pid
// given twice (nothing is done); see Report for the rest.
Report RunAction(const Driver& driver, Action action, std::span<const pid_t> pids, const ActionArgs& args = {});

// The same, one entry point per action (what checkpoint and restore call).
Report StateAll(const Driver& driver, std::span<const pid_t> pids);
Report RestoreThreadIds(const Driver& driver, std::span<const pid_t> pids);
Report LockAll(const Driver& driver, std::span<const pid_t> pids, int timeout_ms);
Report CheckpointAll(const Driver& driver, std::span<const pid_t> pids);
Report RestoreAll(const Driver& driver, std::span<const pid_t> pids, const GpuMap& gpu_map);
Report UnlockAll(const Driver& driver, std::span<const pid_t> pids);
Report SuspendAll(const Driver& driver, std::span<const pid_t> pids, int timeout_ms);  // lock all, checkpoint all
Report ResumeAll(const Driver& driver, std::span<const pid_t> pids, const GpuMap& gpu_map);  // restore all, unlock all

// One pid, one query. Errors: kExternal/kNotSupported naming the pid and CUresult.
Result<ProcessState> GetState(const Driver& driver, pid_t pid);
Result<int> RestoreThreadId(const Driver& driver, pid_t pid);

}  // namespace gpusnap::cuda
