#include "chunks/chunk_gc.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>

#include "chunks/chunk_store.h"
#include "store/layout.h"
#include "util/files.h"

namespace gpusnap::chunks {

namespace {

constexpr std::string_view kManifestSuffix = ".chunks";

bool IsLowerHex(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// What a file under chunks/ is, by its name.
enum class Kind { kChunk, kTemporary, kOther };
struct Parsed {
  Kind kind = Kind::kOther;
  std::string digest;
};

Parsed ParseChunkStoreName(std::string_view name) {
  size_t slash = name.find('/');
  if (slash == std::string_view::npos) return {};
  std::string_view dir = name.substr(0, slash), file = name.substr(slash + 1);
  if (dir.size() != 2 || !IsLowerHex(dir) || file.size() < 32) return {};
  std::string_view digest = file.substr(0, 32);
  if (!IsLowerHex(digest) || digest.substr(0, 2) != dir) return {};
  if (file.size() == 32) return {Kind::kChunk, std::string(digest)};
  if (file.substr(32).starts_with(kChunkTempInfix)) return {Kind::kTemporary, std::string(digest)};
  return {};
}

// Names of the entries of `dir` (missing: none) that end in `suffix`, sorted.
Result<std::vector<std::string>> NamesEndingIn(const std::string& dir, std::string_view suffix) {
  std::vector<std::string> out;
  std::error_code ec;
  auto it = std::filesystem::directory_iterator(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return out;
  if (ec) return Status::Errno(ec.value(), "listing `{}`", dir);
  for (const auto& entry : it) {
    std::string name = entry.path().filename().string();
    if (name.ends_with(suffix)) out.push_back(std::move(name));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A manifest to read, and whose it is (for the error that names it).
struct ManifestSource {
  std::string path;
  std::string owner;
};

Status AddDirManifests(const std::string& dir, const std::string& owner, std::vector<ManifestSource>& out) {
  GPUSNAP_ASSIGN_OR_RETURN(auto names, NamesEndingIn(dir, kManifestSuffix));
  for (const auto& n : names) out.push_back({dir + "/" + n, owner});
  return Status::Ok();
}

// Every manifest the mark reads (see chunk_gc.h).
Result<std::vector<ManifestSource>> FindManifests(const Store& store) {
  std::vector<ManifestSource> out;
  std::error_code ec;
  auto it = std::filesystem::directory_iterator(store.SnapshotsDir(), ec);
  if (ec && ec != std::errc::no_such_file_or_directory) return Status::Errno(ec.value(), "listing `{}`", store.SnapshotsDir());
  if (!ec) {
    for (const auto& entry : it) {
      std::string id = entry.path().filename().string();
      if (id.empty() || id[0] == '.' || !entry.is_directory(ec)) continue;
      auto meta = store.Load(id);
      if (!meta.ok() && meta.status().code() == Code::kNotFound) continue;  // removed meanwhile
      if (!meta.ok()) return meta.status();
      std::string owner = fmt::format("snapshot `{}`", id);
      GPUSNAP_ASSIGN_OR_RETURN(auto names, NamesEndingIn(store.SnapshotDir(id) + "/" + SnapshotFiles::kGpuDir, kManifestSuffix));
      for (const auto& rel : SnapshotManifests(*meta, names)) out.push_back({store.SnapshotDir(id) + "/" + rel, owner});
    }
  }
  for (const auto& t : store.ListTemporaries()) {
    if (!t.live || t.removing) continue;  // a removal holds its lock too
    std::string owner = fmt::format("snapshot being written `{}`", t.dir);
    GPUSNAP_RETURN_IF_ERROR(AddDirManifests(t.dir + "/" + SnapshotFiles::kGpuDir, owner, out));
  }
  std::string suspended = SuspendedRoot(store.root());
  GPUSNAP_ASSIGN_OR_RETURN(auto pids, NamesEndingIn(suspended, ""));
  for (const auto& pid : pids)
    GPUSNAP_RETURN_IF_ERROR(AddDirManifests(suspended + "/" + pid, "a process suspended in place", out));
  return out;
}

// Regular files under chunks/ (missing: none).
Result<std::vector<ChunkStoreFile>> ListChunkStore(const std::string& chunks_dir) {
  GPUSNAP_ASSIGN_OR_RETURN(auto dirs, NamesEndingIn(chunks_dir, ""));
  std::vector<ChunkStoreFile> out;
  const int64_t now = static_cast<int64_t>(::time(nullptr));
  for (const auto& d : dirs) {
    GPUSNAP_ASSIGN_OR_RETURN(auto files, NamesEndingIn(chunks_dir + "/" + d, ""));
    for (const auto& f : files) {
      std::string name = d + "/" + f;
      struct stat st{};
      if (::lstat((chunks_dir + "/" + name).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      out.push_back({name, static_cast<uint64_t>(st.st_size), now - static_cast<int64_t>(st.st_mtime),
                     static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec});
    }
  }
  return out;
}

}  // namespace

std::set<std::string> LiveChunks(const std::vector<ChunkManifest>& manifests) {
  std::set<std::string> live;
  for (const ChunkManifest& m : manifests)
    for (const ChunkedAllocation& a : m.allocations)
      for (const ChunkRef& ref : a.chunks)
        if (!ref.zero) live.insert(DigestHex(ref.digest));
  return live;
}

std::vector<std::string> SnapshotManifests(const SnapshotMeta& meta, const std::vector<std::string>& gpu_dir_names) {
  std::set<std::string> out;
  if (meta.gpu && meta.gpu->gpushare)
    for (int pid : meta.gpu->ns_pids) out.insert(ChunkManifestName(pid));
  for (const auto& n : gpu_dir_names)
    if (n.size() > kManifestSuffix.size() && n.ends_with(kManifestSuffix)) out.insert(fmt::format("{}/{}", SnapshotFiles::kGpuDir, n));
  return {out.begin(), out.end()};
}

std::vector<size_t> ChooseEvictions(const std::vector<CachedChunk>& chunks, uint64_t keep_bytes) {
  std::vector<size_t> unreferenced;
  uint64_t total = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].referenced) continue;
    unreferenced.push_back(i);
    total += chunks[i].bytes;
  }
  std::sort(unreferenced.begin(), unreferenced.end(), [&](size_t a, size_t b) {
    const CachedChunk &x = chunks[a], &y = chunks[b];
    return x.last_used_ns != y.last_used_ns ? x.last_used_ns < y.last_used_ns : x.name < y.name;
  });
  std::vector<size_t> out;
  for (size_t i : unreferenced) {
    if (total <= keep_bytes) break;
    out.push_back(i);
    total -= chunks[i].bytes;
  }
  return out;
}

GcResult DecideSweep(const std::set<std::string>& live, const std::vector<ChunkStoreFile>& files,
                     int64_t temp_max_age_s, uint64_t keep_unused_bytes) {
  GcResult r;
  r.keep_unused_bytes = keep_unused_bytes;
  std::vector<CachedChunk> chunks;
  std::vector<GcItem> temporaries;
  for (const ChunkStoreFile& f : files) {
    Parsed p = ParseChunkStoreName(f.name);
    if (p.kind == Kind::kChunk) {
      bool referenced = live.count(p.digest) != 0;
      chunks.push_back({f.name, f.size, f.mtime_ns, referenced});
      if (referenced) {
        ++r.kept_chunks;
        r.kept_bytes += f.size;
      } else {
        ++r.cached_chunks;
        r.cached_bytes += f.size;
      }
    } else if (p.kind == Kind::kTemporary && f.age_s > temp_max_age_s) {
      temporaries.push_back({f.name, f.size, "stale temporary"});
    }
  }
  const char* reason = keep_unused_bytes == 0 ? "unreferenced" : "unreferenced, least recently used";
  for (size_t i : ChooseEvictions(chunks, keep_unused_bytes)) {
    r.removed.push_back({chunks[i].name, chunks[i].bytes, reason});
    --r.cached_chunks;
    r.cached_bytes -= chunks[i].bytes;
  }
  for (GcItem& t : temporaries) r.removed.push_back(std::move(t));
  for (const GcItem& item : r.removed) r.removed_bytes += item.bytes;
  return r;
}

Result<GcResult> CollectChunks(const Store& store, const ChunkStoreLock& lock, bool dry_run,
                               uint64_t keep_unused_bytes) {
  if (lock.mode() != ChunkStoreLock::Mode::kExclusive)
    return Status::Error(Code::kInternal, "collecting chunks under a shared lock");
  if (!dry_run) store.CleanStaleTemporaries();
  auto refuse = [](const Status& st) { return st.Wrap("garbage collection refused, nothing deleted"); };

  auto sources = FindManifests(store);
  if (!sources.ok()) return refuse(sources.status());
  std::vector<ChunkManifest> manifests;
  for (const ManifestSource& m : *sources) {
    auto bytes = ReadFile(m.path);
    auto decoded = bytes.ok() ? DecodeChunkManifest(*bytes, m.path) : Result<ChunkManifest>(bytes.status());
    if (!decoded.ok()) return refuse(decoded.status().Wrap(m.owner));
    manifests.push_back(std::move(decoded).value());
  }

  const std::string chunks_dir = ChunksDir(store.root());
  GPUSNAP_ASSIGN_OR_RETURN(auto files, ListChunkStore(chunks_dir));
  GcResult r = DecideSweep(LiveChunks(manifests), files, kChunkTempMaxAgeS, keep_unused_bytes);
  r.manifests = manifests.size();
  std::set<std::string> touched_dirs;
  for (GcItem& item : r.removed) {
    touched_dirs.insert(item.path.substr(0, item.path.find('/')));
    item.path = chunks_dir + "/" + item.path;
    if (!dry_run && ::unlink(item.path.c_str()) != 0 && errno != ENOENT)
      return Status::Errno(errno, "garbage collection: removing `{}`", item.path);
  }
  // A writer creates its fan-out directory again when it needs it.
  if (!dry_run)
    for (const auto& d : touched_dirs) ::rmdir((chunks_dir + "/" + d).c_str());
  return r;
}

}  // namespace gpusnap::chunks
