#include "host/huge_pages.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>

#include "util/fd.h"
#include "util/files.h"

namespace gpusnap::host {

namespace {

constexpr const char* kAlways = "always";

// The windows' bookkeeping lock, held while one opens or closes.
Result<UniqueFd> LockDir(const std::string& dir) {
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  std::string path = dir + "/lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!fd.valid()) return Status::Errno(errno, "opening `{}`", path);
  if (::flock(fd.get(), LOCK_EX) != 0) return Status::Errno(errno, "locking `{}`", path);
  return fd;
}

// Holder files someone still locks; the others (their holder died) go.
int LiveHolders(const std::string& dir) {
  int live = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (!name.starts_with("holder-")) continue;
    UniqueFd fd(::open(e.path().c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) continue;
    if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      ++live;
      continue;
    }
    ::unlink(e.path().c_str());
  }
  return live;
}

Status WriteMode(const std::string& thp_file, const std::string& mode) {
  UniqueFd fd(::open(thp_file.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno(errno, "opening `{}` to set transparent huge pages to `{}`", thp_file, mode);
  if (::write(fd.get(), mode.data(), mode.size()) != static_cast<ssize_t>(mode.size()))
    return Status::Errno(errno, "setting transparent huge pages to `{}` in `{}`", mode, thp_file);
  return Status::Ok();
}

}  // namespace

std::string ThpFile() {
  const char* f = std::getenv("GPUSNAP_THP_FILE");
  return f && *f ? f : "/sys/kernel/mm/transparent_hugepage/enabled";
}

std::string ThpMode(std::string_view text) {
  auto open = text.find('['), close = text.find(']');
  if (open != std::string_view::npos && close != std::string_view::npos && close > open)
    return std::string(text.substr(open + 1, close - open - 1));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  return std::string(text);
}

Result<HugePagesWindow> HugePagesWindow::Open(const std::string& thp_file, const std::string& dir) {
  static std::atomic<int> counter{0};
  GPUSNAP_ASSIGN_OR_RETURN(UniqueFd lock, LockDir(dir));
  std::string saved = dir + "/saved";
  if (LiveHolders(dir) == 0) {
    // The first window: the host's mode, unless a window a crash left open saved it already.
    if (::access(saved.c_str(), F_OK) != 0) {
      GPUSNAP_ASSIGN_OR_RETURN(std::string text, ReadFile(thp_file));
      GPUSNAP_RETURN_IF_ERROR(WriteFileAtomic(saved, ThpMode(text) + "\n", 0600));
    }
    GPUSNAP_RETURN_IF_ERROR(WriteMode(thp_file, kAlways));
  }
  GPUSNAP_ASSIGN_OR_RETURN(LockFile holder,
                           LockFile::TryAcquire(fmt::format("{}/holder-{}-{}", dir, ::getpid(), counter++)));
  return HugePagesWindow(thp_file, dir, std::move(holder));
}

Status HugePagesWindow::Close() {
  if (!holder_) return Status::Ok();
  GPUSNAP_ASSIGN_OR_RETURN(UniqueFd lock, LockDir(dir_));
  holder_.reset();
  if (LiveHolders(dir_) > 0) return Status::Ok();
  std::string saved = dir_ + "/saved";
  auto mode = ReadFile(saved);
  if (!mode.ok()) return Status::Ok();  // nothing saved: nothing to put back
  GPUSNAP_RETURN_IF_ERROR(WriteMode(thp_file_, ThpMode(*mode)).Wrap("putting the host's transparent huge pages back"));
  ::unlink(saved.c_str());
  return Status::Ok();
}

}  // namespace gpusnap::host
