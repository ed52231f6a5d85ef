// gpusnap pull: a snapshot from a registry into the store. Every blob is
// checked against its digest as it streams and lands under its final name
// only once it matched; the files of the snapshot gather in a staging
// directory (<store>/pulls/<manifest digest>/) that an interruption leaves
// for the next pull to go on from (a file cut off part-way goes on with a
// Range request), chunks go straight into the chunk store (content-addressed:
// one there already is not fetched). The snapshot appears in the store with
// one rename, once all is there: nothing half-pulled is ever seen by `ls` or
// a restore. An encrypted artifact's blobs are decrypted as they arrive, and
// nothing of them is kept before its HMAC and its plaintext's digest matched.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <filesystem>
#include <thread>

#include "chunks/chunk_lock.h"
#include "chunks/chunk_store.h"
#include "gpusnap/distribution.h"
#include "registry/artifact.h"
#include "registry/client.h"
#include "registry/encryption.h"
#include "registry/reference.h"
#include "registry/registries_conf.h"
#include "registry/snapshot_blobs.h"
#include "registry/sources.h"
#include "registry/trust_policy.h"
#include "registry/staged_pull.h"
#include "registry/transfer.h"
#include "store/digest.h"
#include "store/layout.h"
#include "store/origins.h"
#include "store/sha256.h"
#include "store/snapshot_tree.h"
#include "store/store.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/lock_file.h"
#include "util/test_hooks.h"

namespace gpusnap {

namespace {

using registry::ArtifactChunk;
using registry::ArtifactFile;
using registry::Blob;
using registry::Sources;

constexpr uint64_t kMaxConfigBytes = 16 << 20;
constexpr size_t kWriteBytes = 4 << 20;

// `from`: the place that sent the bytes, named when it is a mirror.
Status Mismatch(const std::string& ref, const Blob& blob, const std::string& what, const std::string& got,
                const registry::PullSource* from) {
  std::string sender = from && from->mirror ? fmt::format(" from {}", from->Describe()) : "";
  return Status::Error(Code::kCorruption, "`{}`: blob {} ({}){} does not match its digest (its bytes hash to "
                       "sha256:{}); not stored", ref, blob.digest, what, sender, got);
}

// The config blob: small, fetched whole.
Result<std::string> FetchConfig(Sources& sources, const Blob& blob, const std::optional<registry::OpenedBlob>& opened,
                                const std::string& ref) {
  if (blob.size > kMaxConfigBytes)
    return Status::Error(Code::kInvalidArgument, "`{}`: its gpusnap.json is {} bytes, more than gpusnap reads", ref,
                         blob.size);
  std::string bytes;
  GPUSNAP_ASSIGN_OR_RETURN(Sources::Served served, sources.FetchBlob(blob, 0, [&bytes](const char* d, size_t n) {
    if (bytes.size() + n > kMaxConfigBytes) return false;
    bytes.append(d, n);
    return true;
  }));
  if (std::string got = Sha256Hex(bytes); registry::BlobDigest(got) != blob.digest || bytes.size() != blob.size)
    return Mismatch(ref, blob, "gpusnap.json", got, served.place);
  if (opened) return registry::DecryptBlob(*opened, std::move(bytes), ref, "gpusnap.json");
  return bytes;
}

// A file of the snapshot into the staging directory, going on from what an
// interrupted pull left in <file>.part, checked against its blob's digest;
// or, when `decryption` is given, decrypted and checked by its HMAC (which
// stands for the digest: ChunkDecryption) and its plaintext's digest.
Status FetchFile(Sources& sources, const std::string& staging, const ArtifactFile& f,
                 registry::BlobDecryption* decryption, const std::string& ref, registry::TransferMeter& meter) {
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
      if (decryption)
        decryption->Replay(have, buf.data(), size_t(n));
      else
        hash.Update(buf.data(), size_t(n));
      have += uint64_t(n);
    }
  }
  auto restart = [&] {
    hash = Sha256();
    if (decryption) decryption->Reset();
    have = 0;
    return ::ftruncate(fd.get(), 0) == 0 && ::lseek(fd.get(), 0, SEEK_SET) == 0;
  };
  if (have != uint64_t(st.st_size) && !restart()) return Status::Errno(errno, "truncating `{}`", part);
  if (::lseek(fd.get(), off_t(have), SEEK_SET) < 0) return Status::Errno(errno, "seeking `{}`", part);
  Status written;
  // The bytes come in small pieces; they go to the file in large writes.
  std::string pending;
  pending.reserve(kWriteBytes);
  auto flush = [&] {
    if (!pending.empty()) written = WriteAll(fd.get(), pending, part);
    pending.clear();
    return written.ok();
  };
  auto append = [&](const char* data, size_t n) {
    if (have + n > f.blob.size) {
      written = Status::Error(Code::kCorruption, "`{}`: blob {} ({}) is longer than its {} bytes; not stored", ref,
                              f.blob.digest, f.path, f.blob.size);
      return false;
    }
    if (decryption) decryption->Decrypt(have, data, n, pending);
    else pending.append(data, n);
    if (pending.size() >= kWriteBytes && !flush()) return false;
    if (!decryption) hash.Update(data, n);  // an encrypted blob's HMAC stands for its digest (ChunkDecryption)
    have += n;
    meter.Moved(n);
    return true;
  };
  uint64_t resumed_from = have;
  auto got = sources.FetchBlob(f.blob, have, append);
  if (got.ok() && got->from == 0 && resumed_from > 0) {
    // The registry ignored the Range and sent the blob from its start, after
    // the bytes already here: start over.
    pending.clear();
    if (!restart()) return Status::Errno(errno, "truncating `{}`", part);
    got = sources.FetchBlob(f.blob, 0, append);
  }
  if (written.ok()) flush();  // what came, kept for a resumed pull even when the transfer broke off
  if (!written.ok()) {
    if (written.code() == Code::kCorruption) ::unlink(part.c_str());
    return written;
  }
  GPUSNAP_RETURN_IF_ERROR(got.status().Wrap(f.path));
  if (have != f.blob.size) {
    ::unlink(part.c_str());
    return Status::Error(Code::kCorruption, "`{}`: blob {} ({}) ended after {} of its {} bytes; not stored", ref,
                         f.blob.digest, f.path, have, f.blob.size);
  }
  if (!decryption) {
    if (std::string hex = hash.HexFinal(); registry::BlobDigest(hex) != f.blob.digest) {
      ::unlink(part.c_str());
      return Mismatch(ref, f.blob, f.path, hex, got->place);
    }
  }
  if (decryption) {
    if (Status verified = decryption->Verify(ref, f.path); !verified.ok()) {
      ::unlink(part.c_str());
      return verified;
    }
  }
  if (::fdatasync(fd.get()) != 0) return Status::Errno(errno, "syncing `{}`", part);
  if (::rename(part.c_str(), final_path.c_str()) != 0) return Status::Errno(errno, "renaming `{}`", part);
  meter.BlobMoved();
  return Status::Ok();
}

// A chunk into the chunk store, checked twice: the bytes against the blob's
// SHA-256 as they stream (an encrypted one's against its HMAC instead, and
// decrypted as they stream: ChunkDecryption says why), then against the
// XXH3 name the artifact maps it to.
Status FetchChunk(Sources& sources, const chunks::ChunkStore& chunk_store, const ArtifactChunk& c,
                  const DecryptionKeys* keys, const std::string& ref, registry::TransferMeter& meter,
                  const std::function<void(std::string)>& wrote) {
  if (c.blob.size == 0 || c.blob.size > chunks::kChunkBytes)
    return Status::Error(Code::kInvalidArgument, "`{}`: chunk {} is {} bytes, not 1..{}", ref, c.xxh3, c.blob.size,
                         chunks::kChunkBytes);
  std::optional<registry::OpenedBlob> opened;
  if (c.blob.encryption.encrypted()) {
    GPUSNAP_ASSIGN_OR_RETURN(opened, registry::OpenAnnotations(c.blob.encryption, keys, ref));
  }
  std::string buf(c.blob.size, '\0');
  std::optional<registry::ChunkDecryption> decryption;
  if (opened) decryption.emplace(*opened, buf.data());
  uint64_t have = 0;
  Sha256 hash;
  auto got = sources.FetchBlob(c.blob, 0, [&](const char* data, size_t n) {
    if (have + n > buf.size()) return false;
    if (decryption) {
      decryption->Take(data, n);
    } else {
      std::memcpy(buf.data() + have, data, n);
      hash.Update(data, n);
    }
    have += n;
    meter.Moved(n);
    return true;
  });
  const std::string what = fmt::format("chunk {}", c.xxh3);
  GPUSNAP_RETURN_IF_ERROR(got.status().Wrap(what));
  if (decryption) {
    if (have != c.blob.size)
      return Status::Error(Code::kCorruption, "`{}`: blob {} ({}) came as {} bytes, not {}; not stored", ref,
                           c.blob.digest, what, have, c.blob.size);
    GPUSNAP_RETURN_IF_ERROR(decryption->Finish(ref, what));
  } else if (std::string hex = hash.HexFinal(); have != c.blob.size || registry::BlobDigest(hex) != c.blob.digest) {
    return Mismatch(ref, c.blob, what, hex, got->place);
  }
  chunks::ChunkDigest name = chunks::ComputeChunkDigest(buf.data(), have);
  if (chunks::DigestHex(name) != c.xxh3)
    return Status::Error(Code::kCorruption, "`{}`: blob {} is mapped to chunk {}, but its bytes are chunk {}; not stored",
                         ref, c.blob.digest, c.xxh3, chunks::DigestHex(name));
  chunks::SaveStats stats;
  GPUSNAP_RETURN_IF_ERROR(chunk_store.SaveChunk(buf.data(), have, &stats).status());
  if (stats.chunks_written) wrote(chunk_store.ChunkPath(name));
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

// Whether gpusnap.json's digest of a file is its content's plain SHA-256 (a
// file of one digest chunk), not the chunked digest of a larger one.
bool ListedByPlainDigest(const FileDigest& file, uint64_t digest_chunk) { return file.size <= digest_chunk; }

// The files of `a` against the ones gpusnap.json lists: each named, of its
// size, and, where gpusnap.json's digest of it is its content's plain SHA-256
// (a file of one digest chunk, or a snapshot digested whole), of the same
// digest as its layer, which its bytes are checked against as they stream.
// Returns the files whose gpusnap.json digest is chunked (larger files): they
// are digested as the store does once they are in (CheckChunkedDigests).
// An encrypted layer's digest is its ciphertext's: its plaintext is tied to
// gpusnap.json once its key is opened (PlaintextMatches).
Result<std::vector<std::string>> CheckFilesMatch(const registry::Artifact& a, const SnapshotMeta& meta,
                                                 const std::string& ref) {
  if (a.files.size() != meta.files.size())
    return Status::Error(Code::kCorruption, "`{}`: the artifact has {} files, its gpusnap.json lists {}", ref,
                         a.files.size(), meta.files.size());
  GPUSNAP_ASSIGN_OR_RETURN(uint64_t digest_chunk, DigestChunkBytes(meta.digest));
  std::vector<std::string> chunked;
  for (const ArtifactFile& f : a.files) {
    auto it = meta.files.find(f.path);
    if (it == meta.files.end())
      return Status::Error(Code::kCorruption, "`{}`: the artifact has file `{}`, which its gpusnap.json does not list",
                           ref, f.path);
    if (it->second.size != f.blob.size)
      return Status::Error(Code::kCorruption, "`{}`: file `{}` is {} bytes in the artifact, {} in its gpusnap.json", ref,
                           f.path, f.blob.size, it->second.size);
    if (!ListedByPlainDigest(it->second, digest_chunk)) {
      chunked.push_back(f.path);
      continue;
    }
    if (!f.blob.encryption.encrypted() && registry::BlobDigest(it->second.sha256) != f.blob.digest)
      return Status::Error(Code::kCorruption, "`{}`: file `{}` is blob {} in the artifact, sha256:{} in its gpusnap.json",
                           ref, f.path, f.blob.digest, it->second.sha256);
  }
  return chunked;
}

// The files CheckFilesMatch could not tie by their layers' digests, digested
// in `dir` as the store digests them, against gpusnap.json.
Status CheckChunkedDigests(const std::string& dir, const std::vector<std::string>& files, const SnapshotMeta& meta,
                           const std::string& ref) {
  if (files.empty()) return Status::Ok();
  GPUSNAP_ASSIGN_OR_RETURN(uint64_t digest_chunk, DigestChunkBytes(meta.digest));
  GPUSNAP_ASSIGN_OR_RETURN(auto digests, DigestFiles(dir, files, false, 0, digest_chunk));
  for (const std::string& f : files) {
    const std::string& want = meta.files.at(f).sha256;
    if (digests.at(f).sha256 != want)
      return Status::Error(Code::kCorruption, "`{}`: file `{}` digests to {} ({}), not the {} its gpusnap.json lists",
                           ref, f, digests.at(f).sha256, meta.digest, want);
  }
  return Status::Ok();
}

// An encrypted file's plaintext, as its key says (and its HMAC and digest
// then check as it is decrypted), must be the one gpusnap.json lists. A file
// gpusnap.json lists by its chunked digest has no plain SHA-256 there to
// compare: it is digested once decrypted (CheckChunkedDigests).
Status PlaintextMatches(const registry::OpenedBlob& opened, const ArtifactFile& f, const SnapshotMeta& meta,
                        const std::string& ref) {
  auto it = meta.files.find(f.path);
  if (it != meta.files.end()) {
    GPUSNAP_ASSIGN_OR_RETURN(uint64_t digest_chunk, DigestChunkBytes(meta.digest));
    if (!ListedByPlainDigest(it->second, digest_chunk)) return Status::Ok();
  }
  if (it == meta.files.end() || registry::BlobDigest(it->second.sha256) != opened.secrets.plain_digest)
    return Status::Error(Code::kCorruption, "`{}`: file `{}` decrypts to {}, not the sha256:{} its gpusnap.json lists",
                         ref, f.path, opened.secrets.plain_digest, it == meta.files.end() ? "" : it->second.sha256);
  return Status::Ok();
}

Status PublishStaged(const std::string& staging, const std::string& final_dir, const std::string& meta_json) {
  GPUSNAP_RETURN_IF_ERROR(WriteFileSynced(staging + "/" + SnapshotFiles::kMetaFile, meta_json));
  Status moved = SyncAndRenameTree(staging, final_dir);
  if (moved.sys_errno() == EEXIST || moved.sys_errno() == ENOTEMPTY)
    return Status::Error(Code::kAlreadyExists, "a snapshot `{}` appeared in the store meanwhile",
                         std::filesystem::path(final_dir).filename().string());
  return moved;
}

// The manifest the reference names, and the places its blobs come from
// (registries.conf: `access.registries`, else the default file). A tag is
// resolved where its [[registry]] lets tags be, never at a digest-only
// mirror; from then on the pull is one of that digest, which every place,
// digest-only mirrors too, must serve as it is.
Result<registry::Manifest> OpenSources(const PullOptions& o, std::unique_ptr<Sources>& sources) {
  std::shared_ptr<const registry::RegistriesConf> conf = o.access.registries;
  if (!conf) {
    GPUSNAP_ASSIGN_OR_RETURN(registry::RegistriesConf loaded, registry::LoadRegistriesConf(""));
    conf = std::make_shared<const registry::RegistriesConf>(std::move(loaded));
  }
  registry::Manifest manifest;
  RegistryReference pinned = o.reference;
  std::unique_ptr<Sources> resolving;
  if (pinned.digest.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(auto places, registry::SourcesFor(*conf, o.reference));
    GPUSNAP_ASSIGN_OR_RETURN(resolving, Sources::Open(o.reference, std::move(places), o.access, o.progress));
    GPUSNAP_ASSIGN_OR_RETURN(manifest, resolving->GetManifest());
    pinned.digest = manifest.digest;
  }
  GPUSNAP_ASSIGN_OR_RETURN(auto places, registry::SourcesFor(*conf, pinned));
  GPUSNAP_ASSIGN_OR_RETURN(sources,
                           Sources::Open(o.reference, std::move(places), o.access, o.progress, std::move(resolving)));
  if (manifest.bytes.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(manifest, sources->GetManifest());
  }
  return manifest;
}

}  // namespace

namespace registry {

Result<std::unique_ptr<StagedPull>> StagedPull::Begin(const PullOptions& o) {
  std::unique_ptr<StagedPull> p(new StagedPull());
  p->options_ = o;
  const std::string r = o.reference.ToString();
  // 1. The manifest and the snapshot's metadata, both checked.
  p->ref_ = o.reference;
  if (!o.as_id.empty() && !IsValidSnapshotId(o.as_id))
    return Status::Error(Code::kInvalidArgument, "invalid snapshot id `{}` (--as)", o.as_id);
  GPUSNAP_ASSIGN_OR_RETURN(Store store, Store::Open(o.store, true));
  p->store_root_ = store.root();
  GPUSNAP_ASSIGN_OR_RETURN(Manifest manifest, OpenSources(o, p->sources_));
  // Trusted before anything else of it is fetched or read: the config and
  // every blob are then checked against this manifest, wherever they come
  // from; the signatures name the reference the user gave.
  std::shared_ptr<const TrustPolicy> policy = o.access.policy;
  if (!policy) {
    GPUSNAP_ASSIGN_OR_RETURN(TrustPolicy loaded, LoadTrustPolicy(""));
    policy = std::make_shared<const TrustPolicy>(std::move(loaded));
  }
  GPUSNAP_RETURN_IF_ERROR(p->sources_->VerifySignatures(*policy, p->ref_, manifest.digest));
  GPUSNAP_ASSIGN_OR_RETURN(p->artifact_, ParseManifest(manifest.bytes, manifest.media_type, r));
  // An encrypted artifact is opened before anything is written: its config's
  // key is the first the decryption keys must unwrap.
  std::string config_digest = p->artifact_.config.digest;  // of the plaintext gpusnap.json
  if (p->artifact_.config.encryption.encrypted()) {
    GPUSNAP_ASSIGN_OR_RETURN(p->config_opened_, OpenAnnotations(p->artifact_.config.encryption,
                                                                o.access.decryption_keys.get(), r));
    config_digest = p->config_opened_->secrets.plain_digest;
  }

  // 2. One pull of a manifest at a time, taken before any blob moves: the
  // second finds the snapshot in place (its gpusnap.json being the config
  // blob itself when it keeps its own id) and downloads nothing.
  std::string hex = manifest.digest.substr(7);
  std::string pulls = store.root() + "/pulls";
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(pulls, 0700));
  GPUSNAP_ASSIGN_OR_RETURN(LockFile turn, TakeTurn(pulls + "/" + hex + ".lock", 3600, o.progress));
  p->turn_ = std::move(turn);
  TransferResult& result = p->result_;
  result.reference = r;
  result.manifest_digest = manifest.digest;
  result.blobs = 1 + p->artifact_.files.size() + p->artifact_.chunks.size();
  if (std::string own = p->artifact_.snapshot_id; IsValidSnapshotId(own) && (o.as_id.empty() || o.as_id == own)) {
    auto bytes = ReadFile(store.SnapshotDir(own) + "/" + SnapshotFiles::kMetaFile);
    auto here = store.Load(own);
    if (bytes.ok() && BlobDigest(Sha256Hex(*bytes)) == config_digest && here.ok() &&
        IsOrigin(store.root(), own, manifest.digest)) {
      p->meta_ = std::move(here).value();
      result.id = own;
      result.already_present = true;
      p->dir_ = p->final_dir_ = store.SnapshotDir(own);
      p->published_ = true;
      return p;
    }
  }

  GPUSNAP_ASSIGN_OR_RETURN(std::string config, FetchConfig(*p->sources_, p->artifact_.config, p->config_opened_, r));
  auto parsed = SnapshotMetaFromJson(config);
  if (!parsed.ok()) return parsed.status().Wrap(fmt::format("`{}`: its gpusnap.json", r));
  p->meta_ = std::move(parsed).value();
  GPUSNAP_ASSIGN_OR_RETURN(p->chunked_digest_files_, CheckFilesMatch(p->artifact_, p->meta_, r));
  std::string id = o.as_id.empty() ? p->meta_.id : o.as_id;
  p->meta_json_ = config;
  if (id != p->meta_.id) {
    p->meta_.id = id;
    p->meta_json_ = SnapshotMetaToJson(p->meta_);
  }

  // The snapshot may be here already, under another id (--as).
  result.id = id;
  p->final_dir_ = store.SnapshotDir(id);
  if (auto here = store.Load(id); here.ok()) {
    auto bytes = ReadFile(p->final_dir_ + "/" + SnapshotFiles::kMetaFile);
    if (!bytes.ok() || *bytes != p->meta_json_)
      return Status::Error(Code::kAlreadyExists,
                           "the store already has a snapshot `{}`, not the one `{}` names; pull it with --as NEW-ID",
                           id, r);
    // Equal metadata does not make equal files: only a snapshot pulled from
    // (or pushed as) this very manifest is taken for it.
    if (!IsOrigin(store.root(), id, manifest.digest))
      return Status::Error(Code::kAlreadyExists,
                           "the store already has a snapshot `{}` with the same gpusnap.json, but not from `{}` ({}): "
                           "its files are not known to be this artifact's; remove it or pull with --as NEW-ID",
                           id, r, manifest.digest);
    result.already_present = true;
    p->dir_ = p->final_dir_;
    p->published_ = true;
    return p;
  }

  // 3. The files, then the chunks their manifests name, in the order a
  // restore loads them, a few at a time; gc leaves the chunks alone until
  // the snapshot names them.
  p->dir_ = pulls + "/" + hex;
  GPUSNAP_RETURN_IF_ERROR(MakeDirs(p->dir_, 0700));
  GPUSNAP_ASSIGN_OR_RETURN(p->chunk_lock_, chunks::ChunkStoreLock::Acquire(
                                               store.root(), chunks::ChunkStoreLock::Mode::kShared,
                                               chunks::kChunkWriterWaitMs));
  GPUSNAP_ASSIGN_OR_RETURN(p->chunks_, chunks::ChunkStore::Open(store.root()));
  uint64_t total = config.size();
  for (const auto& f : p->artifact_.files) total += f.blob.size;
  for (const auto& c : p->artifact_.chunks) total += c.blob.size;
  p->meter_ = std::make_unique<TransferMeter>("pull", o.progress, result.blobs, total);
  p->meter_->BlobMoved();  // the config, fetched above
  p->meter_->Moved(config.size());
  // The chunk manifests come first: they name the chunks, which then arrive
  // while the other files do (a server's CRIU pages image, gigabytes in one
  // stream, would otherwise hold every chunk back).
  std::set<std::string> manifest_files;
  for (const std::string& m : ManifestFiles(p->meta_)) manifest_files.insert(m);
  std::vector<const ArtifactFile*> manifests, other_files;
  for (const auto& f : p->artifact_.files) (manifest_files.contains(f.path) ? manifests : other_files).push_back(&f);
  PauseIfRequested("pull-files");
  GPUSNAP_RETURN_IF_ERROR(p->FetchFiles(manifests));
  GPUSNAP_ASSIGN_OR_RETURN(std::set<std::string> named_by_manifests, ChunksNamed(p->dir_, p->meta_));
  GPUSNAP_RETURN_IF_ERROR(NameChunksInOrder(p->artifact_, named_by_manifests, r));
  // The manifests the files brought must name only chunks the artifact has.
  GPUSNAP_ASSIGN_OR_RETURN(std::vector<std::string> order, ChunksInLoadOrder(p->dir_, p->meta_));
  std::map<std::string, const ArtifactChunk*> by_name;
  for (const auto& c : p->artifact_.chunks) by_name[c.xxh3] = &c;
  std::vector<const ArtifactChunk*> missing;
  std::set<std::string> named;
  for (const std::string& c : order) {
    auto it = by_name.find(c);
    if (it == by_name.end())
      return Status::Error(Code::kCorruption, "`{}`: its chunk manifests name chunk {}, which it does not hold", r, c);
    named.insert(c);
    std::string path = chunks::ChunksDir(store.root()) + "/" + c.substr(0, 2) + "/" + c;
    if (::access(path.c_str(), F_OK) == 0) {
      p->chunks_->MarkUsed(*chunks::ParseDigestHex(c));  // a pull that needs it is a use (the chunk cache's LRU)
      p->meter_->BlobSkipped(it->second->blob.size);
    } else {
      missing.push_back(it->second);
      p->arriving_.insert(c);
    }
  }
  for (const auto& c : p->artifact_.chunks)  // in the artifact, named by no manifest: not needed
    if (!named.contains(c.xxh3)) p->meter_->BlobSkipped(c.blob.size);
  p->StartChunks(std::move(missing));
  GPUSNAP_RETURN_IF_ERROR(p->FetchFiles(other_files));
  PauseIfRequested("pull-files-in");
  return p;
}

Status StagedPull::FetchFiles(const std::vector<const ArtifactFile*>& files) {
  const std::string ref = options_.reference.ToString();
  std::set<std::string> checked_once_in(chunked_digest_files_.begin(), chunked_digest_files_.end());
  Status fetched = RunEach(files.size(), options_.access.jobs, [&](size_t i) -> Status {
    const ArtifactFile& f = *files[i];
    std::optional<BlobDecryption> decryption;
    if (f.blob.encryption.encrypted()) {
      GPUSNAP_ASSIGN_OR_RETURN(auto opened,
                               OpenAnnotations(f.blob.encryption, options_.access.decryption_keys.get(), ref));
      GPUSNAP_RETURN_IF_ERROR(PlaintextMatches(opened, f, meta_, ref));
      decryption.emplace(std::move(opened), checked_once_in.contains(f.path) ? PlainDigestCheck::kByCaller
                                                                             : PlainDigestCheck::kHere);
    }
    return FetchFile(*sources_, dir_, f, decryption ? &*decryption : nullptr, ref, *meter_);
  });
  // A full disk (or any filesystem refusal) takes back what this pull wrote;
  // a registry that went away leaves it for the next pull to go on from.
  if (!fetched.ok() && fetched.code() == Code::kIoError) TakeBack();
  return fetched.Wrap(fmt::format("pull of `{}`", ref));
}

void StagedPull::StartChunks(std::vector<const ArtifactChunk*> missing) {
  chunks_thread_ = std::thread([this, missing = std::move(missing)] {
    chunks_status_ = RunEach(missing.size(), options_.access.jobs, [&](size_t i) {
      if (cancel_) return Status::Error(Code::kFailedPrecondition, "the pull was stopped");
      Status st = FetchChunk(*sources_, *chunks_, *missing[i], options_.access.decryption_keys.get(),
                             options_.reference.ToString(), *meter_,
                             [this](std::string path) {
                               MutexLock lock(written_mu_);
                               written_chunks_.push_back(std::move(path));
                             });
      if (!st.ok()) {
        MutexLock lock(failure_mu_);
        if (first_failure_.ok()) first_failure_ = st;
      }
      return st;
    });
  });
}

Status StagedPull::ChunkFailure() const {
  MutexLock lock(failure_mu_);
  return first_failure_;
}

Status StagedPull::WaitForChunks() {
  if (chunks_thread_.joinable()) chunks_thread_.join();
  return chunks_status_;
}

void StagedPull::StopChunks() {
  cancel_ = true;
  if (chunks_thread_.joinable()) chunks_thread_.join();
}

StagedPull::~StagedPull() { StopChunks(); }

void StagedPull::TakeBack() {
  StopChunks();
  (void)RemoveTree(dir_);
  MutexLock lock(written_mu_);
  for (const std::string& path : written_chunks_) ::unlink(path.c_str());
}

Result<TransferResult> StagedPull::Publish() {
  if (published_) return result_;
  Status st = WaitForChunks();
  // 4. Publish: the format checked, gpusnap.json written, one rename.
  if (st.ok()) {
    auto entries = ListSnapshotEntries(dir_);
    st = entries.ok() ? CheckSnapshotEntries(*entries, &meta_.files).status() : entries.status();
  }
  if (st.ok()) st = CheckChunkedDigests(dir_, chunked_digest_files_, meta_, options_.reference.ToString());
  if (st.ok()) st = PublishStaged(dir_, final_dir_, meta_json_);
  if (!st.ok()) {
    // A full disk (or any filesystem refusal) takes back what this pull
    // wrote; a registry that went away leaves it for the next pull.
    if (st.code() == Code::kIoError) TakeBack();
    return st.Wrap(fmt::format("pull of `{}`", options_.reference.ToString()));
  }
  published_ = true;
  dir_ = final_dir_;
  GPUSNAP_RETURN_IF_ERROR(SetOrigin(store_root_, result_.id, result_.manifest_digest)
                              .Wrap(fmt::format("pull of `{}`: published, but recording its manifest in the store",
                                                options_.reference.ToString())));
  meter_->Finish(result_);
  return result_;
}

}  // namespace registry

Result<TransferResult> Pull(const PullOptions& o) {
  GPUSNAP_ASSIGN_OR_RETURN(auto staged, registry::StagedPull::Begin(o));
  return staged->Publish();
}

}  // namespace gpusnap
