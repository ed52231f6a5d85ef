#include "container/freezer.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <thread>

#include "container/cgroup.h"
#include "util/fd.h"
#include "util/files.h"

namespace gpusnap::container {

namespace {

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// A control file takes one write(2); WriteFileAtomic's rename cannot apply there.
Status WriteControl(const std::string& path, std::string_view value) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno(errno, "opening `{}`", path);
  return WriteAll(fd.get(), value, path);
}

// The directory of `pid`'s cgroup that has a freezer: the v2 one first.
Result<std::pair<std::string, bool>> FreezerDir(pid_t pid) {
  GPUSNAP_ASSIGN_OR_RETURN(std::string cgroup, ReadFile("/proc/" + std::to_string(pid) + "/cgroup"));
  GPUSNAP_ASSIGN_OR_RETURN(std::string mounts, ReadFile("/proc/self/mountinfo"));
  std::string v1;
  for (const std::string& procs : CgroupProcsFiles(cgroup, mounts)) {
    std::string dir = std::filesystem::path(procs).parent_path().string();
    if (Exists(dir + "/cgroup.freeze")) return std::pair{dir, true};
    if (v1.empty() && Exists(dir + "/freezer.state")) v1 = dir;
  }
  if (!v1.empty()) return std::pair{v1, false};
  return Status::Error(Code::kFailedPrecondition,
                       "pid {} is in no cgroup that can be frozen (a root cgroup has no freezer): a rootfs capture "
                       "freezes the container's cgroup while it reads",
                       pid);
}

}  // namespace

Result<FrozenCgroup> FrozenCgroup::Freeze(pid_t pid, std::chrono::milliseconds timeout) {
  GPUSNAP_ASSIGN_OR_RETURN(auto found, FreezerDir(pid));
  auto [dir, v2] = found;
  if (auto ours = FreezerDir(::getpid()); ours.ok() && ours->first == dir)
    return Status::Error(Code::kFailedPrecondition,
                         "pid {} is in gpusnap's own cgroup `{}`: freezing it would freeze gpusnap", pid, dir);
  GPUSNAP_RETURN_IF_ERROR(
      WriteControl(dir + (v2 ? "/cgroup.freeze" : "/freezer.state"), v2 ? "1" : "FROZEN").Wrap("freezing the cgroup"));
  FrozenCgroup frozen(dir, v2);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    auto state = ReadFile(dir + (v2 ? "/cgroup.events" : "/freezer.state"));
    if (state.ok() && (v2 ? state->find("frozen 1") != std::string::npos : state->rfind("FROZEN", 0) == 0))
      return frozen;
    if (std::chrono::steady_clock::now() > deadline)
      return Status::Error(Code::kTimeout, "the tasks of cgroup `{}` were not all frozen within {} ms", dir,
                           timeout.count());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

FrozenCgroup::FrozenCgroup(FrozenCgroup&& other) noexcept
    : dir_(std::move(other.dir_)), v2_(other.v2_), frozen_(other.frozen_) {
  other.frozen_ = false;
}

FrozenCgroup::~FrozenCgroup() { (void)Thaw(); }

Status FrozenCgroup::Thaw() {
  if (!frozen_) return Status::Ok();
  frozen_ = false;
  return WriteControl(dir_ + (v2_ ? "/cgroup.freeze" : "/freezer.state"), v2_ ? "0" : "THAWED")
      .Wrap(fmt::format("thawing cgroup `{}`", dir_));
}

}  // namespace gpusnap::container
