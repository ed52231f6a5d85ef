#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <nlohmann/json.hpp>

#include "gpusnap/workload.h"
#include "proc/proc.h"
#include "ns/reaper.h"
#include "util/clock.h"
#include "util/files.h"
#include "util/test_hooks.h"

namespace gpusnap {

using nlohmann::json;

std::string RunDir() {
  const char* env = std::getenv("GPUSNAP_RUN_DIR");
  return env && *env ? env : "/run/gpusnap";
}

static std::string RecordPath(const std::string& name) { return RunDir() + "/workloads/" + name + ".json"; }

bool IsValidWorkloadName(std::string_view name) {
  if (name.empty() || name.size() > 40 || name[0] == '.' || name[0] == '-') return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

Status CheckWorkloadName(std::string_view name) {
  if (IsValidWorkloadName(name)) return Status::Ok();
  return Status::Error(Code::kInvalidArgument, "invalid workload name `{}`: use 1-40 letters, digits, '.', '_' or "
                       "'-', not starting with '.' or '-'", name);
}

static Result<Workload> ReadRecord(const std::string& path) {
  GPUSNAP_ASSIGN_OR_RETURN(auto text, ReadFile(path));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return Status::Error(Code::kCorruption, "workload record `{}` is not JSON", path);
  Workload w;
  try {
    w.name = j.at("name").get<std::string>();
    w.pid = j.at("pid").get<pid_t>();
    w.start_time = j.at("start_time").get<uint64_t>();
    w.reaper_pid = j.value("reaper_pid", 0);
    w.cmdline = j.value("cmdline", std::vector<std::string>{});
    w.log = j.value("log", "");
    w.started = j.value("started", "");
    w.restored_from = j.value("restored_from", "");
    w.standby = j.value("standby", false);
    w.suspended = j.value("suspended", false);
    w.store = j.value("store", "");
    w.lazy_pages = j.value("lazy_pages", "");
  } catch (const json::exception& e) {
    return Status::Error(Code::kCorruption, "workload record `{}`: {}", path, e.what());
  }
  w.running = proc::IsSameProcess(w.pid, w.start_time);
  return w;
}

static Status WriteRecord(const Workload& w) {
  json j = {{"name", w.name},       {"pid", w.pid}, {"start_time", w.start_time}, {"reaper_pid", w.reaper_pid},
            {"cmdline", w.cmdline}, {"log", w.log}, {"started", w.started},       {"restored_from", w.restored_from}};
  if (w.standby) j["standby"] = true;  // absent: running, as in records older than standbys
  if (w.suspended) j["suspended"] = true;
  if (!w.store.empty()) j["store"] = w.store;
  if (!w.lazy_pages.empty()) j["lazy_pages"] = w.lazy_pages;
  return WriteFileAtomic(RecordPath(w.name), j.dump(2) + "\n");
}

const char* WorkloadState(const Workload& w) {
  if (!w.running) return "exited";
  if (w.standby) return "standby";
  return w.suspended ? "suspended" : "running";
}

Status RecordWorkload(const Workload& w, NameClaim claim) {
  if (w.name != claim.name())
    return Status::Error(Code::kInternal, "recording workload `{}` under the claim on `{}`", w.name, claim.name());
  if (auto old = ReadRecord(RecordPath(w.name)); old.ok() && old->running && old->pid != w.pid)
    return Status::Error(Code::kAlreadyExists, "a workload named `{}` is already running (pid {})", w.name, old->pid);
  return WriteRecord(w);
}

Status UpdateWorkload(const Workload& w) {
  auto old = ReadRecord(RecordPath(w.name));
  if (!old.ok()) return Status::Error(Code::kNotFound, "no workload named `{}` to update", w.name);
  if (old->pid != w.pid || old->start_time != w.start_time)
    return Status::Error(Code::kFailedPrecondition, "the record of workload `{}` is of another tree (pid {}) now",
                         w.name, old->pid);
  return WriteRecord(w);
}

Status RemoveWorkloadRecord(const std::string& name) {
  GPUSNAP_RETURN_IF_ERROR(CheckWorkloadName(name));
  std::string path = RecordPath(name);
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return Status::Errno(errno, "removing `{}`", path);
  return Status::Ok();
}

Result<LockFile> ClaimWake(const std::string& name) {
  GPUSNAP_RETURN_IF_ERROR(CheckWorkloadName(name));
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(RunDir() + "/workloads"));
  std::string path = RunDir() + "/workloads/" + name + ".wake";
  auto lock = LockFile::TryAcquire(path);
  if (!lock.ok() && lock.status().code() == Code::kAlreadyExists) {
    auto text = ReadFile(path);
    pid_t holder = text.ok() ? static_cast<pid_t>(std::atoi(text->c_str())) : 0;
    return Status::Error(Code::kAlreadyExists, "standby `{}` is already being woken{}", name,
                         holder > 0 ? fmt::format(" (by gpusnap pid {})", holder) : "");
  }
  if (!lock.ok()) return lock.status().Wrap(fmt::format("claiming the wake of `{}`", name));
  std::string pid = std::to_string(::getpid());
  if (::ftruncate(lock->fd(), 0) != 0 || ::pwrite(lock->fd(), pid.data(), pid.size(), 0) < 0)
    return Status::Errno(errno, "writing `{}`", path);
  return lock;
}

Status EndWorkload(const std::string& name, std::chrono::milliseconds wait) {
  GPUSNAP_ASSIGN_OR_RETURN(Workload w, FindWorkload(name));
  if (!w.running) return Status::Error(Code::kFailedPrecondition, "workload `{}` (pid {}) has exited already", name, w.pid);
  // The reaper is the root's parent (pid 1 of its namespace): a reaper pid
  // reused since by another process is never signalled.
  auto root = proc::ReadStat(w.pid);
  if (w.reaper_pid <= 1 || !root.ok() || root->ppid != w.reaper_pid)
    return Status::Error(Code::kFailedPrecondition, "workload `{}` (pid {}) is not under its recorded reaper (pid {})",
                         name, w.pid, w.reaper_pid);
  if (::kill(w.reaper_pid, SIGTERM) != 0 && errno != ESRCH)
    return Status::Errno(errno, "ending the reaper (pid {}) of workload `{}`", w.reaper_pid, name);
  auto deadline = std::chrono::steady_clock::now() + wait;
  while (proc::IsSameProcess(w.pid, w.start_time)) {
    if (std::chrono::steady_clock::now() >= deadline)
      return Status::Error(Code::kTimeout, "workload `{}` (pid {}) is still there {} ms after its reaper was told to "
                           "end it", name, w.pid, wait.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return Status::Ok();
}

Result<std::vector<Workload>> ListWorkloads() {
  std::vector<Workload> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(RunDir() + "/workloads", ec)) {
    if (entry.path().extension() != ".json") continue;
    if (auto w = ReadRecord(entry.path().string()); w.ok()) out.push_back(std::move(w).value());
  }
  std::sort(out.begin(), out.end(), [](const Workload& a, const Workload& b) { return a.name < b.name; });
  return out;
}

Result<Workload> FindWorkload(const std::string& name) {
  GPUSNAP_RETURN_IF_ERROR(CheckWorkloadName(name));
  auto w = ReadRecord(RecordPath(name));
  if (!w.ok()) return Status::Error(Code::kNotFound, "no workload named `{}` (see `gpusnap ps`)", name);
  return w;
}

Result<std::string> GpushareShimPath() {
  if (const char* env = std::getenv("GPUSNAP_GPUSHARE_LIB"); env && *env) {
    if (::access(env, R_OK) != 0) return Status::Errno(errno, "GPUSNAP_GPUSHARE_LIB `{}`", env);
    return std::filesystem::absolute(env).string();
  }
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return Status::Errno(ec.value(), "finding the gpusnap binary");
  // Beside the binary (the portable pack), the install layout, and the node
  // bundle the webhook mounts (/gpusnap/bin, /gpusnap/lib).
  std::vector<std::filesystem::path> candidates{self.parent_path() / "libgpusnap_gpushare.so",
                                                self.parent_path() / "../lib/gpusnap/libgpusnap_gpushare.so",
                                                self.parent_path() / "../lib/libgpusnap_gpushare.so"};
  for (const auto& c : candidates) {
    if (::access(c.c_str(), R_OK) == 0) return std::filesystem::weakly_canonical(c).string();
  }
  return Status::Error(Code::kNotFound, "the gpushare shim is not at `{}`, `{}` or `{}` (set GPUSNAP_GPUSHARE_LIB)",
                       candidates[0].string(), candidates[1].string(), candidates[2].string());
}

Result<Workload> RunWorkload(const RunOptions& options) {
  GPUSNAP_RETURN_IF_ERROR(CheckWorkloadName(options.name));
  if (options.argv.empty()) return Status::Error(Code::kInvalidArgument, "no command to run");
  GPUSNAP_ASSIGN_OR_RETURN(auto claim, ClaimWorkloadName(options.name));
  PauseIfRequested("name-claimed");
  std::string log = options.log;
  if (log.empty()) {
    GPUSNAP_RETURN_IF_ERROR(MakeDirs(RunDir() + "/logs"));
    log = RunDir() + "/logs/" + options.name + ".log";
  }
  log = std::filesystem::absolute(log).string();
  std::string preload;
  if (options.gpushare) {
    GPUSNAP_ASSIGN_OR_RETURN(preload, GpushareShimPath());
  }
  GPUSNAP_ASSIGN_OR_RETURN(auto spawned, ns::SpawnReaper({options.argv, log, preload}));
  Workload w;
  w.name = options.name;
  w.pid = spawned.workload_pid;
  w.reaper_pid = spawned.reaper_pid;
  w.cmdline = options.argv;
  w.log = log;
  w.started = NowRfc3339();
  auto st = proc::ReadStat(w.pid);
  if (!st.ok()) return Status::Error(Code::kExternal, "the workload exited at once; see its log `{}`", log);
  w.start_time = st->start_time;
  w.running = true;
  GPUSNAP_RETURN_IF_ERROR(RecordWorkload(w, std::move(claim)));
  return w;
}

}  // namespace gpusnap
