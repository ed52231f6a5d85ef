#include "store/store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include "store/layout.h"
#include "store/digest.h"
#include "util/files.h"

namespace gpusnap {

namespace {
constexpr std::string_view kTmpPrefix = ".tmp-";

// Hashes every file under `dir` except gpusnap.json, syncing each on the way
// (CRIU writes its images without fsync).
Result<std::map<std::string, FileDigest>> DigestTree(const std::string& dir, bool sync, std::string_view algorithm) {
  GPUSNAP_ASSIGN_OR_RETURN(auto names, ListFilesRecursive(dir));
  std::erase_if(names, [](const std::string& n) { return n == SnapshotFiles::kMetaFile || SnapshotFiles::IsCriuAccountingFile(n); });
  GPUSNAP_ASSIGN_OR_RETURN(uint64_t chunk_bytes, DigestChunkBytes(algorithm));
  return DigestFiles(dir, names, sync, 0, chunk_bytes);
}
}  // namespace

std::string NewSnapshotId(std::string_view prefix) {
  auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  struct tm tm{};
  gmtime_r(&now, &tm);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  std::random_device rd;
  std::string p(prefix.substr(0, 40));
  return fmt::format("{}-{}-{:04x}", p.empty() ? "snap" : p, stamp, rd() & 0xffff);
}

Result<Store> Store::Open(const std::string& root, bool for_writing) {
  if (root.empty()) return Status::Error(Code::kInvalidArgument, "empty store path");
  Store store(std::filesystem::absolute(root).lexically_normal().string());
  if (!for_writing) {
    struct stat st{};
    if (::stat(store.root_.c_str(), &st) != 0) return Status::Errno(errno, "store `{}`", store.root_);
    return store;
  }
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(store.SnapshotsDir()).Wrap("store is not writable"));
  if (::access(store.SnapshotsDir().c_str(), W_OK) != 0)
    return Status::Errno(errno, "store `{}` is not writable", store.root_);
  return store;
}

namespace {
// Calls fn(path, fd) for every temporary directory, with fd open on it.
template <typename Fn>
void ForEachTemporary(const std::string& snapshots_dir, Fn fn) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(snapshots_dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(kTmpPrefix, 0) != 0) continue;
    UniqueFd fd(::open(entry.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd.valid()) fn(entry.path().string(), fd.get());
  }
}
}  // namespace

int Store::CleanStaleTemporaries() const {
  int removed = 0;
  ForEachTemporary(SnapshotsDir(), [&](const std::string& path, int fd) {
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) return;  // a live writer holds it
    if (RemoveTree(path).ok()) ++removed;
  });
  return removed;
}

std::vector<Store::Temporary> Store::ListTemporaries() const {
  std::vector<Temporary> out;
  // A lock we can take is one no writer holds; closing the descriptor drops it.
  ForEachTemporary(SnapshotsDir(), [&](const std::string& path, int fd) {
    out.push_back({path, ::flock(fd, LOCK_SH | LOCK_NB) != 0});
  });
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.dir < b.dir; });
  return out;
}

Result<PendingSnapshot> Store::Begin(const std::string& id) const {
  if (!IsValidSnapshotId(id)) return Status::Error(Code::kInvalidArgument, "invalid snapshot id `{}`", id);
  std::string final_dir = SnapshotDir(id);
  if (::access(final_dir.c_str(), F_OK) == 0) return Status::Error(Code::kAlreadyExists, "snapshot `{}` already exists", id);
  std::string tmp = SnapshotsDir() + "/" + std::string(kTmpPrefix) + id;
  if (::mkdir(tmp.c_str(), 0700) != 0) return Status::Errno(errno, "creating `{}`", tmp);
  UniqueFd fd(::open(tmp.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid() || ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    int err = errno;
    ::rmdir(tmp.c_str());
    return Status::Errno(err, "locking `{}`", tmp);
  }
  return PendingSnapshot(id, tmp, final_dir, std::move(fd));
}

PendingSnapshot::~PendingSnapshot() {
  if (!published_ && !tmp_dir_.empty() && lock_fd_.valid()) (void)RemoveTree(tmp_dir_);
}

Status PendingSnapshot::Publish(SnapshotMeta& meta) {
  meta.digest = kDigestAlgorithm;
  GPUSNAP_ASSIGN_OR_RETURN(meta.files, DigestTree(tmp_dir_, /*sync=*/true, meta.digest));
  meta.total_bytes = 0;
  for (const auto& [_, d] : meta.files) meta.total_bytes += d.size;
  std::string meta_path = tmp_dir_ + "/" + SnapshotFiles::kMetaFile;
  GPUSNAP_RETURN_IF_ERROR(WriteFileSynced(meta_path, SnapshotMetaToJson(meta)));
  // Directories too: a rename of a directory whose entries are not durable
  // could publish an empty snapshot after a power loss.
  std::error_code ec;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(tmp_dir_, ec))
    if (entry.is_directory(ec)) GPUSNAP_RETURN_IF_ERROR(FsyncPath(entry.path().string()));
  GPUSNAP_RETURN_IF_ERROR(FsyncPath(tmp_dir_));
  if (::rename(tmp_dir_.c_str(), final_dir_.c_str()) != 0)
    return Status::Errno(errno, "publishing `{}` as `{}`", tmp_dir_, final_dir_);
  published_ = true;
  return FsyncPath(std::filesystem::path(final_dir_).parent_path().string());
}

Result<SnapshotMeta> Store::Load(const std::string& id) const {
  if (!IsValidSnapshotId(id)) return Status::Error(Code::kInvalidArgument, "invalid snapshot id `{}`", id);
  std::string path = SnapshotDir(id) + "/" + SnapshotFiles::kMetaFile;
  if (::access(SnapshotDir(id).c_str(), F_OK) != 0)
    return Status::Error(Code::kNotFound, "no snapshot `{}` in store `{}`", id, root_);
  auto text = ReadFile(path);
  if (!text.ok()) return Status::Error(Code::kCorruption, "snapshot `{}`: {}", id, text.status().message());
  auto meta = SnapshotMetaFromJson(*text);
  if (!meta.ok()) return meta.status().Wrap(fmt::format("snapshot `{}`", id));
  if (meta->id != id)
    return Status::Error(Code::kCorruption, "snapshot `{}`: metadata names a different id `{}`", id, meta->id);
  return meta;
}

Result<std::vector<SnapshotMeta>> Store::List(std::vector<std::string>* warnings) const {
  std::vector<SnapshotMeta> out;
  std::error_code ec;
  auto it = std::filesystem::directory_iterator(SnapshotsDir(), ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return out;
    return Status::Errno(ec.value(), "listing `{}`", SnapshotsDir());
  }
  for (const auto& entry : it) {
    std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || !entry.is_directory(ec)) continue;
    auto meta = Load(name);
    if (meta.ok()) out.push_back(std::move(meta).value());
    else if (warnings) warnings->push_back(meta.status().message());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.created != b.created ? a.created < b.created : a.id < b.id;
  });
  return out;
}

Status Store::Verify(const SnapshotMeta& meta) const {
  std::string dir = SnapshotDir(meta.id);
  GPUSNAP_ASSIGN_OR_RETURN(auto actual, DigestTree(dir, /*sync=*/false, meta.digest));
  for (const auto& [name, want] : meta.files) {
    auto it = actual.find(name);
    if (it == actual.end())
      return Status::Error(Code::kCorruption, "snapshot `{}`: file `{}` is missing", meta.id, name);
    if (it->second.size != want.size)
      return Status::Error(Code::kCorruption, "snapshot `{}`: file `{}` has {} bytes, expected {}", meta.id, name,
                           it->second.size, want.size);
    if (it->second.sha256 != want.sha256)
      return Status::Error(Code::kCorruption, "snapshot `{}`: file `{}` does not match its digest (sha256 {}, expected {})",
                           meta.id, name, it->second.sha256, want.sha256);
  }
  for (const auto& [name, _] : actual)
    if (!meta.files.count(name))
      return Status::Error(Code::kCorruption, "snapshot `{}`: unexpected file `{}`", meta.id, name);
  return Status::Ok();
}

Status Store::Remove(const std::string& id) const {
  if (!IsValidSnapshotId(id)) return Status::Error(Code::kInvalidArgument, "invalid snapshot id `{}`", id);
  std::string dir = SnapshotDir(id);
  if (::access(dir.c_str(), F_OK) != 0) return Status::Error(Code::kNotFound, "no snapshot `{}` in store `{}`", id, root_);
  std::string doomed = SnapshotsDir() + "/" + std::string(kTmpPrefix) + "rm-" + id;
  if (::rename(dir.c_str(), doomed.c_str()) != 0) return Status::Errno(errno, "removing `{}`", dir);
  return RemoveTree(doomed);
}

}  // namespace gpusnap
