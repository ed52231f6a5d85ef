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
#include <thread>

#include "store/layout.h"
#include "store/origins.h"
#include "store/digest.h"
#include "store/snapshot_tree.h"
#include "util/files.h"

namespace gpusnap {

namespace {
constexpr std::string_view kTmpPrefix = ".tmp-";
// A snapshot being removed: `.tmp-.rm-<id>`, a name no writer's `.tmp-<id>`
// can have (ids never start with '.').
constexpr std::string_view kRemovingPrefix = ".tmp-.rm-";

// The files of the snapshot directory `dir` to digest, after checking every
// entry against the format (and against `listed`, for a published one).
Result<std::vector<std::string>> CheckedFiles(const std::string& dir, const std::map<std::string, FileDigest>* listed) {
  GPUSNAP_ASSIGN_OR_RETURN(auto entries, ListSnapshotEntries(dir));
  return CheckSnapshotEntries(entries, listed);
}

// Reads `path` if it is a regular file; a link is not followed, and a FIFO
// does not block the reader (`gpusnap ls` must not hang on one).
Result<std::string> ReadRegularFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid() && errno == ELOOP)
    return Status::Error(Code::kCorruption, "`{}` is a symbolic link, not a regular file", path);
  struct stat st{};
  if (!fd.valid() || ::fstat(fd.get(), &st) != 0) return Status::Errno(errno, "reading `{}`", path);
  if (!S_ISREG(st.st_mode))
    return Status::Error(Code::kCorruption, "`{}` is {}, not a regular file", path, DescribeFileType(st.st_mode));
  std::string out;
  char buf[1 << 16];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::Errno(errno, "reading `{}`", path);
    if (n == 0) return out;
    out.append(buf, static_cast<size_t>(n));
  }
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
    bool removing = std::filesystem::path(path).filename().string().starts_with(kRemovingPrefix);
    out.push_back({path, ::flock(fd, LOCK_SH | LOCK_NB) != 0, removing});
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
  // Between the mkdir and the lock, a CleanStaleTemporaries (another
  // checkpoint's, an rm's) may have taken the unlocked directory for stale.
  struct stat locked{}, now{};
  if (::fstat(fd.get(), &locked) != 0 || ::lstat(tmp.c_str(), &now) != 0 || locked.st_ino != now.st_ino ||
      locked.st_dev != now.st_dev)
    return Status::Error(Code::kFailedPrecondition, "`{}` was removed as stale while being created; try again", tmp);
  return PendingSnapshot(id, tmp, final_dir, std::move(fd));
}

PendingSnapshot::~PendingSnapshot() {
  if (!published_ && !tmp_dir_.empty() && lock_fd_.valid()) (void)RemoveTree(tmp_dir_);
}

Status PendingSnapshot::Publish(SnapshotMeta& meta) {
  meta.digest = kDigestAlgorithm;
  // CRIU's accounting files (format.h) are left out; CRIU may still be
  // writing them.
  GPUSNAP_ASSIGN_OR_RETURN(auto names, CheckedFiles(tmp_dir_, nullptr));
  GPUSNAP_ASSIGN_OR_RETURN(meta.files, DigestFiles(tmp_dir_, names, /*sync=*/true));
  meta.total_bytes = 0;
  for (const auto& [_, d] : meta.files) meta.total_bytes += d.size;
  std::string meta_path = tmp_dir_ + "/" + SnapshotFiles::kMetaFile;
  GPUSNAP_RETURN_IF_ERROR(WriteFileSynced(meta_path, SnapshotMetaToJson(meta)));
  Status moved = SyncAndRenameTree(tmp_dir_, final_dir_);
  // Renamed even if the parent's sync then failed: the directory is no longer ours to delete.
  published_ = ::access(tmp_dir_.c_str(), F_OK) != 0;
  return moved;
}

Result<SnapshotMeta> Store::Load(const std::string& id) const {
  if (!IsValidSnapshotId(id)) return Status::Error(Code::kInvalidArgument, "invalid snapshot id `{}`", id);
  std::string path = SnapshotDir(id) + "/" + SnapshotFiles::kMetaFile;
  if (::access(SnapshotDir(id).c_str(), F_OK) != 0)
    return Status::Error(Code::kNotFound, "no snapshot `{}` in store `{}`", id, root_);
  auto text = ReadRegularFile(path);
  if (!text.ok()) return Status::Error(Code::kCorruption, "snapshot `{}`: {}", id, text.status().message());
  auto meta = SnapshotMetaFromJson(*text);
  if (!meta.ok()) return meta.status().Wrap(fmt::format("snapshot `{}`", id));
  if (meta->id != id)
    return Status::Error(Code::kCorruption, "snapshot `{}`: metadata names a different id `{}`", id, meta->id);
  if (auto chunk = DigestChunkBytes(meta->digest); !chunk.ok())
    return Status::Error(Code::kCorruption, "snapshot `{}`: metadata: field `digest`: {}", id, chunk.status().message());
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

Status Store::Verify(const SnapshotMeta& meta, const std::string& at, const DigestPace& pace) const {
  std::string dir = at.empty() ? SnapshotDir(meta.id) : at;
  auto context = fmt::format("snapshot `{}`", meta.id);
  auto names = CheckedFiles(dir, &meta.files);
  if (!names.ok()) return names.status().Wrap(context);
  GPUSNAP_ASSIGN_OR_RETURN(uint64_t chunk_bytes, DigestChunkBytes(meta.digest));
  auto actual = DigestFiles(dir, *names, /*sync=*/false, 0, chunk_bytes, pace);
  if (!actual.ok()) return actual.status().Wrap(context);
  for (const auto& [name, want] : meta.files) {
    const FileDigest& got = actual->at(name);
    if (got.size != want.size)
      return Status::Error(Code::kCorruption, "snapshot `{}`: file `{}` has {} bytes, expected {}", meta.id, name,
                           got.size, want.size);
    if (got.sha256 != want.sha256)
      return Status::Error(Code::kCorruption, "snapshot `{}`: file `{}` does not match its digest (sha256 {}, expected {})",
                           meta.id, name, got.sha256, want.sha256);
  }
  return Status::Ok();
}

Status Store::Remove(const std::string& id, int wait_ms) const {
  if (!IsValidSnapshotId(id)) return Status::Error(Code::kInvalidArgument, "invalid snapshot id `{}`", id);
  std::string dir = SnapshotDir(id);
  if (::access(dir.c_str(), F_OK) != 0) return Status::Error(Code::kNotFound, "no snapshot `{}` in store `{}`", id, root_);
  // The writer of a snapshot holds its lock past the publish, until CRIU has
  // finished (it writes its accounting files into the directory after the
  // publish): removing it meanwhile would race those writes and leave what
  // they created behind. So wait for the writer, and keep the lock while
  // deleting, so that no CleanStaleTemporaries deletes along with us.
  // (Not a directory, it has no writer: no lock to wait for, and it goes as it is.)
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd.valid() && errno != ELOOP && errno != ENOTDIR) return Status::Errno(errno, "opening `{}`", dir);
  if (fd.valid()) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
      if (errno == EINTR) continue;
      if (errno != EWOULDBLOCK) return Status::Errno(errno, "locking `{}`", dir);
      if (std::chrono::steady_clock::now() >= deadline)
        return Status::Error(Code::kTimeout,
                             "snapshot `{}` is still held by the checkpoint that wrote it (waited {} ms for it to "
                             "finish); remove it when that checkpoint has ended",
                             id, wait_ms);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // Another rm may have taken the directory away while we waited.
    struct stat locked{}, now{};
    if (::fstat(fd.get(), &locked) != 0 || ::lstat(dir.c_str(), &now) != 0 || locked.st_ino != now.st_ino ||
        locked.st_dev != now.st_dev)
      return Status::Error(Code::kNotFound, "no snapshot `{}` in store `{}`", id, root_);
  }
  // A leftover of an interrupted removal of the same id would block the rename.
  CleanStaleTemporaries();
  std::string doomed = SnapshotsDir() + "/" + std::string(kRemovingPrefix) + id;
  if (::rename(dir.c_str(), doomed.c_str()) != 0) return Status::Errno(errno, "removing `{}`", dir);
  // What the snapshot was pulled from or pushed as goes with it: another one
  // of the same id is none of those manifests.
  if (std::string origins = OriginsPath(root_, id); ::unlink(origins.c_str()) != 0 && errno != ENOENT)
    return Status::Errno(errno, "removing `{}`", origins);
  return RemoveTree(doomed);
}

}  // namespace gpusnap
