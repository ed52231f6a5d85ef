#include "store/snapshot_tree.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "store/layout.h"

namespace gpusnap {

namespace {

mode_t ModeOf(std::filesystem::file_type t) {
  using std::filesystem::file_type;
  switch (t) {
    case file_type::regular: return S_IFREG;
    case file_type::directory: return S_IFDIR;
    case file_type::symlink: return S_IFLNK;
    case file_type::fifo: return S_IFIFO;
    case file_type::socket: return S_IFSOCK;
    case file_type::character: return S_IFCHR;
    case file_type::block: return S_IFBLK;
    default: return 0;
  }
}

// The format's directories are at the top: checkpoint/, gpu/ and caches/.
bool IsFormatDirectory(std::string_view path) {
  return path == SnapshotFiles::kCheckpointDir || path == SnapshotFiles::kGpuDir || path == SnapshotFiles::kCachesDir;
}

}  // namespace

std::string DescribeFileType(mode_t type) {
  switch (type & S_IFMT) {
    case S_IFREG: return "a regular file";
    case S_IFDIR: return "a directory";
    case S_IFLNK: return "a symbolic link";
    case S_IFIFO: return "a FIFO";
    case S_IFSOCK: return "a socket";
    case S_IFCHR: return "a character device";
    case S_IFBLK: return "a block device";
    default: return "of unknown type";
  }
}

Result<std::vector<SnapshotEntry>> ListSnapshotEntries(const std::string& dir) {
  struct stat st{};
  if (::lstat(dir.c_str(), &st) != 0) return Status::Errno(errno, "listing `{}`", dir);
  if (!S_ISDIR(st.st_mode))
    return Status::Error(Code::kCorruption, "`{}` is {}, not a directory", dir, DescribeFileType(st.st_mode));
  std::vector<SnapshotEntry> out;
  std::error_code ec;
  // The iterator does not descend through links to directories; the entry's
  // own type (symlink_status) is what is checked.
  std::filesystem::recursive_directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    auto status = it->symlink_status(type_ec);
    if (type_ec) return Status::Errno(type_ec.value(), "reading the type of `{}`", it->path().string());
    out.push_back({it->path().lexically_relative(dir).string(), ModeOf(status.type())});
  }
  if (ec) return Status::Errno(ec.value(), "listing `{}`", dir);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.path < b.path; });
  return out;
}

Result<std::vector<std::string>> CheckSnapshotEntries(const std::vector<SnapshotEntry>& entries,
                                                      const std::map<std::string, FileDigest>* listed) {
  std::vector<std::string> files;
  std::set<std::string> regular;
  for (const auto& e : entries) {
    if (S_ISDIR(e.type)) {
      if (!IsFormatDirectory(e.path))
        return Status::Error(Code::kCorruption,
                             "`{}` is a directory where the format has none (it has only `{}/`, `{}/` and `{}/`)",
                             e.path, SnapshotFiles::kCheckpointDir, SnapshotFiles::kGpuDir, SnapshotFiles::kCachesDir);
      continue;
    }
    if (!S_ISREG(e.type))
      return Status::Error(Code::kCorruption, "`{}` is {}, not a regular file", e.path, DescribeFileType(e.type));
    regular.insert(e.path);
    if (e.path != SnapshotFiles::kMetaFile && !SnapshotFiles::IsCriuAccountingFile(e.path)) files.push_back(e.path);
  }
  if (listed != nullptr) {
    for (const auto& [name, _] : *listed)
      if (!regular.count(name)) return Status::Error(Code::kCorruption, "file `{}` is missing", name);
    for (const auto& name : files)
      if (!listed->count(name)) return Status::Error(Code::kCorruption, "unexpected file `{}`", name);
  }
  return files;
}

}  // namespace gpusnap
