// The actions of `gpusnap cuda` and the order in which they drive the driver.
// Pure: the ordering rules (docs/CUDA.md, "The ordering rules, and why") are
// decided and tested here, and src/cuda/checkpoint_api.cc only executes them.
//
// An action is a list of phases. A phase is one driver call (an Op) for every
// pid at once; the next phase starts only after the current one has finished
// for every pid. So all pids are locked before any is checkpointed, and all
// are restored before any is unlocked: NCCL peers never run without each other.
#pragma once

#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cuda/names.h"
#include "gpusnap/status.h"

namespace gpusnap::cuda {

enum class Action { kState, kRestoreTid, kLock, kCheckpoint, kRestore, kUnlock, kSuspend, kResume };

// One driver call for one pid.
enum class Op { kGetState, kGetRestoreTid, kLock, kCheckpoint, kRestore, kUnlock };

struct ActionInfo {
  Action action;
  const char* name;  // as typed: "restore-tid"
  const char* help;  // one line
};
// Every action, in the order `gpusnap cuda --help` lists them.
std::span<const ActionInfo> AllActions();
const char* ActionName(Action action);
// Errors: kInvalidArgument listing the valid names.
Result<Action> ParseAction(std::string_view name);

// "state", "restore-tid", "lock", "checkpoint", "restore", "unlock": the verb
// in messages ("lock pid 4711: ...") and the phase's key in timings.
const char* OpName(Op op);

// The phases of `action`, in order; never empty.
std::vector<Op> PhasesOf(Action action);

// The op that undoes `op` when a later step fails: unlock undoes lock, restore
// undoes checkpoint. Restore and unlock are never undone (checkpointing again
// would cost seconds and a lock on a running peer can hang); nothing is
// returned for them or for the queries.
std::optional<Op> UndoOf(Op op);

struct RollbackStep {
  Op op;                // the undoing op
  bool only_succeeded;  // true: only the pids the failed phase succeeded on
};
// What to run when phase `failed` of `phases` failed for some pids: undo that
// phase on the pids it succeeded on, then undo the earlier phases on every pid,
// latest first, stopping at the first phase that cannot be undone. Empty when
// the failed phase cannot be undone: a failed restore unlocks nothing.
// REQUIRES: failed < phases.size().
std::vector<RollbackStep> RollbackPlan(std::span<const Op> phases, size_t failed);

// OK when a pid in `state` may undergo `op`. Otherwise kFailedPrecondition
// saying which state the pid is in and what to do ("process is RUNNING; lock
// it first"), without the "lock pid N: " prefix.
Status CheckState(Op op, ProcessState state);

// The state a pid is in after `op` succeeded on it; `before` for queries.
ProcessState StateAfter(Op op, ProcessState before);

// "locked", "restored", ...: how the rollback part of a message names `op`.
const char* PastTense(Op op);

}  // namespace gpusnap::cuda
