// A snapshot as an OCI image-spec 1.1 artifact (docs/snapshot-format.md,
// "In a registry"): an image manifest of artifactType kArtifactType whose
// config blob is gpusnap.json and whose layers are, in order, every other
// file of the snapshot (titled with its path) and then every gpushare chunk
// it names (annotated with the chunk's XXH3-128 name). Blobs are named by
// their SHA-256, as OCI requires; a chunk keeps its XXH3 name in the local
// store, and the annotation maps one to the other.
//
// An encrypted artifact (encryption.h) has every blob encrypted, its media
// type suffixed `+encrypted` and its key in its annotations; its chunks are
// not annotated with their names, which would tell equal plaintexts apart
// across tenants: the chunks are in the order of their names, and the names
// come from the snapshot's chunk manifests once those are decrypted
// (NameChunksInOrder).
//
// Pure: building the manifest and reading one back.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::registry {

inline constexpr const char* kManifestMediaType = "application/vnd.oci.image.manifest.v1+json";
inline constexpr const char* kArtifactType = "application/vnd.gpusnap.snapshot.v1";
inline constexpr const char* kConfigMediaType = "application/vnd.gpusnap.snapshot.config.v1+json";
// An encrypted artifact's config: gpusnap.json encrypted as its layers are,
// under a type of its own rather than `+encrypted`, because containers/image
// (skopeo) decrypts a config of that suffix and then refuses it for its
// changed digest, failing the whole copy.
inline constexpr const char* kEncryptedConfigMediaType = "application/vnd.gpusnap.snapshot.config.encrypted.v1";
inline constexpr const char* kFileMediaType = "application/vnd.gpusnap.snapshot.file.v1";
inline constexpr const char* kChunkMediaType = "application/vnd.gpusnap.gpushare.chunk.v1";
inline constexpr const char* kTitleAnnotation = "org.opencontainers.image.title";
inline constexpr const char* kChunkAnnotation = "io.gpusnap.chunk.xxh3-128";
inline constexpr const char* kSnapshotIdAnnotation = "io.gpusnap.snapshot.id";
inline constexpr std::string_view kEncryptedMediaTypeSuffix = "+encrypted";
inline constexpr const char* kJweKeysAnnotation = "org.opencontainers.image.enc.keys.jwe";
inline constexpr const char* kPublicOptionsAnnotation = "org.opencontainers.image.enc.pubopts";

// The annotations of an encrypted blob: base64 of the JWE that wraps its
// key for each recipient, and of its public options (the HMAC). Empty: the
// blob is plaintext.
struct BlobEncryption {
  std::string keys_jwe;
  std::string public_options;
  bool encrypted() const { return !keys_jwe.empty(); }
  bool operator==(const BlobEncryption&) const = default;
};

// A blob: "sha256:<64 hex>" and its size (of the ciphertext, when encrypted).
struct Blob {
  std::string digest;
  uint64_t size = 0;
  BlobEncryption encryption;
  bool operator==(const Blob&) const = default;
};

struct ArtifactFile {
  std::string path;  // relative to the snapshot directory: "checkpoint/pages-1.img"
  Blob blob;
  bool operator==(const ArtifactFile&) const = default;
};

struct ArtifactChunk {
  std::string xxh3;  // 32 hex: the chunk's name in the local store; empty until named in order
  Blob blob;
  bool operator==(const ArtifactChunk&) const = default;
};

struct Artifact {
  std::string snapshot_id;
  Blob config;  // gpusnap.json
  std::vector<ArtifactFile> files;
  std::vector<ArtifactChunk> chunks;
  bool operator==(const Artifact&) const = default;
};

// Pure. The manifest's bytes (compact JSON; its SHA-256 is its digest).
std::string ManifestJson(const Artifact& artifact);

// Pure. Reads a manifest back, refusing with kInvalidArgument (naming `ref`)
// an index or a plain container image, another artifact type, a layer of an
// unknown media type, a digest that is not sha256:<64 hex>, a file path that
// is absolute, holds `..` or an empty component, or repeats, and a chunk
// name that is not 32 hex digits, chunks of which some are named and some
// not, and an encrypted blob without its key's annotations.
Result<Artifact> ParseManifest(std::string_view bytes, std::string_view media_type, std::string_view ref);

// Pure. Names the artifact's unnamed chunks: the i-th is the i-th of
// `names` (the chunks the snapshot's manifests name, in order), refusing
// (kCorruption, naming `ref`) a count that differs. Named chunks stay as they are.
Status NameChunksInOrder(Artifact& artifact, const std::set<std::string>& names, std::string_view ref);

// Pure. "sha256:" + hex.
std::string BlobDigest(std::string_view sha256_hex);

// Pure. The index of the first blob of each digest, in order: files of the
// same bytes are one blob, moved once. Pushing one digest from two threads at
// once also races docker-registry's link files (a HEAD beside a mount of the
// same digest answers 500 "invalid checksum digest format").
std::vector<size_t> DistinctBlobs(const std::vector<Blob>& blobs);

}  // namespace gpusnap::registry
