// Encrypted artifacts in the format of the container ecosystem's image
// encryption (ocicrypt's, which skopeo and containerd read; docs/DISTRIBUTION.md,
// "Encrypted snapshots"): a blob's bytes under AES-256-CTR with an
// HMAC-SHA256 of the ciphertext, its media type suffixed `+encrypted`, and
// in its descriptor's annotations the symmetric key, the nonce and the
// plaintext's digest (the "private options") wrapped as a JWE for each
// recipient's public key, beside the HMAC (the "public options").
//
// The key and the nonce of a blob are derived from a tenant secret and the
// plaintext's digest (DeriveLayerKey): equal plaintexts under one secret are
// equal blobs, so a chunk pushed twice is stored and moved once, and the JWE
// still carries the key, so any ocicrypt reader decrypts it.
//
// Keys are never logged nor put in an error: errors name the key's file.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gpusnap/distribution.h"
#include "gpusnap/status.h"
#include "registry/artifact.h"
#include "registry/jwe.h"
#include "store/sha256.h"
#include "util/mutex.h"

struct evp_mac_ctx_st;
struct gcry_cipher_handle;  // libgcrypt's gcry_cipher_hd_t

namespace gpusnap::registry {

inline constexpr const char* kLayerCipher = "AES_256_CTR_HMAC_SHA256";
inline constexpr size_t kTenantSecretBytes = 32;

// The symmetric key and nonce of one blob.
struct LayerKey {
  std::array<unsigned char, 32> key{};
  std::array<unsigned char, 16> nonce{};
  bool operator==(const LayerKey&) const = default;
};

// Pure. The tenant secret of `bytes` (a secret file's, a Secret's): their
// SHA-256, so that any length of secret serves. kInvalidArgument naming
// `what`, never the bytes, when they are fewer than kTenantSecretBytes.
Result<std::array<unsigned char, kTenantSecretBytes>> TenantSecretOf(std::string_view bytes, std::string_view what);

// Pure. HKDF-SHA256 of the tenant secret, salted with the blob's plaintext
// digest ("sha256:<hex>"): its key, then its nonce.
LayerKey DeriveLayerKey(const std::array<unsigned char, kTenantSecretBytes>& secret, std::string_view plain_digest);

// Pure. XORs AES-256-CTR's keystream at byte `offset` of the blob into
// `data`, the nonce being the first counter block incremented as one
// 128-bit big-endian number (as Go's cipher.NewCTR, ocicrypt's, does):
// encrypts plaintext, decrypts ciphertext.
void ApplyKeystream(const LayerKey& key, uint64_t offset, char* data, size_t n);

// The same keystream applied to a blob piece by piece: one cipher handle,
// set up again only where a piece does not follow the last (a transfer
// resumed or restarted), since setting it up for every piece of a stream
// (4 KiB from the network) cost as much as the cipher itself. The cipher is
// libgcrypt's: its AES-CTR runs on the CPU's VAES instructions where they
// exist, twice as fast as OpenSSL 3.0's on our hosts (docs/BENCHMARK.md),
// and a sealed pull's extra time is that cipher.
class Keystream {
 public:
  explicit Keystream(const LayerKey& key);
  // `in[0, n)`, bytes at `offset` of the blob, XORed with the keystream
  // into `out` (which may be `in`, or apart from it).
  void Apply(uint64_t offset, const char* in, char* out, size_t n);
  void Apply(uint64_t offset, char* data, size_t n) { Apply(offset, data, data, n); }

 private:
  std::array<unsigned char, 16> nonce_;  // the key itself is in the handle only
  std::unique_ptr<gcry_cipher_handle, void (*)(gcry_cipher_handle*)> handle_;
  uint64_t next_ = 0;
  bool started_ = false;
};

// HMAC-SHA256 of a blob's ciphertext, keyed by its symmetric key (ocicrypt's).
class LayerMac {
 public:
  explicit LayerMac(const LayerKey& key);
  void Update(const char* data, size_t n);
  std::string Final();  // 32 bytes; the object is spent

 private:
  std::unique_ptr<evp_mac_ctx_st, void (*)(evp_mac_ctx_st*)> ctx_;
};

// What the JWE of a blob carries: ocicrypt's private options.
struct LayerSecrets {
  LayerKey key;
  std::string plain_digest;  // sha256:<hex> of the plaintext
  bool operator==(const LayerSecrets&) const = default;
};

// Pure. ocicrypt's private options, and back (kInvalidArgument on another shape).
std::string PrivateOptionsJson(const LayerSecrets& secrets);
Result<LayerSecrets> ParsePrivateOptions(std::string_view json);
// Pure. ocicrypt's public options for the HMAC (32 bytes), and back (the
// HMAC; kInvalidArgument for another cipher).
std::string PublicOptionsJson(std::string_view hmac);
Result<std::string> ParsePublicOptions(std::string_view json);

// The annotations of an encrypted blob (artifact.h's BlobEncryption).
Result<BlobEncryption> SealAnnotations(const LayerSecrets& secrets, std::string_view hmac,
                                       const std::vector<Pkey>& recipients);

// The secrets and the expected HMAC of an encrypted blob, with `keys`:
// kFailedPrecondition naming `ref` when there are none or none opens it.
struct OpenedBlob {
  LayerSecrets secrets;
  std::string hmac;
};
Result<OpenedBlob> OpenAnnotations(const BlobEncryption& enc, const DecryptionKeys* keys, std::string_view ref);

// A blob decrypted as its ciphertext streams: the HMAC of the ciphertext
// and, where kHere, the plaintext's SHA-256 against its key's options, both
// checked at the end. A file whose plaintext the caller checks against
// gpusnap.json itself once it is in (a pull's file of several digest
// chunks: CheckChunkedDigests) is kByCaller, not hashed once more here.
enum class PlainDigestCheck { kHere, kByCaller };
class BlobDecryption {
 public:
  BlobDecryption(OpenedBlob opened, PlainDigestCheck plain_check);
  // Ciphertext at `offset` of the blob, appended to `plain` decrypted.
  void Decrypt(uint64_t offset, const char* cipher, size_t n, std::string& plain);
  // Plaintext already decrypted (a resumed transfer), at `offset`: turned
  // back into ciphertext in place, so that the MAC covers it.
  void Replay(uint64_t offset, char* plain_to_cipher, size_t n);
  void Reset();
  // kCorruption naming `ref` and `what` when the HMAC or the plaintext's digest differ.
  Status Verify(std::string_view ref, std::string_view what);

 private:
  OpenedBlob opened_;
  PlainDigestCheck plain_check_;
  Keystream keystream_;
  LayerMac mac_;
  Sha256 plain_;
};

// A whole blob's ciphertext decrypted in place, its HMAC and its
// plaintext's digest checked (a config).
Result<std::string> DecryptBlob(const OpenedBlob& opened, std::string bytes, std::string_view ref,
                                std::string_view what);
// A chunk's ciphertext decrypted as it streams into the chunk's buffer: each
// piece MACed as it arrives and copied, as a chunk pushed in the clear is
// hashed and copied, and the keystream applied behind, a block at a time, on
// a thread of the chunk's own. The thread that receives then does what it
// does for a clear chunk: a pull's streams are each bound by their core, and
// the cipher inline made a sealed pull of the 8B-class snapshot 10-12%
// slower than a clear one (docs/BENCHMARK.md), while the host's other cores
// idled. Its HMAC is checked at the end.
// The HMAC stands for the blob's SHA-256: it is keyed, and the value it must
// have is in the blob's public options, in the manifest the pull pinned by
// digest (and a policy's signature), so bytes that pass it are the pushed
// ones and the blob's digest need not be hashed as well (on an H200 host
// that second hash of every byte, out of cache, made a sealed pull 67% slower
// than a clear one). The plaintext is for the caller to check by the chunk's XXH3 name, as
// a chunk pushed in the clear is checked; the plaintext's SHA-256 in the key's
// options would be one more hash of every byte, tying it to nothing the HMAC
// and the name do not.
class ChunkDecryption {
 public:
  // The plaintext goes to `plain`, from its start.
  ChunkDecryption(const OpenedBlob& opened, char* plain);
  // Waits for the thread that decrypts (a chunk given up part way).
  ~ChunkDecryption();
  ChunkDecryption(const ChunkDecryption&) = delete;
  ChunkDecryption& operator=(const ChunkDecryption&) = delete;
  // The next `n` bytes of the blob's ciphertext (`cipher` may be where
  // they go in `plain`).
  void Take(const char* cipher, size_t n);
  // Decrypts what is left and waits for the whole; kCorruption naming `ref`
  // and `what` when the HMAC of what was taken differs (then `plain` is not
  // plaintext, nor to be used).
  Status Finish(std::string_view ref, std::string_view what);

 private:
  // To the thread that decrypts (started by the first block): `plain_[0, end)`
  // is ciphertext to decrypt; `last`: nothing follows.
  void HandOn(uint64_t end, bool last);
  void DecryptBehind();

  const OpenedBlob& opened_;
  char* plain_;
  LayerMac mac_;
  uint64_t taken_ = 0;
  uint64_t handed_on_ = 0;
  Mutex mu_;
  std::condition_variable more_;
  uint64_t to_decrypt_ GUARDED_BY(mu_) = 0;
  bool last_ GUARDED_BY(mu_) = false;
  std::thread decrypting_;
};
// A whole chunk's ciphertext decrypted in place (ChunkDecryption).
Result<std::string> DecryptChunk(const OpenedBlob& opened, std::string bytes, std::string_view ref,
                                 std::string_view what);

}  // namespace gpusnap::registry

namespace gpusnap {

struct EncryptionKeys {
  std::vector<registry::Pkey> recipients;
  std::array<unsigned char, registry::kTenantSecretBytes> secret{};
};

struct DecryptionKeys {
  std::vector<registry::Pkey> keys;
  // Whose keys these are, for the refusals of an artifact they do not open:
  // "none of the 2 {given} opens it", "give {give}, the private key of one of its recipients".
  std::string given = "--decryption-key given";
  std::string give = "--decryption-key";
};

}  // namespace gpusnap
