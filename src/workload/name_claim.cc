// Claiming a workload name (gpusnap/workload.h): a LockFile (util/lock_file.h)
// at <run dir>/workloads/<name>.claim. The pid written in it only serves the
// refusal's message.
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "gpusnap/workload.h"
#include "util/files.h"

namespace gpusnap {

namespace {

std::string ClaimPath(const std::string& name) { return RunDir() + "/workloads/" + name + ".claim"; }

}  // namespace

Result<NameClaim> ClaimWorkloadName(const std::string& name) {
  GPUSNAP_RETURN_IF_ERROR(CheckWorkloadName(name));
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(RunDir() + "/workloads"));
  std::string path = ClaimPath(name);
  auto lock = LockFile::TryAcquire(path);
  if (!lock.ok() && lock.status().code() == Code::kAlreadyExists) {
    // The pid its holder wrote; none in the moment before it is written.
    auto text = ReadFile(path);
    pid_t holder = text.ok() ? static_cast<pid_t>(std::atoi(text->c_str())) : 0;
    return Status::Error(Code::kAlreadyExists, "a workload named `{}` is already being started{}; choose another --name",
                         name, holder > 0 ? fmt::format(" (by gpusnap pid {})", holder) : "");
  }
  if (!lock.ok()) return lock.status().Wrap(fmt::format("claiming workload name `{}`", name));
  NameClaim claim(name, std::move(lock).value());
  if (auto old = FindWorkload(name); old.ok() && old->running)
    return Status::Error(Code::kAlreadyExists, "a workload named `{}` is already running (pid {}); choose another --name",
                         name, old->pid);
  std::string pid = std::to_string(::getpid());
  // A claim file its dead holder left may still hold that holder's pid.
  if (::ftruncate(claim.lock_.fd(), 0) != 0 || ::pwrite(claim.lock_.fd(), pid.data(), pid.size(), 0) < 0)
    return Status::Errno(errno, "writing `{}`", path);
  return claim;
}

}  // namespace gpusnap
