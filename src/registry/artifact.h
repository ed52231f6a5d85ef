// A snapshot as an OCI image-spec 1.1 artifact (docs/snapshot-format.md,
// "In a registry"): an image manifest of artifactType kArtifactType whose
// config blob is gpusnap.json and whose layers are, in order, every other
// file of the snapshot (titled with its path) and then every gpushare chunk
// it names (annotated with the chunk's XXH3-128 name). Blobs are named by
// their SHA-256, as OCI requires; a chunk keeps its XXH3 name in the local
// store, and the annotation maps one to the other.
//
// Pure: building the manifest and reading one back.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"

namespace gpusnap::registry {

inline constexpr const char* kManifestMediaType = "application/vnd.oci.image.manifest.v1+json";
inline constexpr const char* kArtifactType = "application/vnd.gpusnap.snapshot.v1";
inline constexpr const char* kConfigMediaType = "application/vnd.gpusnap.snapshot.config.v1+json";
inline constexpr const char* kFileMediaType = "application/vnd.gpusnap.snapshot.file.v1";
inline constexpr const char* kChunkMediaType = "application/vnd.gpusnap.gpushare.chunk.v1";
inline constexpr const char* kTitleAnnotation = "org.opencontainers.image.title";
inline constexpr const char* kChunkAnnotation = "io.gpusnap.chunk.xxh3-128";
inline constexpr const char* kSnapshotIdAnnotation = "io.gpusnap.snapshot.id";

// A blob: "sha256:<64 hex>" and its size.
struct Blob {
  std::string digest;
  uint64_t size = 0;
  bool operator==(const Blob&) const = default;
};

struct ArtifactFile {
  std::string path;  // relative to the snapshot directory: "checkpoint/pages-1.img"
  Blob blob;
  bool operator==(const ArtifactFile&) const = default;
};

struct ArtifactChunk {
  std::string xxh3;  // 32 hex: the chunk's name in the local store
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
// name that is not 32 hex digits.
Result<Artifact> ParseManifest(std::string_view bytes, std::string_view media_type, std::string_view ref);

// Pure. "sha256:" + hex.
std::string BlobDigest(std::string_view sha256_hex);

// Pure. The index of the first blob of each digest, in order: files of the
// same bytes are one blob, moved once. Pushing one digest from two threads at
// once also races docker-registry's link files (a HEAD beside a mount of the
// same digest answers 500 "invalid checksum digest format").
std::vector<size_t> DistinctBlobs(const std::vector<Blob>& blobs);

}  // namespace gpusnap::registry
