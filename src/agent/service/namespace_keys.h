// A namespace's keys for encrypted artifacts (docs/SECURITY.md, "A
// namespace's keys"): what opens the encrypted artifacts its placeholders
// restore, and whom its pods' pushes are encrypted for. Two places give them,
// and a namespace's transfers use both:
//
// - its own Secret `gpusnap` (registry_access.h), in these data keys, each
//   optional:
//     decryption-key.pem         PEM private keys (RSA; EC on P-256, P-384,
//                                P-521), one or more
//     encryption-recipients.pem  PEM public keys or certificates, one or more
//     encryption-secret          the tenant secret its blobs' keys derive
//                                from (at least 32 bytes)
// - the administrator's tenancy configuration: key files named per namespace
//   (tenancy::KeyFiles), read at each use.
//
// Never the agent's own keys (`gpusnap agent --decryption-key`,
// `--encryption-key`), which serve the API's callers: a namespace opens only
// what was encrypted for its own keys. The keys are never logged nor put in
// an error, a metric or a job record: errors name the Secret and its data
// key, or the file.
#pragma once

#include <array>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpusnap/distribution.h"
#include "gpusnap/status.h"
#include "registry/encryption.h"
#include "tenancy/tenancy.h"

namespace gpusnap::agent {

inline constexpr const char* kSecretDecryptionKeys = "decryption-key.pem";
inline constexpr const char* kSecretEncryptionRecipients = "encryption-recipients.pem";
inline constexpr const char* kSecretEncryptionSecret = "encryption-secret";

// The keys of one place, parsed.
struct KeyMaterial {
  std::vector<registry::Pkey> decryption;
  std::vector<registry::Pkey> recipients;
  std::optional<std::array<unsigned char, registry::kTenantSecretBytes>> secret;
};

// Pure. The keys in a namespace's Secret (`secret` as the API server gives
// it: `data` in base64), none of them required. kInvalidArgument naming
// `name` (the Secret) and the data key at fault, never the bytes.
Result<KeyMaterial> KeysOfSecret(const nlohmann::json& secret, std::string_view name);

// The keys of the administrator's files for namespace `ns`, read now: the
// private keys and the secret from files only their owner may read.
Result<KeyMaterial> ReadKeyFiles(const tenancy::KeyFiles& files, std::string_view ns);

// What a namespace's pulls and pushes use.
struct NamespaceKeys {
  std::shared_ptr<const EncryptionKeys> encryption;  // none: its pushes go in the clear
  std::shared_ptr<const DecryptionKeys> decryption;  // always set; no keys: an encrypted artifact is refused
};

// Pure. The Secret's keys and the administrator's together: the private keys
// of both (their refusals naming the namespace), the recipients of both, the Secret's tenant secret, else the
// administrator's. Recipients without a secret are kInvalidArgument naming
// the namespace: a fresh secret per push would move every chunk again. A
// secret without recipients encrypts nothing.
Result<NamespaceKeys> CombineNamespaceKeys(const KeyMaterial& own, const KeyMaterial& administrators,
                                           std::string_view ns);

}  // namespace gpusnap::agent
