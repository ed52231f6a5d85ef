// gpusnap push: a snapshot of the store to a registry, as the artifact of
// artifact.h. Blobs first (all hashed, then each digest once checked with
// HEAD, mounted or uploaded), the manifest last: a registry never holds a manifest whose blobs
// it lacks, and a push cut off part-way is completed by the next, which finds
// the blobs already there. An encrypted push (encryption.h) hashes each
// blob's plaintext, derives its key from that digest, and pushes the
// ciphertext, encrypted again as it uploads rather than kept.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "chunks/chunk_store.h"
#include "gpusnap/distribution.h"
#include "registry/artifact.h"
#include "registry/client.h"
#include "registry/encryption.h"
#include "registry/reference.h"
#include "registry/signatures.h"
#include "registry/snapshot_blobs.h"
#include "registry/transfer.h"
#include "store/layout.h"
#include "store/sha256.h"
#include "store/origins.h"
#include "store/store.h"
#include "util/fd.h"
#include "util/files.h"
#include "util/test_hooks.h"

namespace gpusnap {

namespace {

using registry::Blob;

// One blob to push: a file (or the config's bytes) and, once hashed, its descriptor.
struct PushItem {
  std::string path;   // the file; empty for the config
  std::string bytes;  // the config's
  Blob blob;
  std::optional<registry::LayerKey> key;  // encrypted: the blob is the ciphertext under it
};

UniqueFd OpenPlain(const PushItem& item) {
  return item.path.empty() ? UniqueFd() : UniqueFd(::open(item.path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
}

// `n` bytes of the item's plaintext at `offset` (from `fd`, its file's, or its bytes).
bool ReadPlain(const PushItem& item, const UniqueFd& fd, uint64_t offset, char* buf, size_t n) {
  if (!fd.valid()) {
    if (offset + n > item.bytes.size()) return false;
    std::memcpy(buf, item.bytes.data() + offset, n);
    return true;
  }
  size_t done = 0;
  while (done < n) {
    ssize_t got = ::pread(fd.get(), buf + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    done += static_cast<size_t>(got);
  }
  return true;
}

// An encrypted item: its key from the plaintext's digest, then the
// ciphertext's digest and HMAC, and the key wrapped for the recipients.
Status Seal(PushItem& item, const EncryptionKeys& keys) {
  registry::LayerSecrets secrets{registry::DeriveLayerKey(keys.secret, item.blob.digest), item.blob.digest};
  UniqueFd fd = OpenPlain(item);
  if (!item.path.empty() && !fd.valid()) return Status::Errno(errno, "opening `{}`", item.path);
  registry::LayerMac mac(secrets.key);
  Sha256 hash;
  std::vector<char> buf(std::min<uint64_t>(item.blob.size, 4 << 20));
  for (uint64_t at = 0; at < item.blob.size;) {
    size_t n = std::min<uint64_t>(buf.size(), item.blob.size - at);
    if (!ReadPlain(item, fd, at, buf.data(), n))
      return Status::Error(Code::kIoError, "`{}` changed while it was encrypted", item.path);
    registry::ApplyKeystream(secrets.key, at, buf.data(), n);
    mac.Update(buf.data(), n);
    hash.Update(buf.data(), n);
    at += n;
  }
  GPUSNAP_ASSIGN_OR_RETURN(item.blob.encryption, registry::SealAnnotations(secrets, mac.Final(), keys.recipients));
  item.blob.digest = registry::BlobDigest(hash.HexFinal());
  item.key = secrets.key;
  return Status::Ok();
}

Status HashOne(PushItem& item, const EncryptionKeys* keys) {
  if (item.path.empty()) {
    item.blob = {registry::BlobDigest(Sha256Hex(item.bytes)), item.bytes.size(), {}};
  } else {
    GPUSNAP_ASSIGN_OR_RETURN(std::string hex, Sha256OfFile(item.path));
    struct stat st{};
    if (::stat(item.path.c_str(), &st) != 0) return Status::Errno(errno, "`{}`", item.path);
    item.blob = {registry::BlobDigest(hex), static_cast<uint64_t>(st.st_size), {}};
  }
  return keys ? Seal(item, *keys) : Status::Ok();
}

Status PushOne(registry::RegistryClient& client, const std::string& repo, const std::string& mount_from,
               const PushItem& item, registry::TransferMeter& meter) {
  GPUSNAP_ASSIGN_OR_RETURN(bool there, client.HasBlob(repo, item.blob));
  if (!there && !mount_from.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(there, client.MountBlob(repo, mount_from, item.blob));
  }
  if (there) {
    meter.BlobSkipped(item.blob.size);
    return Status::Ok();
  }
  UniqueFd fd = OpenPlain(item);
  if (!item.path.empty() && !fd.valid()) return Status::Errno(errno, "opening `{}`", item.path);
  auto read = [&item, &fd](uint64_t offset, char* buf, size_t n) {
    if (!ReadPlain(item, fd, offset, buf, n)) return false;
    if (item.key) registry::ApplyKeystream(*item.key, offset, buf, n);
    return true;
  };
  GPUSNAP_RETURN_IF_ERROR(client.UploadBlob(repo, item.blob, read, [&meter](uint64_t n) { meter.Moved(n); })
                              .Wrap(item.path.empty() ? "gpusnap.json" : item.path));
  meter.BlobMoved();
  return Status::Ok();
}

}  // namespace

Result<TransferResult> Push(const PushOptions& o) {
  // 1. What to push: a verified snapshot, its files and its chunks.
  const registry::Reference& ref = o.reference;
  if (!ref.digest.empty())
    return Status::Error(Code::kInvalidArgument, "push to `{}`: name a tag, not a digest (the digest is the push's result)",
                         ref.ToString());
  if (!o.mount_from.empty()) {
    auto from = registry::ParseReference(ref.host + "/" + o.mount_from);
    if (!from.ok()) return from.status().Wrap("--mount-from");
  }
  GPUSNAP_ASSIGN_OR_RETURN(Store store, Store::Open(o.store, false));
  GPUSNAP_ASSIGN_OR_RETURN(SnapshotMeta meta, store.Load(o.id));
  auto t_verify = std::chrono::steady_clock::now();
  GPUSNAP_RETURN_IF_ERROR(store.Verify(meta).Wrap("refusing to push"));
  if (o.progress)
    o.progress({"verify", std::chrono::duration<double>(std::chrono::steady_clock::now() - t_verify).count(),
                meta.total_bytes, true});
  std::string dir = store.SnapshotDir(meta.id);
  std::vector<PushItem> items;
  GPUSNAP_ASSIGN_OR_RETURN(std::string config, ReadFile(dir + "/" + SnapshotFiles::kMetaFile));
  items.push_back({"", config, {}, {}});
  for (const auto& [path, d] : meta.files) {
    items.push_back({dir + "/" + path, "", {}, {}});
  }
  GPUSNAP_ASSIGN_OR_RETURN(std::set<std::string> chunks, registry::ChunksNamed(dir, meta));
  GPUSNAP_ASSIGN_OR_RETURN(auto chunk_store, chunks::ChunkStore::Open(store.root()));
  std::vector<std::string> chunk_names(chunks.begin(), chunks.end());
  for (const std::string& hex : chunk_names) {
    std::string path = chunks::ChunksDir(store.root()) + "/" + hex.substr(0, 2) + "/" + hex;
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0)
      return Status::Errno(errno, "refusing to push `{}`: its chunk `{}`", meta.id, path);
    items.push_back({path, "", {}, {}});
  }

  // 2. The registry: reachable, and the credentials let us in.
  GPUSNAP_ASSIGN_OR_RETURN(auto client,
                           registry::RegistryClient::Create(ref.host, registry::ConnectOptionsOf(o.access)));
  GPUSNAP_RETURN_IF_ERROR(client->Ping().Wrap(fmt::format("push to `{}`", ref.ToString())));

  // 3. The blobs the registry lacks, a few at a time, each digest once (an
  // encrypted push hashes the ciphertext: the digest of what is stored).
  GPUSNAP_RETURN_IF_ERROR(registry::RunEach(items.size(), o.access.jobs, [&](size_t i) {
                            return HashOne(items[i], o.encryption.get());
                          }).Wrap(fmt::format("push of `{}`", meta.id)));
  std::vector<registry::Blob> blobs;
  for (const PushItem& item : items) blobs.push_back(item.blob);
  std::vector<size_t> distinct = registry::DistinctBlobs(blobs);
  uint64_t total = 0;
  for (const auto& b : blobs) total += b.size;
  // Every layer of the manifest is counted; a repeat of a digest is there
  // once the first is, so it counts as found there.
  registry::TransferMeter meter("push", o.progress, blobs.size(), total);
  for (size_t i = 0, next = 0; i < blobs.size(); ++i) {
    if (next < distinct.size() && distinct[next] == i) ++next;
    else meter.BlobSkipped(blobs[i].size);
  }
  GPUSNAP_RETURN_IF_ERROR(registry::RunEach(distinct.size(), o.access.jobs, [&](size_t i) {
                            return PushOne(*client, ref.repository, o.mount_from, items[distinct[i]], meter);
                          }).Wrap(fmt::format("push of `{}` to `{}`", meta.id, ref.ToString())));

  // 4. The manifest, naming them all.
  registry::Artifact artifact;
  artifact.snapshot_id = meta.id;
  artifact.config = items[0].blob;
  size_t i = 1;
  for (const auto& [path, _] : meta.files) artifact.files.push_back({path, items[i++].blob});
  for (const std::string& hex : chunk_names) artifact.chunks.push_back({hex, items[i++].blob});
  std::string manifest = registry::ManifestJson(artifact);
  PauseIfRequested("push-manifest");
  GPUSNAP_ASSIGN_OR_RETURN(std::string digest,
                           client->PutManifest(ref.repository, ref.tag, manifest, registry::kManifestMediaType));
  // 5. Its signature, when asked for: the manifest is there, so a failure
  // here leaves an unsigned push that `gpusnap sign` can complete.
  if (o.signing_key)
    GPUSNAP_RETURN_IF_ERROR(registry::SignManifest(*client, ref, digest, *o.signing_key)
                                .Wrap(fmt::format("signing `{}` ({}); pushed unsigned", ref.ToString(), digest)));
  GPUSNAP_RETURN_IF_ERROR(AddOrigin(store.root(), meta.id, digest)
                              .Wrap(fmt::format("pushed `{}` as {}, but recording it in the store", ref.ToString(),
                                                digest)));
  TransferResult result;
  result.id = meta.id;
  result.reference = ref.ToString();
  result.manifest_digest = digest;
  meter.Finish(result);
  return result;
}

Result<std::string> Sign(const RegistryReference& ref, const registry::SigningKey& key, const RegistryAccess& access) {
  GPUSNAP_ASSIGN_OR_RETURN(auto client,
                           registry::RegistryClient::Create(ref.host, registry::ConnectOptionsOf(access)));
  GPUSNAP_ASSIGN_OR_RETURN(registry::Manifest manifest, client->GetManifest(ref.repository, ref.ManifestName()));
  GPUSNAP_RETURN_IF_ERROR(registry::SignManifest(*client, ref, manifest.digest, key)
                              .Wrap(fmt::format("signing `{}` ({})", ref.ToString(), manifest.digest)));
  return manifest.digest;
}

}  // namespace gpusnap
