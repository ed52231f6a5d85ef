#include "cuda/plan.h"

#include <fmt/format.h>

namespace gpusnap::cuda {

namespace {

constexpr ActionInfo kActions[] = {
    {Action::kState, "state", "Print each pid's CUDA checkpoint state (RUNNING, LOCKED, CHECKPOINTED, FAILED)"},
    {Action::kRestoreTid, "restore-tid", "Print each pid's CUDA restore thread id (the thread to leave unfrozen)"},
    {Action::kLock, "lock", "Lock every pid (blocks its CUDA calls); all or none: on a failure the locked are unlocked"},
    {Action::kCheckpoint, "checkpoint", "Move every LOCKED pid's GPU memory to host memory and release the GPU"},
    {Action::kRestore, "restore", "Restore every CHECKPOINTED pid onto the GPU (optionally remapped); stays LOCKED"},
    {Action::kUnlock, "unlock", "Unlock every LOCKED pid so it runs again"},
    {Action::kSuspend, "suspend", "Lock every pid, then checkpoint every pid (rolled back on failure)"},
    {Action::kResume, "resume", "Restore every pid, then unlock them all once every restore succeeded"},
};

}  // namespace

std::span<const ActionInfo> AllActions() { return kActions; }

const char* ActionName(Action action) {
  for (const auto& a : kActions)
    if (a.action == action) return a.name;
  return "unknown";
}

Result<Action> ParseAction(std::string_view name) {
  std::string names;
  for (const auto& a : kActions) {
    if (name == a.name) return a.action;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", a.name);
  }
  return Status::Error(Code::kInvalidArgument, "unknown action `{}` (one of: {})", name, names);
}

const char* OpName(Op op) {
  switch (op) {
    case Op::kGetState: return "state";
    case Op::kGetRestoreTid: return "restore-tid";
    case Op::kLock: return "lock";
    case Op::kCheckpoint: return "checkpoint";
    case Op::kRestore: return "restore";
    case Op::kUnlock: return "unlock";
  }
  return "unknown";
}

const char* PastTense(Op op) {
  switch (op) {
    case Op::kGetState: return "queried";
    case Op::kGetRestoreTid: return "queried";
    case Op::kLock: return "locked";
    case Op::kCheckpoint: return "checkpointed";
    case Op::kRestore: return "restored";
    case Op::kUnlock: return "unlocked";
  }
  return "unknown";
}

std::vector<Op> PhasesOf(Action action) {
  switch (action) {
    case Action::kState: return {Op::kGetState};
    case Action::kRestoreTid: return {Op::kGetRestoreTid};
    case Action::kLock: return {Op::kLock};
    case Action::kCheckpoint: return {Op::kCheckpoint};
    case Action::kRestore: return {Op::kRestore};
    case Action::kUnlock: return {Op::kUnlock};
    case Action::kSuspend: return {Op::kLock, Op::kCheckpoint};
    case Action::kResume: return {Op::kRestore, Op::kUnlock};
  }
  return {Op::kGetState};
}

std::optional<Op> UndoOf(Op op) {
  if (op == Op::kLock) return Op::kUnlock;
  if (op == Op::kCheckpoint) return Op::kRestore;
  return std::nullopt;
}

std::vector<RollbackStep> RollbackPlan(std::span<const Op> phases, size_t failed) {
  std::vector<RollbackStep> steps;
  for (size_t k = failed + 1; k-- > 0;) {
    std::optional<Op> undo = UndoOf(phases[k]);
    if (!undo) break;
    steps.push_back({*undo, k == failed});
  }
  return steps;
}

ProcessState StateAfter(Op op, ProcessState before) {
  switch (op) {
    case Op::kLock: return ProcessState::kLocked;
    case Op::kCheckpoint: return ProcessState::kCheckpointed;
    case Op::kRestore: return ProcessState::kLocked;
    case Op::kUnlock: return ProcessState::kRunning;
    default: return before;
  }
}

static std::optional<ProcessState> RequiredState(Op op) {
  switch (op) {
    case Op::kLock: return ProcessState::kRunning;
    case Op::kCheckpoint: return ProcessState::kLocked;
    case Op::kRestore: return ProcessState::kCheckpointed;
    case Op::kUnlock: return ProcessState::kLocked;
    default: return std::nullopt;
  }
}

// What to tell the user when `op` meets a pid in `state`.
static const char* Hint(Op op, ProcessState state) {
  using S = ProcessState;
  if (state == S::kFailed) return "the driver hit an uncorrectable error in an earlier checkpoint or restore";
  if (state != S::kRunning && state != S::kLocked && state != S::kCheckpointed)
    return "gpusnap does not know this state (a newer driver?)";
  switch (op) {
    case Op::kLock:
      return state == S::kLocked ? "it is already locked" : "it is already locked and checkpointed; restore it";
    case Op::kCheckpoint:
      return state == S::kRunning ? "lock it first" : "it is already checkpointed";
    case Op::kRestore:
      return state == S::kRunning ? "nothing to restore" : "nothing to restore; unlock it to let it run";
    case Op::kUnlock:
      return state == S::kRunning ? "it is not locked" : "restore it first";
    default: return "";
  }
}

Status CheckState(Op op, ProcessState state) {
  std::optional<ProcessState> required = RequiredState(op);
  if (!required || state == *required) return Status::Ok();
  return Status::Error(Code::kFailedPrecondition, "process is {}; {}", StateName(state), Hint(op, state));
}

}  // namespace gpusnap::cuda
