// gpusnap pull: a snapshot from a registry into the store. Every blob is
// checked against its digest as it streams and lands under its final name
// only once it matched; the files of the snapshot gather in a staging
// directory (<store>/pulls/<manifest digest>/) that an interruption leaves
// for the next pull to go on from (a file cut off part-way goes on with a
// Range request), chunks go straight into the chunk store (content-addressed:
// one there already is not fetched). The snapshot appears in the store with
// one rename, once all is there: nothing half-pulled is ever seen by `ls` or
// a restore.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <thread>

#include "gpushare/common/chunk_store.h"
#include "gpushare/control/chunk_lock.h"
#include "gpusnap/distribution.h"
#include "registry/artifact.h"
#include "registry/client.h"
#include "registry/reference.h"
#include "registry/snapshot_blobs.h"
#include "registry/transfer.h"
#include "store/layout.h"
#include "store/sha256.h"
#include "store/snapshot_tree.h"
#include "store/store.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/lock_file.h"

namespace gpusnap {

namespace {

using registry::ArtifactChunk;
using registry::ArtifactFile;
using registry::Blob;
using registry::RegistryClient;

constexpr uint64_t kMaxConfigBytes = 16 << 20;

Status Mismatch(const std::string& ref, const Blob& blob, const std::string& what, const std::string& got) {
  return Status::Error(Code::kCorruption, "`{}`: blob {} ({}) does not match its digest (its bytes hash to sha256:{}); "
                       "not stored", ref, blob.digest, what, got);
}

Status WriteAll(int fd, const char* data, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::Errno(errno, "writing `{}`", path);
    data += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// The config blob: small, fetched whole.
Result<std::string> FetchConfig(RegistryClient& client, const std::string& repo, const Blob& blob,
                                const std::string& ref) {
  if (blob.size > kMaxConfigBytes)
    return Status::Error(Code::kInvalidArgument, "`{}`: its gpusnap.json is {} bytes, more than gpusnap reads", ref,
                         blob.size);
  std::string bytes;
  GPUSNAP_RETURN_IF_ERROR(client
                              .FetchBlob(repo, blob, 0,
                                         [&bytes](const char* d, size_t n) {
                                           if (bytes.size() + n > kMaxConfigBytes) return false;
                                           bytes.append(d, n);
                                           return true;
                                         })
                              .status());
  if (std::string got = Sha256Hex(bytes); registry::BlobDigest(got) != blob.digest || bytes.size() != blob.size)
    return Mismatch(ref, blob, "gpusnap.json", got);
  return bytes;
}

// A file of the snapshot into the staging directory, going on from what an
// interrupted pull left in <file>.part.
Status FetchFile(RegistryClient& client, const std::string& repo, const std::string& staging, const ArtifactFile& f,
                 const std::string& ref, registry::TransferMeter& meter) {
  std::string final_path = staging + "/" + f.path;
  struct stat st{};
  if (::lstat(final_path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && uint64_t(st.st_size) == f.blob.size) {
    meter.BlobSkipped(f.blob.size);  // matched its digest before it got its name
    return Status::Ok();
  }
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(std::filesystem::path(final_path).parent_path().string(), 0700));
  std::string part = final_path + ".part";
  UniqueFd fd(::open(part.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return Status::Errno(errno, "opening `{}`", part);
  Sha256 hash;
  uint64_t have = 0;
  if (::fstat(fd.get(), &st) == 0 && st.st_size > 0 && uint64_t(st.st_size) <= f.blob.size) {
    std::vector<char> buf(4 << 20);
    while (have < uint64_t(st.st_size)) {
      ssize_t n = ::pread(fd.get(), buf.data(), std::min<uint64_t>(buf.size(), st.st_size - have), off_t(have));
      if (n <= 0) break;
      hash.Update(buf.data(), size_t(n));
      have += uint64_t(n);
    }
  }
  auto restart = [&] {
    hash = Sha256();
    have = 0;
    return ::ftruncate(fd.get(), 0) == 0 && ::lseek(fd.get(), 0, SEEK_SET) == 0;
  };
  if (have != uint64_t(st.st_size) && !restart()) return Status::Errno(errno, "truncating `{}`", part);
  if (::lseek(fd.get(), off_t(have), SEEK_SET) < 0) return Status::Errno(errno, "seeking `{}`", part);
  Status written;
  auto append = [&](const char* data, size_t n) {
    if (have + n > f.blob.size) {
      written = Status::Error(Code::kCorruption, "`{}`: blob {} ({}) is longer than its {} bytes; not stored", ref,
                              f.blob.digest, f.path, f.blob.size);
      return false;
    }
    written = WriteAll(fd.get(), data, n, part);
    if (!written.ok()) return false;
    hash.Update(data, n);
    have += n;
    meter.Moved(n);
    return true;
  };
  uint64_t resumed_from = have;
  auto got = client.FetchBlob(repo, f.blob, have, append);
  if (got.ok() && *got == 0 && resumed_from > 0) {
    // The registry ignored the Range and sent the blob from its start, after
    // the bytes already here: start over.
    if (!restart()) return Status::Errno(errno, "truncating `{}`", part);
    got = client.FetchBlob(repo, f.blob, 0, append);
  }
  if (!written.ok()) {
    if (written.code() == Code::kCorruption) ::unlink(part.c_str());
    return written;
  }
  GPUSNAP_RETURN_IF_ERROR(got.status().Wrap(f.path));
  std::string hex = hash.HexFinal();
  if (have != f.blob.size || registry::BlobDigest(hex) != f.blob.digest) {
    ::unlink(part.c_str());
    if (have != f.blob.size)
      return Status::Error(Code::kCorruption, "`{}`: blob {} ({}) ended after {} of its {} bytes; not stored", ref,
                           f.blob.digest, f.path, have, f.blob.size);
    return Mismatch(ref, f.blob, f.path, hex);
  }
  if (::fdatasync(fd.get()) != 0) return Status::Errno(errno, "syncing `{}`", part);
  if (::rename(part.c_str(), final_path.c_str()) != 0) return Status::Errno(errno, "renaming `{}`", part);
  meter.BlobMoved();
  return Status::Ok();
}

// A chunk into the chunk store, checked twice: the bytes against the blob's
// SHA-256 as they stream, then against the XXH3 name the artifact maps it to.
Status FetchChunk(RegistryClient& client, const std::string& repo, const gpushare::ChunkStore& chunks,
                  const ArtifactChunk& c, const std::string& ref, registry::TransferMeter& meter,
                  std::vector<std::string>& written_paths, Mutex& written_mu) {
  if (c.blob.size == 0 || c.blob.size > gpushare::kChunkBytes)
    return Status::Error(Code::kInvalidArgument, "`{}`: chunk {} is {} bytes, not 1..{}", ref, c.xxh3, c.blob.size,
                         gpushare::kChunkBytes);
  std::vector<char> buf(c.blob.size);
  uint64_t have = 0;
  Sha256 hash;
  auto got = client.FetchBlob(repo, c.blob, 0, [&](const char* data, size_t n) {
    if (have + n > buf.size()) return false;
    std::memcpy(buf.data() + have, data, n);
    hash.Update(data, n);
    have += n;
    meter.Moved(n);
    return true;
  });
  GPUSNAP_RETURN_IF_ERROR(got.status().Wrap(fmt::format("chunk {}", c.xxh3)));
  std::string hex = hash.HexFinal();
  if (have != c.blob.size || registry::BlobDigest(hex) != c.blob.digest)
    return Mismatch(ref, c.blob, fmt::format("chunk {}", c.xxh3), hex);
  gpushare::ChunkDigest name = gpushare::ComputeChunkDigest(buf.data(), have);
  if (gpushare::DigestHex(name) != c.xxh3)
    return Status::Error(Code::kCorruption, "`{}`: blob {} is mapped to chunk {}, but its bytes are chunk {}; not stored",
                         ref, c.blob.digest, c.xxh3, gpushare::DigestHex(name));
  gpushare::SaveStats stats;
  GPUSNAP_RETURN_IF_ERROR(chunks.SaveChunk(buf.data(), have, &stats).status());
  if (stats.chunks_written) {
    MutexLock lock(written_mu);
    written_paths.push_back(chunks.ChunkPath(name));
  }
  meter.BlobMoved();
  return Status::Ok();
}

// Waits for another pull of the same manifest to finish.
Result<LockFile> TakeTurn(const std::string& path, int timeout_s, const ProgressFn& progress) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  bool said = false;
  for (;;) {
    auto lock = LockFile::TryAcquire(path);
    if (lock.ok() || lock.status().code() != Code::kAlreadyExists) return lock;
    if (!said && progress) progress({"waiting for another pull of the same snapshot", 0, 0, false});
    said = true;
    if (std::chrono::steady_clock::now() > deadline)
      return Status::Error(Code::kTimeout, "another pull of the same snapshot held `{}` for {} s", path, timeout_s);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

Status CheckFilesMatch(const registry::Artifact& a, const SnapshotMeta& meta, const std::string& ref) {
  if (a.files.size() != meta.files.size())
    return Status::Error(Code::kCorruption, "`{}`: the artifact has {} files, its gpusnap.json lists {}", ref,
                         a.files.size(), meta.files.size());
  for (const ArtifactFile& f : a.files) {
    auto it = meta.files.find(f.path);
    if (it == meta.files.end())
      return Status::Error(Code::kCorruption, "`{}`: the artifact has file `{}`, which its gpusnap.json does not list",
                           ref, f.path);
    if (it->second.size != f.blob.size)
      return Status::Error(Code::kCorruption, "`{}`: file `{}` is {} bytes in the artifact, {} in its gpusnap.json", ref,
                           f.path, f.blob.size, it->second.size);
  }
  return Status::Ok();
}

Status Publish(const std::string& staging, const std::string& final_dir, const std::string& meta_json) {
  GPUSNAP_RETURN_IF_ERROR(WriteFileSynced(staging + "/" + SnapshotFiles::kMetaFile, meta_json));
  std::error_code ec;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(staging, ec))
    if (entry.is_directory(ec)) GPUSNAP_RETURN_IF_ERROR(FsyncPath(entry.path().string()));
  GPUSNAP_RETURN_IF_ERROR(FsyncPath(staging));
  if (::rename(staging.c_str(), final_dir.c_str()) != 0) {
    if (errno == EEXIST || errno == ENOTEMPTY)
      return Status::Error(Code::kAlreadyExists, "a snapshot `{}` appeared in the store meanwhile",
                           std::filesystem::path(final_dir).filename().string());
    return Status::Errno(errno, "publishing `{}` as `{}`", staging, final_dir);
  }
  return FsyncPath(std::filesystem::path(final_dir).parent_path().string());
}

}  // namespace

Result<TransferResult> Pull(const PullOptions& o) {
  // 1. The manifest and the snapshot's metadata, both checked.
  GPUSNAP_ASSIGN_OR_RETURN(registry::Reference ref, registry::ParseReference(o.reference));
  const std::string& r = o.reference;
  if (!o.as_id.empty() && !IsValidSnapshotId(o.as_id))
    return Status::Error(Code::kInvalidArgument, "invalid snapshot id `{}` (--as)", o.as_id);
  GPUSNAP_ASSIGN_OR_RETURN(Store store, Store::Open(o.store, true));
  GPUSNAP_ASSIGN_OR_RETURN(auto client, RegistryClient::Create(ref.host, {o.access.credentials_file, o.access.ca_file,
                                                                         o.access.plain_http, o.access.timeout_s}));
  GPUSNAP_ASSIGN_OR_RETURN(registry::Manifest manifest, client->GetManifest(ref.repository, ref.ManifestName()));
  GPUSNAP_ASSIGN_OR_RETURN(registry::Artifact artifact, registry::ParseManifest(manifest.bytes, manifest.media_type, r));

  // 2. One pull of a manifest at a time, taken before any blob moves: the
  // second finds the snapshot in place, its gpusnap.json being the config
  // blob itself when it keeps its own id, and downloads nothing.
  std::string hex = manifest.digest.substr(7);
  std::string pulls = store.root() + "/pulls";
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(pulls, 0700));
  GPUSNAP_ASSIGN_OR_RETURN(LockFile turn, TakeTurn(pulls + "/" + hex + ".lock", 3600, o.progress));
  TransferResult result;
  result.reference = r;
  result.manifest_digest = manifest.digest;
  if (std::string own = artifact.snapshot_id; IsValidSnapshotId(own) && (o.as_id.empty() || o.as_id == own)) {
    auto bytes = ReadFile(store.SnapshotDir(own) + "/" + SnapshotFiles::kMetaFile);
    if (bytes.ok() && registry::BlobDigest(Sha256Hex(*bytes)) == artifact.config.digest && store.Load(own).ok()) {
      result.id = own;
      result.already_present = true;
      result.blobs = 1 + artifact.files.size() + artifact.chunks.size();
      return result;
    }
  }

  GPUSNAP_ASSIGN_OR_RETURN(std::string config, FetchConfig(*client, ref.repository, artifact.config, r));
  auto parsed = SnapshotMetaFromJson(config);
  if (!parsed.ok()) return parsed.status().Wrap(fmt::format("`{}`: its gpusnap.json", r));
  SnapshotMeta meta = std::move(parsed).value();
  GPUSNAP_RETURN_IF_ERROR(CheckFilesMatch(artifact, meta, r));
  std::string id = o.as_id.empty() ? meta.id : o.as_id;
  std::string meta_json = config;
  if (id != meta.id) {
    meta.id = id;
    meta_json = SnapshotMetaToJson(meta);
  }

  // The snapshot may be here already, under another id (--as).
  result.id = id;
  if (auto here = store.Load(id); here.ok()) {
    auto bytes = ReadFile(store.SnapshotDir(id) + "/" + SnapshotFiles::kMetaFile);
    if (bytes.ok() && *bytes == meta_json) {
      result.already_present = true;
      result.blobs = 1 + artifact.files.size() + artifact.chunks.size();
      return result;
    }
    return Status::Error(Code::kAlreadyExists,
                         "the store already has a snapshot `{}`, not the one `{}` names; pull it with --as NEW-ID", id, r);
  }

  // 3. The files, then the chunks their manifests name, a few at a time;
  // gc leaves the chunks alone until the snapshot names them.
  std::string staging = pulls + "/" + hex;
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(staging, 0700));
  GPUSNAP_ASSIGN_OR_RETURN(auto chunk_lock,
                           gpushare::control::ChunkStoreLock::Acquire(store.root(),
                                                                     gpushare::control::ChunkStoreLock::Mode::kShared,
                                                                     gpushare::control::kChunkWriterWaitMs));
  GPUSNAP_ASSIGN_OR_RETURN(auto chunks, gpushare::ChunkStore::Open(store.root()));
  uint64_t total = config.size();
  for (const auto& f : artifact.files) total += f.blob.size;
  std::vector<const ArtifactChunk*> missing, present;
  for (const auto& c : artifact.chunks) {
    total += c.blob.size;
    bool here = ::access((gpushare::ChunksDir(store.root()) + "/" + c.xxh3.substr(0, 2) + "/" + c.xxh3).c_str(), F_OK) == 0;
    (here ? present : missing).push_back(&c);
  }
  registry::TransferMeter meter("pull", o.progress, 1 + artifact.files.size() + artifact.chunks.size(), total);
  meter.BlobMoved();  // the config, fetched above
  meter.Moved(config.size());
  for (const ArtifactChunk* c : present) meter.BlobSkipped(c->blob.size);
  Mutex written_mu;
  std::vector<std::string> written_chunks;
  Status fetched = registry::RunEach(artifact.files.size(), o.access.jobs, [&](size_t i) {
    return FetchFile(*client, ref.repository, staging, artifact.files[i], r, meter);
  });
  if (fetched.ok()) {
    // The manifests the files brought must name only chunks the artifact has.
    auto named = registry::ChunksNamed(staging, meta);
    if (!named.ok()) fetched = named.status().Wrap(fmt::format("`{}`", r));
    std::set<std::string> in_artifact;
    for (const auto& c : artifact.chunks) in_artifact.insert(c.xxh3);
    if (fetched.ok())
      for (const std::string& c : *named)
        if (!in_artifact.contains(c)) {
          fetched = Status::Error(Code::kCorruption, "`{}`: its chunk manifests name chunk {}, which it does not hold",
                                  r, c);
          break;
        }
  }
  if (fetched.ok())
    fetched = registry::RunEach(missing.size(), o.access.jobs, [&](size_t i) {
      return FetchChunk(*client, ref.repository, chunks, *missing[i], r, meter, written_chunks, written_mu);
    });

  // 4. Publish: the format checked, gpusnap.json written, one rename.
  if (fetched.ok()) {
    auto entries = ListSnapshotEntries(staging);
    fetched = entries.ok() ? CheckSnapshotEntries(*entries, &meta.files).status() : entries.status();
    if (fetched.ok()) fetched = Publish(staging, store.SnapshotDir(id), meta_json);
  }
  if (!fetched.ok()) {
    // A full disk (or any filesystem refusal) takes back what this pull
    // wrote; a registry that went away leaves it for the next pull.
    if (fetched.code() == Code::kIoError) {
      (void)RemoveTree(staging);
      for (const std::string& p : written_chunks) ::unlink(p.c_str());
    }
    return fetched.Wrap(fmt::format("pull of `{}`", r));
  }
  meter.Finish(result);
  return result;
}

}  // namespace gpusnap
