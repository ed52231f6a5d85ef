#include "gpu/processes.h"


#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <filesystem>
#include <future>
#include <thread>
#include <sstream>

#include "proc/proc.h"
#include "ns/thread_freeze.h"
#include "util/files.h"
#include "util/first_failure.h"
#include "util/test_hooks.h"

namespace gpusnap::gpu {

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }


std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t')) s.pop_back();
  size_t i = s.find_first_not_of(" \t");
  return i == std::string::npos ? "" : s.substr(i);
}

// "Key: value" of /proc/driver/nvidia/gpus/<bus>/information.
std::string Field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key + ":", 0) == 0) return Trim(line.substr(key.size() + 1));
  return "";
}

const cuda::GpuInfo* ByUuid(const std::vector<cuda::GpuInfo>& gpus, const std::string& uuid) {
  for (const auto& g : gpus)
    if (cuda::FormatUuid(g.uuid) == uuid) return &g;
  return nullptr;
}

// The NVIDIA driver's /proc directory. GPUSNAP_NVIDIA_PROC_DIR points the
// GPU-less tests at a stand-in, the way they load a stand-in libcuda.
std::string NvidiaProcDir() {
  const char* dir = std::getenv("GPUSNAP_NVIDIA_PROC_DIR");
  return dir && *dir ? dir : "/proc/driver/nvidia";
}

}  // namespace

std::vector<pid_t> FindGpuProcesses(const std::vector<pid_t>& tree) {
  std::vector<pid_t> out;
  for (pid_t p : tree)
    if (proc::UsesNvidiaGpu(p)) out.push_back(p);
  return out;
}

Result<std::string> KernelDriverVersion() {
  GPUSNAP_ASSIGN_OR_RETURN(auto text, ReadFile(NvidiaProcDir() + "/version"));
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ..."
  std::istringstream in(text);
  std::string word;
  while (in >> word)
    if (word == "Module" && in >> word) return word;
  return Status::Error(Code::kNotFound, "no version in {}/version", NvidiaProcDir());
}

std::vector<std::string> GpusOpenedBy(pid_t pid) {
  std::map<int, std::string> minor_to_uuid;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(NvidiaProcDir() + "/gpus", ec)) {
    auto info = ReadFile(e.path().string() + "/information");
    if (!info.ok()) continue;
    std::string minor = Field(*info, "Device Minor"), uuid = Field(*info, "GPU UUID");
    if (!minor.empty() && !uuid.empty()) minor_to_uuid[std::atoi(minor.c_str())] = uuid;
  }
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/map_files", ec)) {
    auto target = std::filesystem::read_symlink(e.path(), ec);
    if (ec) continue;
    std::string name = target.filename().string();
    if (name.rfind("nvidia", 0) != 0 || name.size() <= 6 || !std::isdigit(static_cast<unsigned char>(name[6]))) continue;
    auto it = minor_to_uuid.find(std::atoi(name.c_str() + 6));
    if (it != minor_to_uuid.end() && std::find(out.begin(), out.end(), it->second) == out.end())
      out.push_back(it->second);
  }
  return out;
}

SnapshotGpuState Describe(const cuda::Driver& driver, const std::vector<cuda::GpuInfo>& visible,
                          const std::vector<pid_t>& gpu_pids, const std::vector<int>& ns_pids,
                          const std::string& kernel_driver) {
  SnapshotGpuState s;
  s.driver_version = kernel_driver;
  s.cuda_version = driver.version();
  s.ns_pids = ns_pids;
  std::vector<std::string> used;
  for (pid_t p : gpu_pids)
    for (const auto& u : GpusOpenedBy(p))
      if (std::find(used.begin(), used.end(), u) == used.end()) used.push_back(u);
  for (const auto& g : visible) {
    std::string uuid = cuda::FormatUuid(g.uuid);
    if (!used.empty() && std::find(used.begin(), used.end(), uuid) == used.end()) continue;
    s.gpus.push_back({g.index, uuid, g.name, g.cc_major, g.cc_minor, g.total_bytes});
  }
  return s;
}

Status CheckCompatible(const SnapshotGpuState& snap, const std::vector<cuda::GpuInfo>& here,
                       const std::string& kernel_driver_here, const cuda::GpuMap& map) {
  auto major_of = [](const std::string& v) { return v.substr(0, v.find('.')); };
  if (major_of(snap.driver_version) != major_of(kernel_driver_here))
    return Status::Error(Code::kFailedPrecondition,
                         "the snapshot was taken with NVIDIA driver {}, this machine has {}: the major versions differ",
                         snap.driver_version, kernel_driver_here);
  for (const auto& g : snap.gpus) {
    std::string target = g.uuid;
    for (const auto& pair : map)
      if (cuda::FormatUuid(pair.old_uuid) == g.uuid) target = cuda::FormatUuid(pair.new_uuid);
    const cuda::GpuInfo* t = ByUuid(here, target);
    if (t == nullptr)
      return Status::Error(Code::kFailedPrecondition,
                           "the snapshot's GPU {} ({}, index {}) is not on this machine; choose one with --gpus or --gpu-map",
                           g.uuid, g.name, g.index);
    if (t->cc_major != g.cc_major || t->cc_minor != g.cc_minor)
      return Status::Error(Code::kFailedPrecondition,
                           "GPU {} has compute capability {}.{}, the snapshot's GPU {} had {}.{}", target, t->cc_major,
                           t->cc_minor, g.uuid, g.cc_major, g.cc_minor);
  }
  return Status::Ok();
}

Result<cuda::GpuMap> PlanGpuMap(const SnapshotGpuState& snap, const std::vector<cuda::GpuInfo>& here,
                                const cuda::GpuMapSpec& spec) {
  std::vector<cuda::GpuInfo> old_gpus;
  for (const auto& g : snap.gpus) {
    cuda::GpuInfo info;
    info.index = g.index;
    GPUSNAP_ASSIGN_OR_RETURN(info.uuid, cuda::ParseUuid(g.uuid));
    info.name = g.name;
    info.cc_major = g.cc_major;
    info.cc_minor = g.cc_minor;
    old_gpus.push_back(info);
  }
  if (spec.gpus.empty()) return cuda::TranslateGpuMap(spec.entries, old_gpus, here);
  if (spec.gpus.size() > snap.gpus.size())
    return Status::Error(Code::kInvalidArgument, "--gpus names {} GPUs, the snapshot uses {}", spec.gpus.size(),
                         snap.gpus.size());
  // The driver takes a permutation: the GPUs named first, then the others
  // of this machine in order for the snapshot's remaining GPUs.
  std::vector<int> targets = spec.gpus;
  for (const auto& h : here)
    if (targets.size() < snap.gpus.size() && std::find(targets.begin(), targets.end(), h.index) == targets.end())
      targets.push_back(h.index);
  std::vector<cuda::GpuMapEntry> entries;
  for (size_t i = 0; i < targets.size(); ++i)
    entries.push_back({.from = {.index = std::nullopt, .uuid = old_gpus[i].uuid, .text = snap.gpus[i].uuid},
                       .to = {.index = targets[i], .uuid = std::nullopt, .text = std::to_string(targets[i])}});
  return cuda::TranslateGpuMap(entries, old_gpus, here);
}

Result<SnapshotGpuState> DescribeTree(const cuda::Driver& driver, const std::vector<pid_t>& gpu_pids) {
  GPUSNAP_ASSIGN_OR_RETURN(auto visible, cuda::ListGpus(driver));
  GPUSNAP_ASSIGN_OR_RETURN(auto kernel_driver, KernelDriverVersion());
  std::vector<int> ns_pids;
  for (pid_t p : gpu_pids) {
    GPUSNAP_ASSIGN_OR_RETURN(auto nspids, proc::NsPids(p));
    ns_pids.push_back(nspids.back());
  }
  return Describe(driver, visible, gpu_pids, ns_pids, kernel_driver);
}

namespace {

// Undoes a Suspend that failed after CheckpointAll: every pid is checkpointed
// and locked; those in `frozen` still have all threads but the restore thread
// stopped by us, the others (`stopped`) are in group-stop. Each is brought to
// the first state (only the restore thread runs), then all are restored,
// unlocked and let run. Every step is tried; the first failure is returned.
Status UndoCheckpoint(const cuda::Driver& driver, const std::vector<pid_t>& pids, std::vector<ns::ThreadFreeze>& frozen,
                      const std::vector<std::pair<pid_t, pid_t>>& stopped) {
  FirstFailure first;
  auto note = [&first](const Status& st) { first.Record(st); };
  for (const auto& [pid, tid] : stopped) {
    auto f = ns::ThreadFreeze::AllBut(pid, tid);
    if (!f.ok()) {
      note(f.status());
      continue;
    }
    frozen.push_back(std::move(f).value());
    note(ns::Continue(pid));
  }
  note(cuda::RestoreAll(driver, pids, {}).status);
  note(cuda::UnlockAll(driver, pids).status);
  for (auto& f : frozen) note(f.Release());
  frozen.clear();
  return first.Get();
}

}  // namespace

Result<std::vector<pid_t>> Suspend(const cuda::Driver& driver, const std::vector<pid_t>& pids, int lock_timeout_ms,
                                   std::map<std::string, double>& timings) {
  auto t = Clock::now();
  cuda::Report tids = cuda::RestoreThreadIds(driver, pids);
  GPUSNAP_RETURN_IF_ERROR(tids.status);
  GPUSNAP_RETURN_IF_ERROR(cuda::LockAll(driver, pids, lock_timeout_ms).status);
  timings["gpu-lock"] = Since(t);

  t = Clock::now();
  // Each restore thread by its host tid (for the freeze) and by the tid its
  // namespace knows (what a restore keeps), read now, while nothing is stopped.
  std::vector<pid_t> host_tids, restore_tids;
  for (const auto& p : tids.pids) {
    auto host = proc::HostTid(p.pid, p.restore_tid);
    auto nspids = host.ok() ? proc::NsPids(*host) : Result<std::vector<int>>(host.status());
    if (!nspids.ok())
      return nspids.status().Wrap("finding the restore threads").Then("unlocking", cuda::UnlockAll(driver, pids).status);
    host_tids.push_back(*host);
    restore_tids.push_back(nspids->back());
  }
  std::vector<ns::ThreadFreeze> frozen;
  for (size_t i = 0; i < pids.size(); ++i) {
    auto f = ns::ThreadFreeze::AllBut(pids[i], host_tids[i]);
    if (!f.ok()) {
      frozen.clear();  // releases the others
      return f.status()
          .Wrap("stopping CPU threads before the GPU checkpoint")
          .Then("unlocking", cuda::UnlockAll(driver, pids).status);
    }
    frozen.push_back(std::move(f).value());
  }
  cuda::Report checkpoint = cuda::CheckpointAll(driver, pids);
  if (!checkpoint.ok()) {
    // CheckpointAll restored what it had checkpointed; unlock, then let run.
    frozen.clear();
    return checkpoint.status.Then("unlocking", cuda::UnlockAll(driver, pids).status);
  }
  // Into group-stop for CRIU, one by one; a failure part-way brings every
  // process back, those already stopped and those still frozen alike.
  std::vector<std::pair<pid_t, pid_t>> stopped;
  while (!frozen.empty()) {
    ns::ThreadFreeze& f = frozen.back();
    size_t i = frozen.size() - 1;
    Status st = f.DetachIntoStop();
    if (st.ok()) st = InjectedFailure(fmt::format("gpu-detach-{}", i));
    // Detached either way (a failed detach leaves the process stopped or
    // running, holding nothing of ours): the undo freezes it again.
    frozen.pop_back();
    stopped.emplace_back(pids[i], host_tids[i]);
    if (!st.ok())
      return st.Wrap(fmt::format("stopping GPU process {} for CRIU", pids[i]))
          .Then("bringing the GPU processes back", UndoCheckpoint(driver, pids, frozen, stopped));
  }
  timings["gpu-checkpoint"] = Since(t);
  return restore_tids;
}

Status Resume(const cuda::Driver& driver, const std::vector<pid_t>& pids, const std::vector<pid_t>& restore_tids,
              const cuda::GpuMap& map, std::map<std::string, double>& timings) {
  if (restore_tids.size() != pids.size())
    return Status::Error(Code::kInternal, "{} restore threads for {} GPU processes", restore_tids.size(), pids.size());
  auto t = Clock::now();
  std::vector<ns::ThreadFreeze> frozen;
  for (size_t i = 0; i < pids.size(); ++i) {
    // The driver names the thread as the process sees it, inside its namespace.
    GPUSNAP_ASSIGN_OR_RETURN(pid_t tid, proc::HostTid(pids[i], restore_tids[i]));
    GPUSNAP_ASSIGN_OR_RETURN(auto f, ns::ThreadFreeze::AllBut(pids[i], tid));
    frozen.push_back(std::move(f));
    GPUSNAP_RETURN_IF_ERROR(ns::Continue(pids[i]));  // the restore thread runs, no other
  }
  cuda::Report restored = cuda::RestoreAll(driver, pids, map);
  if (pids.size() > 1)  // each process's own share, by the pid its namespace knows it by, as the gpushare phases are
    for (const auto& p : restored.pids) {
      auto nspids = proc::NsPids(p.pid);
      if (nspids.ok()) timings[fmt::format("gpu-restore.pid{}", nspids->back())] = p.seconds;
    }
  GPUSNAP_RETURN_IF_ERROR(restored.status);
  timings["gpu-restore"] = Since(t);
  t = Clock::now();
  GPUSNAP_RETURN_IF_ERROR(cuda::UnlockAll(driver, pids).status);
  for (auto& f : frozen) GPUSNAP_RETURN_IF_ERROR(f.Release());
  timings["gpu-unlock"] = Since(t);
  return Status::Ok();
}

Status ResumeWithin(std::shared_ptr<cuda::Driver> driver, std::vector<pid_t> pids, std::vector<pid_t> restore_tids,
                    cuda::GpuMap map, std::chrono::seconds timeout, std::map<std::string, double>& timings) {
  struct Outcome {
    Status status;
    std::map<std::string, double> timings;
  };
  auto promise = std::make_shared<std::promise<Outcome>>();
  auto future = promise->get_future();
  std::thread([driver, pids = std::move(pids), tids = std::move(restore_tids), map = std::move(map), promise] {
    Outcome o;
    o.status = Resume(*driver, pids, tids, map, o.timings);
    promise->set_value(std::move(o));
  }).detach();
  if (future.wait_for(timeout) != std::future_status::ready)
    return Status::Error(Code::kTimeout, "the GPU restore did not finish within {} s", timeout.count());
  Outcome o = future.get();
  timings.insert(o.timings.begin(), o.timings.end());
  return o.status;
}

}  // namespace gpusnap::gpu
