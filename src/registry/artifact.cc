#include "registry/artifact.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <set>

namespace gpusnap::registry {

namespace {

using nlohmann::json;

// `encrypted_type`: the media type of the blob encrypted (default: `media_type` + `+encrypted`).
json Descriptor(const char* media_type, const Blob& b, json annotations = json::object(),
                const char* encrypted_type = nullptr) {
  json d = {{"mediaType", media_type}, {"digest", b.digest}, {"size", b.size}};
  if (b.encryption.encrypted()) {
    d["mediaType"] = encrypted_type ? std::string(encrypted_type)
                                    : std::string(media_type) + std::string(kEncryptedMediaTypeSuffix);
    annotations[kJweKeysAnnotation] = b.encryption.keys_jwe;
    annotations[kPublicOptionsAnnotation] = b.encryption.public_options;
  }
  if (!annotations.empty()) d["annotations"] = std::move(annotations);
  return d;
}

bool IsHex(std::string_view s, size_t n) {
  if (s.size() != n) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool IsSafeRelativePath(std::string_view p) {
  if (p.empty() || p.front() == '/' || p.size() > 4096) return false;
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string_view::npos) end = p.size();
    std::string_view c = p.substr(start, end - start);
    if (c.empty() || c == "." || c == "..") return false;
    for (char ch : c)
      if (static_cast<unsigned char>(ch) < 0x20) return false;
    start = end + 1;
  }
  return true;
}

}  // namespace

std::string BlobDigest(std::string_view hex) { return "sha256:" + std::string(hex); }

std::string ManifestJson(const Artifact& a) {
  json layers = json::array();
  for (const ArtifactFile& f : a.files) layers.push_back(Descriptor(kFileMediaType, f.blob, {{kTitleAnnotation, f.path}}));
  for (const ArtifactChunk& c : a.chunks) {
    json names = json::object();
    if (!c.blob.encryption.encrypted()) names[kChunkAnnotation] = c.xxh3;
    layers.push_back(Descriptor(kChunkMediaType, c.blob, std::move(names)));
  }
  json m = {{"schemaVersion", 2},
            {"mediaType", kManifestMediaType},
            {"artifactType", kArtifactType},
            {"config", Descriptor(kConfigMediaType, a.config, json::object(), kEncryptedConfigMediaType)},
            {"layers", std::move(layers)},
            {"annotations", {{kSnapshotIdAnnotation, a.snapshot_id}}}};
  return m.dump();
}

Result<Artifact> ParseManifest(std::string_view bytes, std::string_view media_type, std::string_view ref) {
  auto bad = [ref](std::string why) {
    return Status::Error(Code::kInvalidArgument, "`{}` is not a gpusnap snapshot: {}", ref, why);
  };
  json m = json::parse(bytes, nullptr, false);
  if (m.is_discarded() || !m.is_object()) return bad("its manifest is not a JSON object");
  std::string type = m.value("mediaType", std::string(media_type));
  if (type != kManifestMediaType) {
    if (type.find("index") != std::string::npos || type.find("manifest.list") != std::string::npos)
      return bad(fmt::format("it is an image index (`{}`), not an artifact manifest", type));
    return bad(fmt::format("its manifest is `{}`, not an OCI image manifest", type));
  }
  auto str = [](const json& o, const char* k) {
    auto it = o.find(k);
    return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  // A descriptor's media type without `+encrypted`, and whether it had it.
  auto media = [&](const json& d) {
    std::string t = d.is_object() ? str(d, "mediaType") : "";
    bool encrypted = t.ends_with(kEncryptedMediaTypeSuffix);
    if (encrypted) t.resize(t.size() - kEncryptedMediaTypeSuffix.size());
    if (t == kEncryptedConfigMediaType) return std::pair{std::string(kConfigMediaType), true};
    return std::pair{t, encrypted};
  };
  auto blob = [&](const json& d, const std::string& what) -> Result<Blob> {
    if (!d.is_object()) return bad(fmt::format("its {} is not a descriptor", what));
    std::string digest = str(d, "digest");
    if (!digest.starts_with("sha256:") || !IsHex(std::string_view(digest).substr(7), 64))
      return bad(fmt::format("its {} has digest `{}`, not sha256:<64 hex>", what, digest.substr(0, 80)));
    auto size = d.find("size");
    if (size == d.end() || !size->is_number_unsigned()) return bad(fmt::format("its {} has no size", what));
    Blob b{digest, size->get<uint64_t>(), {}};
    if (media(d).second) {
      json ann = d.contains("annotations") && d["annotations"].is_object() ? d["annotations"] : json::object();
      b.encryption = {str(ann, kJweKeysAnnotation), str(ann, kPublicOptionsAnnotation)};
      if (b.encryption.keys_jwe.empty() || b.encryption.public_options.empty())
        return bad(fmt::format("its {} is encrypted, but not with a JWE-wrapped key (`{}`) and its options (`{}`)", what,
                               kJweKeysAnnotation, kPublicOptionsAnnotation));
    }
    return b;
  };
  std::string artifact_type = str(m, "artifactType");
  auto config_it = m.find("config");
  if (config_it == m.end()) return bad("its manifest has no config");
  std::string config_type = media(*config_it).first;
  // Without an artifactType the config's type names the artifact (image-spec
  // 1.1), as in a copy made by a tool that rewrites the manifest without it
  // (skopeo 1.9's decryption).
  if (artifact_type.empty() && config_type == kConfigMediaType) artifact_type = kArtifactType;
  if (artifact_type != kArtifactType) {
    if (artifact_type.empty() && config_type.find("image.config") != std::string::npos)
      return bad(fmt::format("it is a container image (config `{}`)", config_type));
    return bad(fmt::format("its artifact type is `{}`, not `{}`", artifact_type.empty() ? config_type : artifact_type,
                           kArtifactType));
  }
  if (config_type != kConfigMediaType)
    return bad(fmt::format("its config is `{}`, not `{}`", config_type, kConfigMediaType));
  Artifact a;
  GPUSNAP_ASSIGN_OR_RETURN(a.config, blob(*config_it, "config"));
  if (auto ann = m.find("annotations"); ann != m.end() && ann->is_object()) a.snapshot_id = str(*ann, kSnapshotIdAnnotation);
  auto layers = m.find("layers");
  if (layers == m.end() || !layers->is_array()) return bad("its manifest has no layers");
  std::set<std::string> paths, chunks;
  size_t unnamed = 0;
  for (const json& l : *layers) {
    std::string lt = media(l).first;
    json ann = l.is_object() && l.contains("annotations") && l["annotations"].is_object() ? l["annotations"] : json::object();
    if (lt == kFileMediaType) {
      ArtifactFile f;
      f.path = str(ann, kTitleAnnotation);
      if (!IsSafeRelativePath(f.path))
        return bad(fmt::format("a file layer is titled `{}`, not a relative path inside the snapshot",
                               f.path.substr(0, 200)));
      if (!paths.insert(f.path).second) return bad(fmt::format("the file `{}` is in it twice", f.path));
      GPUSNAP_ASSIGN_OR_RETURN(f.blob, blob(l, fmt::format("file `{}`", f.path)));
      a.files.push_back(std::move(f));
    } else if (lt == kChunkMediaType) {
      ArtifactChunk c;
      c.xxh3 = str(ann, kChunkAnnotation);
      if (c.xxh3.empty() && !ann.contains(kChunkAnnotation)) {
        GPUSNAP_ASSIGN_OR_RETURN(c.blob, blob(l, fmt::format("chunk layer {}", a.chunks.size() + 1)));
        ++unnamed;
        a.chunks.push_back(std::move(c));
        continue;
      }
      if (!IsHex(c.xxh3, 32)) return bad(fmt::format("a chunk layer is named `{}`, not 32 hex digits", c.xxh3.substr(0, 80)));
      GPUSNAP_ASSIGN_OR_RETURN(c.blob, blob(l, fmt::format("chunk {}", c.xxh3)));
      if (chunks.insert(c.xxh3).second) a.chunks.push_back(std::move(c));
    } else {
      return bad(fmt::format("it has a layer of media type `{}`", lt.substr(0, 120)));
    }
  }
  if (unnamed && !chunks.empty())
    return bad(fmt::format("{} of its chunk layers are named and {} are not", chunks.size(), unnamed));
  return a;
}

Status NameChunksInOrder(Artifact& a, const std::set<std::string>& names, std::string_view ref) {
  if (a.chunks.empty() || !a.chunks.front().xxh3.empty()) return Status::Ok();
  if (names.size() != a.chunks.size())
    return Status::Error(Code::kCorruption, "`{}`: its chunk manifests name {} chunks, the artifact holds {}", ref,
                         names.size(), a.chunks.size());
  auto name = names.begin();
  for (ArtifactChunk& c : a.chunks) c.xxh3 = *name++;
  return Status::Ok();
}

std::vector<size_t> DistinctBlobs(const std::vector<Blob>& blobs) {
  std::vector<size_t> first;
  std::set<std::string_view> seen;
  for (size_t i = 0; i < blobs.size(); ++i)
    if (seen.insert(blobs[i].digest).second) first.push_back(i);
  return first;
}

}  // namespace gpusnap::registry
