#include "registry/encryption.h"

#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>

#include <gcrypt.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "registry/auth.h"
#include "util/c_ptr.h"
#include "util/files.h"

namespace gpusnap::registry {

namespace {

using nlohmann::json;

std::string Bytes(const unsigned char* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n); }

std::string Str(const json& o, const char* key) {
  auto it = o.is_object() ? o.find(key) : o.end();
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string RandomBytes(size_t n) {
  std::string s(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), int(n)) != 1) std::abort();  // no entropy: nothing is safe
  return s;
}

}  // namespace

LayerKey DeriveLayerKey(const std::array<unsigned char, kTenantSecretBytes>& secret, std::string_view plain_digest) {
  LayerKey out;
  std::array<unsigned char, 48> okm{};
  EVP_KDF* kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  EVP_KDF_CTX* ctx = EVP_KDF_CTX_new(kdf);
  EVP_KDF_free(kdf);
  static constexpr char kInfo[] = "gpusnap ocicrypt blob key and nonce v1";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, const_cast<char*>("SHA256"), 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<unsigned char*>(secret.data()), secret.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, const_cast<char*>(plain_digest.data()),
                                        plain_digest.size()),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, const_cast<char*>(kInfo), sizeof kInfo - 1),
      OSSL_PARAM_construct_end()};
  if (!ctx || EVP_KDF_derive(ctx, okm.data(), okm.size(), params) != 1) std::abort();  // SHA-256 HKDF is always there
  EVP_KDF_CTX_free(ctx);
  std::memcpy(out.key.data(), okm.data(), 32);
  std::memcpy(out.nonce.data(), okm.data() + 32, 16);
  return out;
}

namespace {

// libgcrypt is initialised once, before its first cipher; gpusnap keeps no
// key in its secure memory (the keys of a pull are in ordinary memory
// anyway, and the handle wipes its copy when closed).
void InitGcrypt() {
  static const bool ready = [] {
    if (!gcry_check_version(GCRYPT_VERSION)) std::abort();  // an older libgcrypt than the build's
    gcry_control(GCRYCTL_DISABLE_SECMEM, 0);
    gcry_control(GCRYCTL_INITIALIZATION_FINISHED, 0);
    return true;
  }();
  (void)ready;
}

gcry_cipher_handle* OpenAesCtr(const LayerKey& key) {
  InitGcrypt();
  gcry_cipher_hd_t handle = nullptr;
  if (gcry_cipher_open(&handle, GCRY_CIPHER_AES256, GCRY_CIPHER_MODE_CTR, 0) != 0 ||
      gcry_cipher_setkey(handle, key.key.data(), key.key.size()) != 0)
    std::abort();  // AES-256-CTR is in every libgcrypt
  return handle;
}

}  // namespace

Keystream::Keystream(const LayerKey& key) : nonce_(key.nonce), handle_(OpenAesCtr(key), gcry_cipher_close) {}

void Keystream::Apply(uint64_t offset, const char* in, char* out, size_t n) {
  if (!started_ || offset != next_) {
    // The counter block of `offset`: the nonce plus offset / 16, carried over all 128 bits.
    std::array<unsigned char, 16> counter = nonce_;
    uint64_t add = offset / 16;
    for (int i = 15; i >= 0 && add; --i) {
      uint64_t sum = uint64_t(counter[size_t(i)]) + (add & 0xff);
      counter[size_t(i)] = uint8_t(sum);
      add = (add >> 8) + (sum >> 8);
    }
    unsigned char skip[16] = {};
    if (gcry_cipher_setctr(handle_.get(), counter.data(), counter.size()) != 0 ||
        (offset % 16 && gcry_cipher_encrypt(handle_.get(), skip, offset % 16, nullptr, 0) != 0))
      std::abort();
    started_ = true;
  }
  next_ = offset + n;
  gcry_error_t failed = in == out ? gcry_cipher_encrypt(handle_.get(), out, n, nullptr, 0)
                                  : gcry_cipher_encrypt(handle_.get(), out, n, in, n);
  if (failed) std::abort();
}

void ApplyKeystream(const LayerKey& k, uint64_t offset, char* data, size_t n) { Keystream(k).Apply(offset, data, n); }

LayerMac::LayerMac(const LayerKey& key) : ctx_(nullptr, EVP_MAC_CTX_free) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  ctx_.reset(EVP_MAC_CTX_new(mac));
  EVP_MAC_free(mac);
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, const_cast<char*>("SHA256"), 0),
                         OSSL_PARAM_construct_end()};
  if (!ctx_ || EVP_MAC_init(ctx_.get(), key.key.data(), key.key.size(), params) != 1) std::abort();
}

void LayerMac::Update(const char* data, size_t n) {
  if (EVP_MAC_update(ctx_.get(), reinterpret_cast<const unsigned char*>(data), n) != 1) std::abort();
}

std::string LayerMac::Final() {
  unsigned char out[32];
  size_t n = 0;
  if (EVP_MAC_final(ctx_.get(), out, &n, sizeof out) != 1) std::abort();
  return Bytes(out, n);
}

std::string PrivateOptionsJson(const LayerSecrets& s) {
  return json{{"symkey", Base64Encode(Bytes(s.key.key.data(), s.key.key.size()))},
              {"digest", s.plain_digest},
              {"cipheroptions", {{"nonce", Base64Encode(Bytes(s.key.nonce.data(), s.key.nonce.size()))}}}}
      .dump();
}

Result<LayerSecrets> ParsePrivateOptions(std::string_view text) {
  auto bad = [](std::string_view why) {
    return Status::Error(Code::kInvalidArgument, "its key's options are not ocicrypt's: {}", why);
  };
  json o = json::parse(text, nullptr, false);
  if (!o.is_object()) return bad("not a JSON object");
  LayerSecrets s;
  auto key = Base64Decode(Str(o, "symkey"));
  auto nonce = Base64Decode(o.contains("cipheroptions") ? Str(o["cipheroptions"], "nonce") : "");
  if (!key || key->size() != s.key.key.size()) return bad("no 32-byte symkey");
  if (!nonce || nonce->size() != s.key.nonce.size()) return bad("no 16-byte nonce");
  std::memcpy(s.key.key.data(), key->data(), key->size());
  std::memcpy(s.key.nonce.data(), nonce->data(), nonce->size());
  s.plain_digest = Str(o, "digest");
  if (!s.plain_digest.starts_with("sha256:") || s.plain_digest.size() != 71) return bad("no sha256 digest");
  return s;
}

std::string PublicOptionsJson(std::string_view hmac) {
  return json{{"cipher", kLayerCipher}, {"hmac", Base64Encode(hmac)}, {"cipheroptions", json::object()}}.dump();
}

Result<std::string> ParsePublicOptions(std::string_view text) {
  json o = json::parse(text, nullptr, false);
  std::string cipher = Str(o, "cipher");
  if (cipher != kLayerCipher)
    return Status::Error(Code::kInvalidArgument, "it is encrypted with `{}`, not {}", cipher.substr(0, 60), kLayerCipher);
  auto hmac = Base64Decode(Str(o, "hmac"));
  if (!hmac || hmac->size() != 32) return Status::Error(Code::kInvalidArgument, "its options hold no 32-byte HMAC");
  return *hmac;
}

Result<BlobEncryption> SealAnnotations(const LayerSecrets& secrets, std::string_view hmac,
                                       const std::vector<Pkey>& recipients) {
  GPUSNAP_ASSIGN_OR_RETURN(std::string jwe, JweEncrypt(PrivateOptionsJson(secrets), recipients));
  return BlobEncryption{Base64Encode(jwe), Base64Encode(PublicOptionsJson(hmac))};
}

Result<OpenedBlob> OpenAnnotations(const BlobEncryption& enc, const DecryptionKeys* keys, std::string_view ref) {
  if (!keys || keys->keys.empty())
    return Status::Error(Code::kFailedPrecondition, "`{}` is encrypted: give {}, the private key of one of its recipients",
                         ref, keys ? keys->give : DecryptionKeys().give);
  auto invalid = [ref](const Status& st) {
    return Status::Error(Code::kInvalidArgument, "`{}` is encrypted, but {}", ref, st.message());
  };
  // ocicrypt joins the JWEs of several wrappings with commas.
  Status last = Status::Ok();
  std::string_view all = enc.keys_jwe;
  for (size_t start = 0; start <= all.size();) {
    size_t end = std::min(all.find(',', start), all.size());
    auto jwe = Base64Decode(all.substr(start, end - start));
    start = end + 1;
    if (!jwe) {
      last = Status::Error(Code::kInvalidArgument, "its key annotation is not base64");
      continue;
    }
    auto payload = JweDecrypt(*jwe, keys->keys);
    if (!payload.ok()) {
      last = payload.status();
      continue;
    }
    auto secrets = ParsePrivateOptions(*payload);
    if (!secrets.ok()) return invalid(secrets.status());
    auto pub = Base64Decode(enc.public_options);
    if (!pub) return invalid(Status::Error(Code::kInvalidArgument, "its public options are not base64"));
    auto hmac = ParsePublicOptions(*pub);
    if (!hmac.ok()) return invalid(hmac.status());
    return OpenedBlob{std::move(secrets).value(), std::move(hmac).value()};
  }
  if (last.code() == Code::kInvalidArgument) return invalid(last);
  return Status::Error(Code::kFailedPrecondition,
                       "`{}` is encrypted for other recipients: none of the {} {} opens it", ref, keys->keys.size(),
                       keys->given);
}

BlobDecryption::BlobDecryption(OpenedBlob opened, PlainDigestCheck plain_check)
    : opened_(std::move(opened)),
      plain_check_(plain_check),
      keystream_(opened_.secrets.key),
      mac_(opened_.secrets.key) {}

void BlobDecryption::Decrypt(uint64_t offset, const char* cipher, size_t n, std::string& plain) {
  mac_.Update(cipher, n);
  size_t at = plain.size();
  plain.append(cipher, n);
  keystream_.Apply(offset, plain.data() + at, n);
  if (plain_check_ == PlainDigestCheck::kHere) plain_.Update(plain.data() + at, n);
}

void BlobDecryption::Replay(uint64_t offset, char* data, size_t n) {
  if (plain_check_ == PlainDigestCheck::kHere) plain_.Update(data, n);
  keystream_.Apply(offset, data, n);
  mac_.Update(data, n);
}

void BlobDecryption::Reset() {
  mac_ = LayerMac(opened_.secrets.key);
  plain_ = Sha256();
}

namespace {

// The HMAC of a blob's ciphertext against its key's.
Status CheckMac(const OpenedBlob& opened, std::string_view mac, std::string_view ref, std::string_view what) {
  if (mac != opened.hmac)
    return Status::Error(Code::kCorruption, "`{}`: {} does not match its HMAC (altered, or not what was encrypted); "
                         "not stored", ref, what);
  return Status::Ok();
}

// The digest of a blob's plaintext against its key's options.
Status CheckPlainDigest(const OpenedBlob& opened, std::string_view plain_digest, std::string_view ref,
                        std::string_view what) {
  if (plain_digest != opened.secrets.plain_digest)
    return Status::Error(Code::kCorruption, "`{}`: {} decrypts to bytes of {}, not {}; not stored", ref, what,
                         plain_digest, opened.secrets.plain_digest);
  return Status::Ok();
}

}  // namespace

Status BlobDecryption::Verify(std::string_view ref, std::string_view what) {
  GPUSNAP_RETURN_IF_ERROR(CheckMac(opened_, mac_.Final(), ref, what));
  if (plain_check_ == PlainDigestCheck::kByCaller) return Status::Ok();
  return CheckPlainDigest(opened_, "sha256:" + plain_.HexFinal(), ref, what);
}

namespace {
// A block handed to the thread that decrypts: large enough that handing it
// on costs nothing beside its cipher, small enough that the thread runs close
// behind the network.
constexpr uint64_t kDecryptBehindBlock = 1 << 20;
}  // namespace

ChunkDecryption::ChunkDecryption(const OpenedBlob& opened, char* plain)
    : opened_(opened), plain_(plain), mac_(opened.secrets.key) {}

ChunkDecryption::~ChunkDecryption() {
  if (!decrypting_.joinable()) return;
  HandOn(handed_on_, true);
  decrypting_.join();
}

void ChunkDecryption::Take(const char* cipher, size_t n) {
  mac_.Update(cipher, n);
  if (plain_ + taken_ != cipher) std::memcpy(plain_ + taken_, cipher, n);
  taken_ += n;
  if (taken_ - handed_on_ >= kDecryptBehindBlock) HandOn(taken_, false);
}

void ChunkDecryption::HandOn(uint64_t end, bool last) {
  {
    MutexLock lock(mu_);
    to_decrypt_ = end;
    last_ = last;
  }
  handed_on_ = end;
  if (!decrypting_.joinable()) decrypting_ = std::thread([this] { DecryptBehind(); });
  more_.notify_one();
}

void ChunkDecryption::DecryptBehind() {
  Keystream keystream(opened_.secrets.key);
  uint64_t done = 0;
  for (;;) {
    uint64_t end = 0;
    bool last = false;
    {
      MutexLock lock(mu_);
      while (to_decrypt_ == done && !last_) lock.Wait(more_);
      end = to_decrypt_;
      last = last_;
    }
    keystream.Apply(done, plain_ + done, end - done);
    done = end;
    if (last) return;
  }
}

Status ChunkDecryption::Finish(std::string_view ref, std::string_view what) {
  if (decrypting_.joinable()) {
    HandOn(taken_, true);
    decrypting_.join();
  } else {
    Keystream(opened_.secrets.key).Apply(0, plain_, taken_);  // a chunk under one block
  }
  return CheckMac(opened_, mac_.Final(), ref, what);
}

Result<std::string> DecryptChunk(const OpenedBlob& opened, std::string bytes, std::string_view ref,
                                 std::string_view what) {
  ChunkDecryption decryption(opened, bytes.data());
  decryption.Take(bytes.data(), bytes.size());
  GPUSNAP_RETURN_IF_ERROR(decryption.Finish(ref, what));
  return bytes;
}

Result<std::string> DecryptBlob(const OpenedBlob& opened, std::string bytes, std::string_view ref,
                                std::string_view what) {
  GPUSNAP_ASSIGN_OR_RETURN(bytes, DecryptChunk(opened, std::move(bytes), ref, what));
  GPUSNAP_RETURN_IF_ERROR(CheckPlainDigest(opened, "sha256:" + Sha256Hex(bytes), ref, what));
  return bytes;
}

Result<std::array<unsigned char, kTenantSecretBytes>> TenantSecretOf(std::string_view bytes, std::string_view what) {
  if (bytes.size() < kTenantSecretBytes)
    return Status::Error(Code::kInvalidArgument, "{} holds {} bytes; at least {} are needed", what, bytes.size(),
                         kTenantSecretBytes);
  // Any length of secret, made into the HKDF's 32 bytes.
  Sha256 h;
  h.Update(bytes);
  auto digest = h.Final();
  std::array<unsigned char, kTenantSecretBytes> out{};
  std::memcpy(out.data(), digest.data(), out.size());
  OPENSSL_cleanse(digest.data(), digest.size());
  return out;
}

}  // namespace gpusnap::registry

namespace gpusnap {

Result<std::shared_ptr<const EncryptionKeys>> ReadEncryptionKeys(const std::vector<std::string>& recipients,
                                                                 const std::string& secret_file) {
  auto keys = std::make_shared<EncryptionKeys>();
  for (const std::string& r : recipients) {
    if (!r.starts_with("jwe:"))
      return Status::Error(Code::kInvalidArgument,
                           "--encryption-key `{}`: expected jwe:PUBLIC-KEY.pem (gpusnap wraps keys as JWE only)",
                           r.substr(0, r.find(':') == std::string::npos ? r.size() : r.find(':') + 1));
    std::string path = r.substr(4);
    GPUSNAP_ASSIGN_OR_RETURN(std::string pem, ReadFile(path));
    GPUSNAP_ASSIGN_OR_RETURN(auto parsed, registry::ParsePublicKeysPem(pem, fmt::format("--encryption-key `{}`", path)));
    keys->recipients.insert(keys->recipients.end(), parsed.begin(), parsed.end());
  }
  if (keys->recipients.empty())
    return Status::Error(Code::kInvalidArgument, "--encryption-secret-file needs --encryption-key: whom to encrypt for");
  if (secret_file.empty()) {
    std::string fresh = registry::RandomBytes(registry::kTenantSecretBytes);
    std::memcpy(keys->secret.data(), fresh.data(), keys->secret.size());
    OPENSSL_cleanse(fresh.data(), fresh.size());
  } else {
    GPUSNAP_ASSIGN_OR_RETURN(std::string secret, ReadOwnerOnlyFile(secret_file, "--encryption-secret-file"));
    auto derived = registry::TenantSecretOf(secret, fmt::format("--encryption-secret-file `{}`", secret_file));
    OPENSSL_cleanse(secret.data(), secret.size());
    if (!derived.ok()) return derived.status();
    keys->secret = *derived;
  }
  return std::shared_ptr<const EncryptionKeys>(std::move(keys));
}

Result<std::shared_ptr<const DecryptionKeys>> ReadDecryptionKeys(const std::vector<std::string>& files) {
  auto keys = std::make_shared<DecryptionKeys>();
  for (const std::string& path : files) {
    GPUSNAP_ASSIGN_OR_RETURN(std::string pem, ReadOwnerOnlyFile(path, "--decryption-key"));
    auto parsed = registry::ParsePrivateKeysPem(pem, fmt::format("--decryption-key `{}`", path));
    OPENSSL_cleanse(pem.data(), pem.size());
    if (!parsed.ok()) return parsed.status();
    keys->keys.insert(keys->keys.end(), parsed->begin(), parsed->end());
  }
  return std::shared_ptr<const DecryptionKeys>(std::move(keys));
}

}  // namespace gpusnap
