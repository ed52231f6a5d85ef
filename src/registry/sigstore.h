// Sigstore signatures of a snapshot's manifest, in the form cosign and
// skopeo write and read (docs/DISTRIBUTION.md, "Signed snapshots"): the
// "simple signing" payload names a docker reference and the manifest's
// digest; an ECDSA P-256 signature over the payload's SHA-256, base64 of its
// DER, rides in the layer annotation kSignatureAnnotation of an OCI image
// manifest tagged `sha256-<hex>.sig` beside the signed manifest (the
// "sigstore attachment"), one layer per signature, its blob the payload.
//
// Pure but for the keys' files (LoadSigningKey, through util's ReadOwnerOnlyFile).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"
#include "registry/artifact.h"

namespace gpusnap::registry {

inline constexpr const char* kSignaturePayloadMediaType = "application/vnd.dev.cosign.simplesigning.v1+json";
inline constexpr const char* kSignatureAnnotation = "dev.cosignproject.cosign/signature";
inline constexpr const char* kOciImageConfigMediaType = "application/vnd.oci.image.config.v1+json";
inline constexpr uint64_t kMaxSignaturePayloadBytes = 4 << 20;

// What a payload claims.
struct SignedClaim {
  std::string docker_reference;  // "host/repo:tag" (or with @digest)
  std::string manifest_digest;   // "sha256:..."
  bool operator==(const SignedClaim&) const = default;
};

// Pure. The payload for a claim; `creator` and `timestamp` go to its
// "optional" part, as containers/image writes them.
std::string SignaturePayload(const SignedClaim& claim, int64_t timestamp);
// Pure. kInvalidArgument for a payload that is not the simple-signing
// format (the wrong type, a missing reference or digest).
Result<SignedClaim> ParseSignaturePayload(std::string_view payload);

// Pure. "sha256:<hex>" -> "sha256-<hex>.sig".
std::string SignatureAttachmentTag(std::string_view manifest_digest);

// One signature as the attachment carries it: its payload blob's
// descriptor, and the base64 signature of its annotation (empty: none).
struct SignatureLayer {
  Blob payload;
  std::string media_type;
  std::string signature_base64;
  bool operator==(const SignatureLayer&) const = default;
};

struct SignatureAttachment {
  Blob config;
  std::vector<SignatureLayer> layers;
};

// Pure. The attachment's config blob: an OCI image config listing the
// payloads' digests as the layers' diff_ids.
std::string SignatureAttachmentConfig(const std::vector<SignatureLayer>& layers);
// Pure. The attachment's manifest.
std::string SignatureAttachmentManifest(const SignatureAttachment& attachment);
// Pure. Reads an attachment manifest back (layers of other media types are
// kept, with their media type, for the caller to pass over).
Result<SignatureAttachment> ParseSignatureAttachment(std::string_view bytes);

// A private key that signs payloads.
class SigningKey {
 public:
  // Pure. `pem` is cosign's encrypted key ("ENCRYPTED SIGSTORE PRIVATE KEY"
  // or "ENCRYPTED COSIGN PRIVATE KEY": scrypt and NaCl secretbox around a
  // PKCS#8 key; `passphrase` opens it) or a plain PKCS#8 "PRIVATE KEY" / "EC
  // PRIVATE KEY" PEM. Only ECDSA P-256. Errors never quote the key.
  static Result<SigningKey> Parse(std::string_view pem, std::string_view passphrase);
  SigningKey(SigningKey&&) noexcept;
  SigningKey& operator=(SigningKey&&) noexcept;
  ~SigningKey();

  // The base64 of the DER ECDSA signature over SHA-256(payload).
  Result<std::string> Sign(std::string_view payload) const;
  // The public half, as a "PUBLIC KEY" PEM.
  std::string PublicKeyPem() const;

 private:
  struct Key;
  explicit SigningKey(std::unique_ptr<Key> key);
  std::unique_ptr<Key> key_;
};

// A public key that checks signatures.
class VerifyingKey {
 public:
  // Pure. A "PUBLIC KEY" PEM (PKIX), ECDSA P-256.
  static Result<VerifyingKey> Parse(std::string_view pem);
  VerifyingKey(VerifyingKey&&) noexcept;
  VerifyingKey& operator=(VerifyingKey&&) noexcept;
  ~VerifyingKey();

  // Pure. Whether `signature_base64` is this key's signature of `payload`.
  bool Verifies(std::string_view payload, std::string_view signature_base64) const;

 private:
  struct Key;
  explicit VerifyingKey(std::unique_ptr<Key> key);
  std::unique_ptr<Key> key_;
};

// The signing key of a push or a `sign`: the key file and, for cosign's
// encrypted format, the passphrase file (its first line), both owner-only.
Result<SigningKey> LoadSigningKey(const std::string& key_path, const std::string& passphrase_path);

}  // namespace gpusnap::registry
