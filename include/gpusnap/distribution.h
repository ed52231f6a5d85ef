// Snapshots that travel: push a snapshot of the local store to an OCI
// registry as an artifact, pull one into the store (docs/DISTRIBUTION.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpusnap/progress.h"
#include "gpusnap/status.h"
#include "store/registry_reference.h"

namespace gpusnap {

namespace registry {
struct TrustPolicy;     // registry/trust_policy.h
class SigningKey;       // registry/sigstore.h
struct RegistriesConf;  // registry/registries_conf.h
}  // namespace registry
// The keys of encrypted artifacts (docs/DISTRIBUTION.md, "Encrypted
// snapshots"), read once where they enter; opaque here, never printed.
struct EncryptionKeys;
struct DecryptionKeys;

// What a push encrypts for: the recipients (each `jwe:PUB.pem`, a public key
// as skopeo's --encryption-key names it) and the tenant secret from which
// every blob's key derives (a file of mode 0600 holding at least 32 bytes;
// empty: a fresh secret, so that no blob of this push equals one of another).
Result<std::shared_ptr<const EncryptionKeys>> ReadEncryptionKeys(const std::vector<std::string>& recipients,
                                                                 const std::string& secret_file);
// Private keys (PEM files of mode 0600, not passphrase-protected).
Result<std::shared_ptr<const DecryptionKeys>> ReadDecryptionKeys(const std::vector<std::string>& files);

// How to reach a registry.
struct RegistryAccess {
  std::string credentials_file;  // a docker config.json; empty: $DOCKER_CONFIG, then ~/.docker
  std::string ca_file;           // verify TLS against this CA only; empty: the system's CAs
  bool plain_http = false;       // HTTP instead of HTTPS, only when asked
  int timeout_s = 60;            // per request, between bytes
  // The slowest a blob may arrive: bytes/s over each timeout_s (0: no floor),
  // so that a registry dripping bytes cannot hold a pull for hours.
  uint64_t min_rate = 1024;
  int jobs = 8;                  // blobs moved at once
  // What a pull trusts (containers-policy.json, parsed where it entered:
  // registry::LoadTrustPolicy). Unset: registry::kDefaultPolicyPath, read
  // when a pull begins; a pull without a policy is refused.
  std::shared_ptr<const registry::TrustPolicy> policy;
  // Where a pull reads from: the mirrors of a containers-registries.conf,
  // parsed where it entered (registry::LoadRegistriesConf). Unset: the
  // default (registry::LoadRegistriesConf("")), read when a pull begins.
  // Pushes go to the reference's registry alone.
  std::shared_ptr<const registry::RegistriesConf> registries;
  // Opens encrypted artifacts; none: an encrypted artifact is refused.
  std::shared_ptr<const DecryptionKeys> decryption_keys;
};

struct PushOptions {
  std::string store;
  std::string id;         // a snapshot in the store
  RegistryReference reference;  // host[:port]/repository[:tag]: parsed where it entered (ParseRegistryReference)
  std::string mount_from; // another repository of the same registry that may hold the blobs
  // Set: the pushed manifest is signed (a sigstore attachment) as `reference`.
  std::shared_ptr<const registry::SigningKey> signing_key;
  std::shared_ptr<const EncryptionKeys> encryption;  // none: the blobs are pushed as they are
  RegistryAccess access;
  ProgressFn progress;
};

struct TransferResult {
  std::string id;               // the snapshot, in the local store
  std::string reference;        // RegistryReference::ToString of the one moved
  std::string manifest_digest;  // sha256:...
  uint64_t blobs = 0;           // in the artifact, config included
  uint64_t blobs_moved = 0;     // uploaded, or downloaded
  uint64_t blobs_skipped = 0;   // already there (or mounted from another repository)
  uint64_t bytes_moved = 0;
  uint64_t bytes_total = 0;
  double seconds = 0;
  bool already_present = false;  // a pull that found the snapshot in the store
};

// Verifies the snapshot, then uploads the blobs the registry lacks (HEAD
// first; a blob found in `mount_from`, another repository of the same
// registry, is mounted instead), then the manifest under the reference's tag.
Result<TransferResult> Push(const PushOptions& options);

// Signs what `reference` names in its registry (a tag is resolved to its
// manifest's digest, which is signed); returns the digest.
Result<std::string> Sign(const RegistryReference& reference, const registry::SigningKey& key,
                         const RegistryAccess& access);

struct PullOptions {
  std::string store;
  RegistryReference reference;  // host[:port]/repository[:tag|@digest]: parsed where it entered
  std::string as_id;      // the id in the local store; empty: the snapshot's own
  RegistryAccess access;
  ProgressFn progress;
};

// Resolves the reference to its manifest's digest and judges its signatures
// by `access.policy` before any other blob is fetched (the manifest, the
// signatures and the blobs come from `access.registries`' mirrors of the
// reference, then its registry; each is checked against the reference the
// user named, wherever it came from); then fetches what the
// store lacks (chunks already in it are not fetched again),
// checking every blob's digest as it streams, into a staging directory that
// survives an interruption (the next pull goes on from there), then publishes
// the snapshot at once. Two pulls of one manifest on one store take turns:
// the second finds the snapshot in place.
Result<TransferResult> Pull(const PullOptions& options);

}  // namespace gpusnap
