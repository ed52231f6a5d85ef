#include "cuda/checkpoint_api.h"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <numeric>
#include <system_error>
#include <thread>

namespace gpusnap::cuda {

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct CallResult {
  Status status;
  ProcessState state = ProcessState::kRunning;  // Op::kGetState
  int tid = 0;                                  // Op::kGetRestoreTid
  double seconds = 0;
};

// `action`: the verb the user asked for ("lock" also for the state query before it).
Status DriverError(const Driver& driver, Op op, Op action, pid_t pid, abi::CUresult rc, const ActionArgs& args) {
  std::string message = fmt::format("{} pid {}: {}", OpName(action), pid, driver.ErrorName(rc));
  Code code = rc == abi::CUDA_ERROR_NOT_SUPPORTED ? Code::kNotSupported : Code::kExternal;
  if (op == Op::kLock && args.lock_timeout_ms > 0 &&
      (rc == abi::CUDA_ERROR_NOT_READY || rc == abi::CUDA_ERROR_TIMEOUT)) {
    code = Code::kTimeout;
    message += fmt::format(": not locked within {} ms", args.lock_timeout_ms);
  } else if (rc == abi::CUDA_ERROR_NOT_INITIALIZED) {
    // What r580 says for a live process that never initialised CUDA.
    message += ": the process has not initialised CUDA (not a CUDA process?)";
  } else if (rc == abi::CUDA_ERROR_OPERATING_SYSTEM && ::kill(pid, 0) != 0 && errno == ESRCH) {
    code = Code::kNotFound;  // r580 says 304 for a pid that does not exist
    message += ": no such process";
  }
  return Status::Error(code, "{}", message);
}

// One driver call for one pid. Reserved fields are zero (value-initialised).
CallResult Call(const Driver& driver, Op op, Op action, pid_t pid, const ActionArgs& args) {
  const DriverApi& api = driver.api();
  auto t0 = Clock::now();
  CallResult r;
  abi::CUresult rc = abi::CUDA_SUCCESS;
  switch (op) {
    case Op::kGetState: {
      abi::CUprocessState state = abi::CU_PROCESS_STATE_RUNNING;
      rc = api.cuCheckpointProcessGetState(pid, &state);
      r.state = static_cast<ProcessState>(state);
      break;
    }
    case Op::kGetRestoreTid: rc = api.cuCheckpointProcessGetRestoreThreadId(pid, &r.tid); break;
    case Op::kLock: {
      abi::CUcheckpointLockArgs lock{};
      lock.timeoutMs = static_cast<unsigned>(args.lock_timeout_ms);
      rc = api.cuCheckpointProcessLock(pid, &lock);
      break;
    }
    case Op::kCheckpoint: rc = api.cuCheckpointProcessCheckpoint(pid, nullptr); break;
    case Op::kRestore: {
      std::vector<abi::CUcheckpointGpuPair> pairs(args.gpu_map.size());
      for (size_t i = 0; i < pairs.size(); ++i) {
        std::memcpy(pairs[i].oldUuid.bytes, args.gpu_map[i].old_uuid.data(), sizeof pairs[i].oldUuid.bytes);
        std::memcpy(pairs[i].newUuid.bytes, args.gpu_map[i].new_uuid.data(), sizeof pairs[i].newUuid.bytes);
      }
      abi::CUcheckpointRestoreArgs restore{};
      restore.gpuPairs = pairs.data();
      restore.gpuPairsCount = static_cast<unsigned>(pairs.size());
      rc = api.cuCheckpointProcessRestore(pid, pairs.empty() ? nullptr : &restore);
      break;
    }
    case Op::kUnlock: rc = api.cuCheckpointProcessUnlock(pid, nullptr); break;
  }
  r.seconds = Since(t0);
  if (rc != abi::CUDA_SUCCESS) r.status = DriverError(driver, op, action, pid, rc, args);
  return r;
}

// Runs `op` for pids[i], i in `which`, each on its own thread, and returns when
// all have finished. Results are indexed like `pids`. Errors are worded as
// `action`'s.
std::vector<CallResult> RunPhase(const Driver& driver, Op op, Op action, std::span<const pid_t> pids,
                                 const std::vector<size_t>& which, const ActionArgs& args) {
  std::vector<CallResult> results(pids.size());
  if (which.size() == 1) {
    results[which[0]] = Call(driver, op, action, pids[which[0]], args);
    return results;
  }
  std::vector<std::thread> threads;
  threads.reserve(which.size());
  for (size_t i : which) {
    auto work = [&, i] { results[i] = Call(driver, op, action, pids[i], args); };
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {
      work();  // no thread to be had: this pid runs here, the others still overlap
    }
  }
  for (auto& t : threads) t.join();
  return results;
}

std::string PidList(std::span<const pid_t> pids, const std::vector<size_t>& which) {
  std::string out = which.size() == 1 ? "pid " : "pids ";
  for (size_t n = 0; n < which.size(); ++n) out += fmt::format("{}{}", n ? ", " : "", pids[which[n]]);
  return out;
}

// One action on a list of pids; fills a Report as it goes.
class Execution {
 public:
  Execution(const Driver& driver, std::span<const pid_t> pids, const ActionArgs& args, Report& report)
      : driver_(driver), pids_(pids), args_(args), report_(report), all_(pids.size()) {
    std::iota(all_.begin(), all_.end(), size_t{0});
  }

  Status Run(Action action);

 private:
  // RunPhase, adding each pid's time to its report and the phase's to `key`.
  std::vector<CallResult> Timed(Op op, Op action, const std::vector<size_t>& which, const std::string& key);
  Status CheckStates(Op first);
  // Undoes what phase `failed` and those before it did; returns the message tail.
  std::string Rollback(std::span<const Op> phases, size_t failed, const std::vector<size_t>& succeeded);
  // Queries every pid's state again; returns "; states now: ...".
  std::string StatesNow();

  const Driver& driver_;
  std::span<const pid_t> pids_;
  const ActionArgs& args_;
  Report& report_;
  std::vector<size_t> all_;
};

std::vector<CallResult> Execution::Timed(Op op, Op action, const std::vector<size_t>& which, const std::string& key) {
  auto t0 = Clock::now();
  std::vector<CallResult> results = RunPhase(driver_, op, action, pids_, which, args_);
  report_.timings_s[key] += Since(t0);
  for (size_t i : which) report_.pids[i].seconds += results[i].seconds;
  return results;
}

Status Execution::CheckStates(Op first) {
  std::vector<CallResult> states = Timed(Op::kGetState, first, all_, "state");
  std::vector<std::string> problems;
  Code code = Code::kOk;
  for (size_t i : all_) {
    PidReport& p = report_.pids[i];
    Status s = states[i].status;
    if (s.ok()) {
      p.state = states[i].state;
      s = CheckState(first, states[i].state).Wrap(fmt::format("{} pid {}", OpName(first), p.pid));
    }
    if (s.ok()) continue;
    p.status = s;
    problems.push_back(s.message());
    if (code == Code::kOk) code = s.code();
  }
  if (problems.empty()) return Status::Ok();
  return Status::Error(code, "{}{}", fmt::join(problems, "; "), pids_.size() > 1 ? "; nothing was done to any pid" : "");
}

std::string Execution::Rollback(std::span<const Op> phases, size_t failed, const std::vector<size_t>& succeeded) {
  std::vector<RollbackStep> steps = RollbackPlan(phases, failed);
  if (steps.empty()) {
    if (failed + 1 == phases.size()) return "";
    return fmt::format("; did not {} any pid (every {} must succeed first)", OpName(phases[failed + 1]),
                       OpName(phases[failed]));
  }
  std::vector<std::string> done;
  std::vector<bool> touched(pids_.size(), false);
  for (const RollbackStep& step : steps) {
    const std::vector<size_t>& which = step.only_succeeded ? succeeded : all_;
    if (which.empty()) continue;
    std::vector<CallResult> results = Timed(step.op, step.op, which, "rollback");
    std::vector<std::string> failures;
    for (size_t i : which) {
      if (results[i].status.ok()) touched[i] = true;
      else failures.push_back(results[i].status.message());
    }
    if (!failures.empty()) {
      std::string partial = done.empty() ? "" : fmt::format("; rolled back: {}", fmt::join(done, ", then "));
      return fmt::format("{}; rollback failed: {}", partial, fmt::join(failures, "; "));
    }
    done.push_back(fmt::format("{} {}", PastTense(step.op), PidList(pids_, which)));
  }
  for (size_t i : all_) report_.pids[i].rolled_back = touched[i];
  if (done.empty()) return "";  // nothing had succeeded: nothing to undo
  return fmt::format("; rolled back: {}", fmt::join(done, ", then "));
}

std::string Execution::StatesNow() {
  std::vector<CallResult> states = RunPhase(driver_, Op::kGetState, Op::kGetState, pids_, all_, args_);
  std::vector<std::string> parts;
  for (size_t i : all_) {
    PidReport& p = report_.pids[i];
    p.state.reset();
    if (states[i].status.ok()) p.state = states[i].state;
    parts.push_back(fmt::format("{} {}", p.pid, p.state ? StateName(*p.state) : "unknown"));
  }
  return fmt::format("; states now: {}", fmt::join(parts, ", "));
}

Status Execution::Run(Action action) {
  std::vector<Op> phases = PhasesOf(action);
  bool restores = std::find(phases.begin(), phases.end(), Op::kRestore) != phases.end();
  if (restores && !args_.gpu_map.empty() && !driver_.SupportsGpuRemap())
    return Status::Error(Code::kNotSupported, "restoring onto other GPUs (--gpu-map) needs CUDA driver {} (r580); this one is {}",
                         VersionText(abi::kGpuRemapVersion), VersionText(driver_.version()));
  // Where every pid stands, before anything changes.
  GPUSNAP_RETURN_IF_ERROR(CheckStates(phases.front()));
  if (action == Action::kState) return Status::Ok();
  for (size_t k = 0; k < phases.size(); ++k) {
    std::vector<CallResult> results = Timed(phases[k], phases[k], all_, OpName(phases[k]));
    std::vector<size_t> succeeded;
    std::vector<std::string> failures;
    Code code = Code::kOk;
    for (size_t i : all_) {
      PidReport& p = report_.pids[i];
      if (results[i].status.ok()) {
        succeeded.push_back(i);
        p.state = StateAfter(phases[k], p.state.value_or(ProcessState::kRunning));
        p.restore_tid = results[i].tid;
        continue;
      }
      p.status = results[i].status;
      failures.push_back(p.status.message());
      if (code == Code::kOk) code = p.status.code();
    }
    if (failures.empty()) continue;
    std::string rollback = Rollback(phases, k, succeeded);
    return Status::Error(code, "{}{}{}", fmt::join(failures, "; "), rollback, StatesNow());
  }
  return Status::Ok();
}

Status ValidateInput(std::span<const pid_t> pids, const ActionArgs& args) {
  if (pids.empty()) return Status::Error(Code::kInvalidArgument, "no pid given");
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] <= 0) return Status::Error(Code::kInvalidArgument, "`{}` is not a pid", pids[i]);
    for (size_t k = 0; k < i; ++k)
      if (pids[k] == pids[i]) return Status::Error(Code::kInvalidArgument, "pid {} is given twice", pids[i]);
  }
  if (args.lock_timeout_ms < 0)
    return Status::Error(Code::kInvalidArgument, "lock timeout {} ms is negative (0 waits forever)", args.lock_timeout_ms);
  return Status::Ok();
}

}  // namespace

Report RunAction(const Driver& driver, Action action, std::span<const pid_t> pids, const ActionArgs& args) {
  auto t0 = Clock::now();
  Report report;
  for (pid_t pid : pids) {
    report.pids.emplace_back();
    report.pids.back().pid = pid;
  }
  report.status = ValidateInput(pids, args);
  if (report.status.ok()) report.status = Execution(driver, pids, args, report).Run(action);
  report.timings_s["total"] = Since(t0);
  return report;
}

Report StateAll(const Driver& driver, std::span<const pid_t> pids) { return RunAction(driver, Action::kState, pids); }

Report RestoreThreadIds(const Driver& driver, std::span<const pid_t> pids) {
  return RunAction(driver, Action::kRestoreTid, pids);
}

static ActionArgs WithTimeout(int timeout_ms) {
  ActionArgs args;
  args.lock_timeout_ms = timeout_ms;
  return args;
}

static ActionArgs WithGpuMap(const GpuMap& gpu_map) {
  ActionArgs args;
  args.gpu_map = gpu_map;
  return args;
}

Report LockAll(const Driver& driver, std::span<const pid_t> pids, int timeout_ms) {
  return RunAction(driver, Action::kLock, pids, WithTimeout(timeout_ms));
}

Report CheckpointAll(const Driver& driver, std::span<const pid_t> pids) {
  return RunAction(driver, Action::kCheckpoint, pids);
}

Report RestoreAll(const Driver& driver, std::span<const pid_t> pids, const GpuMap& gpu_map) {
  return RunAction(driver, Action::kRestore, pids, WithGpuMap(gpu_map));
}

Report UnlockAll(const Driver& driver, std::span<const pid_t> pids) { return RunAction(driver, Action::kUnlock, pids); }

Report SuspendAll(const Driver& driver, std::span<const pid_t> pids, int timeout_ms) {
  return RunAction(driver, Action::kSuspend, pids, WithTimeout(timeout_ms));
}

Report ResumeAll(const Driver& driver, std::span<const pid_t> pids, const GpuMap& gpu_map) {
  return RunAction(driver, Action::kResume, pids, WithGpuMap(gpu_map));
}

Result<ProcessState> GetState(const Driver& driver, pid_t pid) {
  CallResult r = Call(driver, Op::kGetState, Op::kGetState, pid, {});
  if (!r.status.ok()) return r.status;
  return r.state;
}

Result<int> RestoreThreadId(const Driver& driver, pid_t pid) {
  CallResult r = Call(driver, Op::kGetRestoreTid, Op::kGetRestoreTid, pid, {});
  if (!r.status.ok()) return r.status;
  return r.tid;
}

}  // namespace gpusnap::cuda
