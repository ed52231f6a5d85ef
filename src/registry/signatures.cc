#include "registry/signatures.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "store/sha256.h"

namespace gpusnap::registry {

namespace {

Result<std::string> FetchSmallBlob(RegistryClient& client, const std::string& repo, const Blob& blob, uint64_t limit) {
  if (blob.size > limit)
    return Status::Error(Code::kInvalidArgument, "blob {} is {} bytes, more than the {} bytes gpusnap reads",
                         blob.digest, blob.size, limit);
  std::string bytes;
  GPUSNAP_RETURN_IF_ERROR(client
                              .FetchBlob(repo, blob, 0,
                                         [&](const char* d, size_t n) {
                                           if (bytes.size() + n > blob.size) return false;
                                           bytes.append(d, n);
                                           return true;
                                         })
                              .status());
  if (bytes.size() != blob.size || BlobDigest(Sha256Hex(bytes)) != blob.digest)
    return Status::Error(Code::kCorruption, "registry `{}`: blob {} does not match its digest", client.host(),
                         blob.digest);
  return bytes;
}

Status PutSmallBlob(RegistryClient& client, const std::string& repo, const std::string& bytes, const Blob& blob) {
  GPUSNAP_ASSIGN_OR_RETURN(bool there, client.HasBlob(repo, blob));
  if (there) return Status::Ok();
  return client.UploadBlob(repo, blob, [&bytes](uint64_t offset, char* buf, size_t n) {
    if (offset + n > bytes.size()) return false;
    std::memcpy(buf, bytes.data() + offset, n);
    return true;
  });
}

}  // namespace

Result<std::vector<FetchedSignature>> FetchSignatures(RegistryClient& client, const std::string& repo,
                                                      const std::string& manifest_digest) {
  std::vector<FetchedSignature> out;
  auto manifest = client.GetManifest(repo, SignatureAttachmentTag(manifest_digest));
  if (!manifest.ok() && manifest.status().code() == Code::kNotFound) return out;
  if (!manifest.ok()) return manifest.status();
  GPUSNAP_ASSIGN_OR_RETURN(SignatureAttachment attachment, ParseSignatureAttachment(manifest->bytes));
  for (const SignatureLayer& layer : attachment.layers) {
    if (layer.media_type != kSignaturePayloadMediaType || layer.signature_base64.empty()) continue;
    GPUSNAP_ASSIGN_OR_RETURN(std::string payload,
                             FetchSmallBlob(client, repo, layer.payload, kMaxSignaturePayloadBytes));
    out.push_back({std::move(payload), layer.signature_base64});
  }
  return out;
}

Status SignManifest(RegistryClient& client, const Reference& ref, const std::string& manifest_digest,
                    const SigningKey& key) {
  const std::string& repo = ref.repository;
  int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                    std::chrono::system_clock::now().time_since_epoch()).count();
  std::string payload = SignaturePayload({ref.ToString(), manifest_digest}, now);
  GPUSNAP_ASSIGN_OR_RETURN(std::string signature, key.Sign(payload));
  SignatureAttachment attachment;
  std::string tag = SignatureAttachmentTag(manifest_digest);
  auto existing = client.GetManifest(repo, tag);
  if (existing.ok()) {
    GPUSNAP_ASSIGN_OR_RETURN(attachment, ParseSignatureAttachment(existing->bytes));
  } else if (existing.status().code() != Code::kNotFound) {
    return existing.status();
  }
  SignatureLayer layer{{BlobDigest(Sha256Hex(payload)), payload.size(), {}}, kSignaturePayloadMediaType, signature};
  GPUSNAP_RETURN_IF_ERROR(PutSmallBlob(client, repo, payload, layer.payload));
  attachment.layers.push_back(std::move(layer));
  std::string config = SignatureAttachmentConfig(attachment.layers);
  attachment.config = {BlobDigest(Sha256Hex(config)), config.size(), {}};
  GPUSNAP_RETURN_IF_ERROR(PutSmallBlob(client, repo, config, attachment.config));
  return client.PutManifest(repo, tag, SignatureAttachmentManifest(attachment), kManifestMediaType).status();
}

}  // namespace gpusnap::registry
