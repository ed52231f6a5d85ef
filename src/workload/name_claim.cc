// Claiming a workload name (gpusnap/workload.h). The flock, not the claim
// file's existence, is the claim: the file only names the place to lock, and
// the pid written in it only serves the refusal's message.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "gpusnap/workload.h"
#include "util/fd.h"
#include "util/files.h"

namespace gpusnap {

namespace {

std::string ClaimPath(const std::string& name) { return RunDir() + "/workloads/" + name + ".claim"; }

// The pid its holder wrote into a claim file; 0 if none is there yet.
pid_t ClaimantPid(int fd) {
  char buf[24] = {};
  ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? static_cast<pid_t>(std::atoi(buf)) : 0;
}

// True if `fd` is still the file at `path`: a claim released while we waited
// for its lock was removed, and a newer claimant may lock a new file there.
bool StillAt(int fd, const std::string& path) {
  struct stat held{}, named{};
  return ::fstat(fd, &held) == 0 && ::stat(path.c_str(), &named) == 0 && held.st_dev == named.st_dev &&
         held.st_ino == named.st_ino;
}

}  // namespace

NameClaim::NameClaim(std::string name, std::string path, int fd)
    : name_(std::move(name)), path_(std::move(path)), fd_(fd) {}

NameClaim::NameClaim(NameClaim&& other) noexcept
    : name_(std::move(other.name_)), path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

NameClaim& NameClaim::operator=(NameClaim&& other) noexcept {
  if (this != &other) {
    Release();
    name_ = std::move(other.name_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

NameClaim::~NameClaim() { Release(); }

void NameClaim::Release() {
  if (fd_ < 0) return;
  // Removed while still locked, so whoever opened it meanwhile sees, once it
  // holds the lock, that the file is gone and starts over (StillAt).
  ::unlink(path_.c_str());
  ::close(std::exchange(fd_, -1));
}

Result<NameClaim> ClaimWorkloadName(const std::string& name) {
  if (!IsValidWorkloadName(name))
    return Status::Error(Code::kInvalidArgument,
                         "invalid workload name `{}`: use 1-40 letters, digits, '.', '_' or '-'", name);
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(RunDir() + "/workloads"));
  std::string path = ClaimPath(name);
  for (;;) {
    // Close-on-exec: a lock that a started workload inherited would hold the
    // name for as long as it runs.
    UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
    if (!fd.valid()) return Status::Errno(errno, "claiming workload name `{}` at `{}`", name, path);
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno != EWOULDBLOCK) return Status::Errno(errno, "locking `{}`", path);
      pid_t holder = ClaimantPid(fd.get());  // 0 in the moment before its holder writes it
      return Status::Error(Code::kAlreadyExists,
                           "a workload named `{}` is already being started{}; choose another --name", name,
                           holder > 0 ? fmt::format(" (by gpusnap pid {})", holder) : "");
    }
    if (!StillAt(fd.get(), path)) continue;
    NameClaim claim(name, path, fd.Release());
    if (auto old = FindWorkload(name); old.ok() && old->running)
      return Status::Error(Code::kAlreadyExists,
                           "a workload named `{}` is already running (pid {}); choose another --name", name, old->pid);
    std::string pid = std::to_string(::getpid());
    if (::ftruncate(claim.fd_, 0) != 0 || ::pwrite(claim.fd_, pid.data(), pid.size(), 0) < 0)
      return Status::Errno(errno, "writing `{}`", path);
    return claim;
  }
}

}  // namespace gpusnap
