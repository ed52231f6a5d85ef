#include "util/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <memory>

#include "util/fd.h"

namespace gpusnap {

namespace {

Result<std::string> ReadAll(int fd, std::string_view path) {
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno(errno, "reading `{}`", path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

Result<std::string> ReadFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno(errno, "opening `{}`", path);
  return ReadAll(fd.get(), path);
}

Result<std::string> ReadOwnerOnlyFile(const std::string& path, std::string_view what, uint64_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd.valid()) return Status::Errno(errno, "{} `{}`", what, path);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return Status::Errno(errno, "{} `{}`", what, path);
  if (!S_ISREG(st.st_mode)) return Status::Error(Code::kInvalidArgument, "{} `{}` is not a regular file", what, path);
  if (!IsOwnerOnly(st.st_mode))
    return Status::Error(Code::kInvalidArgument, "{} `{}` may be read by others (mode {:04o}): chmod 600 it", what,
                         path, st.st_mode & 07777);
  if (max_bytes != 0 && static_cast<uint64_t>(st.st_size) > max_bytes)
    return Status::Error(Code::kInvalidArgument, "{} `{}` is larger than {} bytes", what, path, max_bytes);
  return ReadAll(fd.get(), path);
}

Status WriteAll(int fd, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Errno(errno, "writing `{}`", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

Status SyncAndRenameTree(const std::string& dir, const std::string& final_dir) {
  // Directories too: a rename of a directory whose entries are not durable
  // could publish an empty one after a power loss.
  std::error_code ec;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, ec))
    if (entry.is_directory(ec)) GPUSNAP_RETURN_IF_ERROR(FsyncPath(entry.path().string()));
  GPUSNAP_RETURN_IF_ERROR(FsyncPath(dir));
  if (::rename(dir.c_str(), final_dir.c_str()) != 0)
    return Status::Errno(errno, "publishing `{}` as `{}`", dir, final_dir);
  return FsyncPath(std::filesystem::path(final_dir).parent_path().string());
}

Status WriteFileSynced(const std::string& path, std::string_view data) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return Status::Errno(errno, "creating `{}`", path);
  GPUSNAP_RETURN_IF_ERROR(WriteAll(fd.get(), data, path));
  if (::fsync(fd.get()) != 0) return Status::Errno(errno, "syncing `{}`", path);
  return Status::Ok();
}

Status FsyncPath(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno(errno, "opening `{}`", path);
  if (::fsync(fd.get()) != 0) return Status::Errno(errno, "syncing `{}`", path);
  return Status::Ok();
}

Status WriteFileAtomic(const std::string& path, std::string_view data, int mode) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
    if (!fd.valid()) return Status::Errno(errno, "creating `{}`", tmp);
    Status st = WriteAll(fd.get(), data, tmp);
    if (st.ok() && ::fsync(fd.get()) != 0) st = Status::Errno(errno, "syncing `{}`", tmp);
    if (!st.ok()) {
      ::unlink(tmp.c_str());
      return st;
    }
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return Status::Errno(err, "renaming `{}` to `{}`", tmp, path);
  }
  return FsyncPath(std::filesystem::path(path).parent_path().string());
}

// Whether `dir` exists as a directory (following symlinks); an error when
// something else is there.
static Result<bool> IsDirectory(const std::string& dir) {
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno == ENOENT) return false;
    return Status::Errno(errno, "creating directory `{}`", dir);
  }
  if (!S_ISDIR(st.st_mode)) return Status::Errno(ENOTDIR, "creating directory `{}`", dir);
  return true;
}

// Creates one directory with exactly `mode`; an existing directory is fine.
static Status MakeDir(const std::string& dir, int mode) {
  GPUSNAP_ASSIGN_OR_RETURN(bool exists, IsDirectory(dir));
  if (exists) return Status::Ok();
  if (::mkdir(dir.c_str(), static_cast<mode_t>(mode)) != 0) {
    if (errno != EEXIST) return Status::Errno(errno, "creating directory `{}`", dir);
    return IsDirectory(dir).status();  // made by someone else meanwhile
  }
  // Through a descriptor of the new directory: a path swapped for a symlink
  // in between is not followed.
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid()) return Status::Errno(errno, "opening new directory `{}`", dir);
  if (::fchmod(fd.get(), static_cast<mode_t>(mode)) != 0) return Status::Errno(errno, "chmod `{}`", dir);
  return Status::Ok();
}

Status MakeDirs(const std::string& path, int mode) {
  if (path.empty()) return Status::Error(Code::kInvalidArgument, "creating directory: empty path");
  // Each prefix ending before a '/', then the whole path.
  for (size_t end = path.find('/', 1); end != std::string::npos; end = path.find('/', end + 1)) {
    if (path[end - 1] == '/') continue;  // "a//b"
    GPUSNAP_RETURN_IF_ERROR(MakeDir(path.substr(0, end), mode));
  }
  return MakeDir(path, mode);
}

Status RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  if (ec) return Status::Errno(ec.value(), "removing `{}`", path);
  return Status::Ok();
}

Result<std::vector<std::string>> ListFilesRecursive(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  auto it = std::filesystem::recursive_directory_iterator(root, ec);
  if (ec) return Status::Errno(ec.value(), "listing `{}`", root);
  for (const auto& entry : it) {
    if (entry.is_regular_file(ec) && !entry.is_symlink(ec))
      out.push_back(std::filesystem::relative(entry.path(), root).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace gpusnap
