#include "registry/encryption.h"

#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>

#include <fmt/format.h>

#include <cstring>
#include <nlohmann/json.hpp>

#include "registry/auth.h"
#include "util/files.h"

namespace gpusnap::registry {

namespace {

using nlohmann::json;

template <typename T, void (*Free)(T*)>
struct Freer {
  void operator()(T* p) const { Free(p); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, Freer<EVP_CIPHER_CTX, EVP_CIPHER_CTX_free>>;
using PkeyCtx = std::unique_ptr<EVP_PKEY_CTX, Freer<EVP_PKEY_CTX, EVP_PKEY_CTX_free>>;
using Bio = std::unique_ptr<BIO, Freer<BIO, BIO_free_all>>;

constexpr const char* kContentEncryption = "A256GCM";
constexpr size_t kGcmIvBytes = 12, kGcmTagBytes = 16;

std::string Bytes(const unsigned char* p, size_t n) { return std::string(reinterpret_cast<const char*>(p), n); }

// RFC 7515's base64url, without padding.
std::string Base64Url(std::string_view bytes) {
  std::string s = Base64Encode(bytes);
  while (!s.empty() && s.back() == '=') s.pop_back();
  for (char& c : s) c = c == '+' ? '-' : c == '/' ? '_' : c;
  return s;
}

std::optional<std::string> FromBase64Url(std::string s) {
  for (char& c : s) {
    if (c == '+' || c == '/' || c == '=') return std::nullopt;
    c = c == '-' ? '+' : c == '_' ? '/' : c;
  }
  while (s.size() % 4) s.push_back('=');
  return Base64Decode(s);
}

std::string Str(const json& o, const char* key) {
  auto it = o.is_object() ? o.find(key) : o.end();
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

const EVP_CIPHER* GcmOf(std::string_view enc) {
  if (enc == "A256GCM") return EVP_aes_256_gcm();
  if (enc == "A192GCM") return EVP_aes_192_gcm();
  if (enc == "A128GCM") return EVP_aes_128_gcm();
  return nullptr;
}

Result<std::string> RsaOaep(bool encrypt, EVP_PKEY* key, const EVP_MD* md, std::string_view in) {
  PkeyCtx ctx(EVP_PKEY_CTX_new(key, nullptr));
  size_t n = 0;
  auto fail = [] { return Status::Error(Code::kFailedPrecondition, "RSA-OAEP failed"); };
  if (!ctx || (encrypt ? EVP_PKEY_encrypt_init(ctx.get()) : EVP_PKEY_decrypt_init(ctx.get())) <= 0 ||
      EVP_PKEY_CTX_set_rsa_padding(ctx.get(), RSA_PKCS1_OAEP_PADDING) <= 0 ||
      EVP_PKEY_CTX_set_rsa_oaep_md(ctx.get(), md) <= 0 || EVP_PKEY_CTX_set_rsa_mgf1_md(ctx.get(), md) <= 0)
    return fail();
  auto run = [&](unsigned char* out, size_t* len) {
    auto* p = reinterpret_cast<const unsigned char*>(in.data());
    return encrypt ? EVP_PKEY_encrypt(ctx.get(), out, len, p, in.size())
                   : EVP_PKEY_decrypt(ctx.get(), out, len, p, in.size());
  };
  if (run(nullptr, &n) <= 0) return fail();
  std::string out(n, '\0');
  if (run(reinterpret_cast<unsigned char*>(out.data()), &n) <= 0) return fail();
  out.resize(n);
  return out;
}

// AES-GCM of `in` under `cek`, authenticating `aad`; decrypting, `tag` is checked.
Result<std::string> Gcm(bool encrypt, const EVP_CIPHER* cipher, std::string_view cek, std::string_view iv,
                        std::string_view aad, std::string_view in, std::string* tag) {
  auto fail = [] { return Status::Error(Code::kFailedPrecondition, "AES-GCM failed"); };
  if (cek.size() != size_t(EVP_CIPHER_get_key_length(cipher)) || iv.size() != kGcmIvBytes) return fail();
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  auto u = [](std::string_view s) { return reinterpret_cast<const unsigned char*>(s.data()); };
  int len = 0;
  std::string out(in.size() + 16, '\0');
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  if (!ctx || EVP_CipherInit_ex(ctx.get(), cipher, nullptr, u(cek), u(iv), encrypt ? 1 : 0) != 1) return fail();
  if (EVP_CipherUpdate(ctx.get(), nullptr, &len, u(aad), int(aad.size())) != 1) return fail();
  if (EVP_CipherUpdate(ctx.get(), o, &len, u(in), int(in.size())) != 1) return fail();
  int total = len;
  if (!encrypt) {
    if (tag->size() != kGcmTagBytes ||
        EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, int(tag->size()), tag->data()) != 1)
      return fail();
  }
  if (EVP_CipherFinal_ex(ctx.get(), o + total, &len) != 1) return fail();
  total += len;
  if (encrypt) {
    tag->assign(kGcmTagBytes, '\0');
    if (EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, int(kGcmTagBytes), tag->data()) != 1) return fail();
  }
  out.resize(size_t(total));
  return out;
}

std::string RandomBytes(size_t n) {
  std::string s(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(s.data()), int(n)) != 1) std::abort();  // no entropy: nothing is safe
  return s;
}

bool IsRsa(const Pkey& k) { return EVP_PKEY_is_a(k.get(), "RSA") == 1; }

}  // namespace

Pkey::Pkey(evp_pkey_st* key) : key_(key, EVP_PKEY_free) {}

Result<Pkey> ParsePublicKeyPem(std::string_view pem, std::string_view what) {
  Bio bio(BIO_new_mem_buf(pem.data(), int(pem.size())));
  EVP_PKEY* key = bio ? PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr) : nullptr;
  if (!key) {
    Bio again(BIO_new_mem_buf(pem.data(), int(pem.size())));
    if (X509* cert = again ? PEM_read_bio_X509(again.get(), nullptr, nullptr, nullptr) : nullptr) {
      key = X509_get_pubkey(cert);
      X509_free(cert);
    }
  }
  if (!key) return Status::Error(Code::kInvalidArgument, "{} is not a PEM public key or certificate", what);
  Pkey k(key);
  if (!IsRsa(k)) return Status::Error(Code::kInvalidArgument, "{} is not an RSA key: gpusnap wraps keys with RSA-OAEP", what);
  return k;
}

Result<Pkey> ParsePrivateKeyPem(std::string_view pem, std::string_view what) {
  Bio bio(BIO_new_mem_buf(pem.data(), int(pem.size())));
  // A passphrase callback that gives none: an encrypted key fails to read.
  auto no_passphrase = [](char*, int, int, void*) { return 0; };
  EVP_PKEY* key = bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr) : nullptr;
  if (!key)
    return Status::Error(Code::kInvalidArgument, "{} is not a PEM private key (one without a passphrase)", what);
  Pkey k(key);
  if (!IsRsa(k)) return Status::Error(Code::kInvalidArgument, "{} is not an RSA key: gpusnap unwraps keys with RSA-OAEP", what);
  return k;
}

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

void ApplyKeystream(const LayerKey& k, uint64_t offset, char* data, size_t n) {
  // The counter block of `offset`: the nonce plus offset / 16, carried over all 128 bits.
  std::array<unsigned char, 16> counter = k.nonce;
  uint64_t add = offset / 16;
  for (int i = 15; i >= 0 && add; --i) {
    uint64_t sum = uint64_t(counter[size_t(i)]) + (add & 0xff);
    counter[size_t(i)] = uint8_t(sum);
    add = (add >> 8) + (sum >> 8);
  }
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  int len = 0;
  unsigned char skip[16];
  if (!ctx || EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_ctr(), nullptr, k.key.data(), counter.data()) != 1 ||
      (offset % 16 && EVP_EncryptUpdate(ctx.get(), skip, &len, skip, int(offset % 16)) != 1))
    std::abort();
  auto* p = reinterpret_cast<unsigned char*>(data);
  while (n > 0) {
    int step = int(std::min<size_t>(n, 1 << 30));
    if (EVP_EncryptUpdate(ctx.get(), p, &len, p, step) != 1) std::abort();
    p += step;
    n -= size_t(step);
  }
}

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

Result<std::string> JweEncrypt(std::string_view payload, const std::vector<Pkey>& recipients) {
  std::string cek = RandomBytes(32), iv = RandomBytes(kGcmIvBytes), tag;
  std::string protected_header = Base64Url(json{{"enc", kContentEncryption}}.dump());
  json list = json::array();
  for (const Pkey& r : recipients) {
    GPUSNAP_ASSIGN_OR_RETURN(std::string wrapped, RsaOaep(true, r.get(), EVP_sha1(), cek));
    list.push_back({{"header", {{"alg", "RSA-OAEP"}}}, {"encrypted_key", Base64Url(wrapped)}});
  }
  GPUSNAP_ASSIGN_OR_RETURN(std::string ciphertext,
                           Gcm(true, EVP_aes_256_gcm(), cek, iv, protected_header, payload, &tag));
  return json{{"protected", protected_header},
              {"recipients", std::move(list)},
              {"iv", Base64Url(iv)},
              {"ciphertext", Base64Url(ciphertext)},
              {"tag", Base64Url(tag)}}
      .dump();
}

Result<std::string> JweDecrypt(std::string_view text, const std::vector<Pkey>& keys) {
  auto bad = [](std::string_view why) { return Status::Error(Code::kInvalidArgument, "its key is no JWE: {}", why); };
  json jwe = json::parse(text, nullptr, false);
  if (!jwe.is_object()) return bad("not a JSON object");
  std::string protected_b64 = Str(jwe, "protected");
  json header = json::parse(FromBase64Url(protected_b64).value_or(""), nullptr, false);
  if (!header.is_object()) return bad("no protected header");
  auto iv = FromBase64Url(Str(jwe, "iv"));
  auto ciphertext = FromBase64Url(Str(jwe, "ciphertext"));
  auto tag = FromBase64Url(Str(jwe, "tag"));
  if (!iv || !ciphertext || !tag) return bad("no iv, ciphertext or tag");
  std::string aad = protected_b64;
  if (jwe.contains("aad")) aad += "." + Str(jwe, "aad");
  json recipients = jwe.contains("recipients") && jwe["recipients"].is_array()
                        ? jwe["recipients"]
                        : json::array({{{"header", jwe.value("header", json::object())},
                                        {"encrypted_key", Str(jwe, "encrypted_key")}}});
  for (const json& r : recipients) {
    // The header of a recipient: the protected one, the shared one, its own.
    json h = header;
    if (jwe.contains("unprotected") && jwe["unprotected"].is_object()) h.update(jwe["unprotected"]);
    if (r.is_object() && r.contains("header") && r["header"].is_object()) h.update(r["header"]);
    std::string alg = Str(h, "alg");
    const EVP_MD* md = alg == "RSA-OAEP" ? EVP_sha1() : alg == "RSA-OAEP-256" ? EVP_sha256() : nullptr;
    const EVP_CIPHER* cipher = GcmOf(Str(h, "enc"));
    auto wrapped = FromBase64Url(Str(r, "encrypted_key"));
    if (!md || !cipher || !wrapped) continue;
    for (const Pkey& k : keys) {
      auto cek = RsaOaep(false, k.get(), md, *wrapped);
      if (!cek.ok()) continue;
      std::string t = *tag;
      auto plain = Gcm(false, cipher, *cek, *iv, aad, *ciphertext, &t);
      if (plain.ok()) return plain;
    }
  }
  return Status::Error(Code::kFailedPrecondition, "none of the keys opens its JWE");
}

Result<BlobEncryption> SealAnnotations(const LayerSecrets& secrets, std::string_view hmac,
                                       const std::vector<Pkey>& recipients) {
  GPUSNAP_ASSIGN_OR_RETURN(std::string jwe, JweEncrypt(PrivateOptionsJson(secrets), recipients));
  return BlobEncryption{Base64Encode(jwe), Base64Encode(PublicOptionsJson(hmac))};
}

Result<OpenedBlob> OpenAnnotations(const BlobEncryption& enc, const DecryptionKeys* keys, std::string_view ref) {
  if (!keys || keys->keys.empty())
    return Status::Error(Code::kFailedPrecondition,
                         "`{}` is encrypted: give --decryption-key, the private key of one of its recipients", ref);
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
                       "`{}` is encrypted for other recipients: none of the {} --decryption-key given opens it", ref,
                       keys->keys.size());
}

BlobDecryption::BlobDecryption(OpenedBlob opened) : opened_(std::move(opened)), mac_(opened_.secrets.key) {}

void BlobDecryption::Decrypt(uint64_t offset, const char* cipher, size_t n, std::string& plain) {
  mac_.Update(cipher, n);
  size_t at = plain.size();
  plain.append(cipher, n);
  ApplyKeystream(opened_.secrets.key, offset, plain.data() + at, n);
  plain_.Update(plain.data() + at, n);
}

void BlobDecryption::Replay(uint64_t offset, char* data, size_t n) {
  plain_.Update(data, n);
  ApplyKeystream(opened_.secrets.key, offset, data, n);
  mac_.Update(data, n);
}

void BlobDecryption::Reset() {
  mac_ = LayerMac(opened_.secrets.key);
  plain_ = Sha256();
}

namespace {

// Both checks of a decrypted blob: the HMAC of its ciphertext, the digest of its plaintext.
Status CheckDecrypted(const OpenedBlob& opened, std::string_view mac, std::string_view plain_digest,
                      std::string_view ref, std::string_view what) {
  if (mac != opened.hmac)
    return Status::Error(Code::kCorruption, "`{}`: {} does not match its HMAC (altered, or not what was encrypted); "
                         "not stored", ref, what);
  if (plain_digest != opened.secrets.plain_digest)
    return Status::Error(Code::kCorruption, "`{}`: {} decrypts to bytes of {}, not {}; not stored", ref, what,
                         plain_digest, opened.secrets.plain_digest);
  return Status::Ok();
}

}  // namespace

Status BlobDecryption::Verify(std::string_view ref, std::string_view what) {
  return CheckDecrypted(opened_, mac_.Final(), "sha256:" + plain_.HexFinal(), ref, what);
}

Result<std::string> DecryptBlob(const OpenedBlob& opened, std::string bytes, std::string_view ref,
                                std::string_view what) {
  LayerMac mac(opened.secrets.key);
  mac.Update(bytes.data(), bytes.size());
  ApplyKeystream(opened.secrets.key, 0, bytes.data(), bytes.size());
  GPUSNAP_RETURN_IF_ERROR(CheckDecrypted(opened, mac.Final(), "sha256:" + Sha256Hex(bytes), ref, what));
  return bytes;
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
    GPUSNAP_ASSIGN_OR_RETURN(auto key, registry::ParsePublicKeyPem(pem, fmt::format("--encryption-key `{}`", path)));
    keys->recipients.push_back(std::move(key));
  }
  if (keys->recipients.empty())
    return Status::Error(Code::kInvalidArgument, "--encryption-secret-file needs --encryption-key: whom to encrypt for");
  std::string secret;
  if (secret_file.empty()) {
    secret = registry::RandomBytes(registry::kTenantSecretBytes);
  } else {
    GPUSNAP_ASSIGN_OR_RETURN(secret, ReadOwnerOnlyFile(secret_file, "--encryption-secret-file"));
    if (secret.size() < registry::kTenantSecretBytes)
      return Status::Error(Code::kInvalidArgument, "--encryption-secret-file `{}` holds {} bytes; at least {} are needed",
                           secret_file, secret.size(), registry::kTenantSecretBytes);
    // Any length of secret, made into the HKDF's 32 bytes.
    Sha256 h;
    h.Update(secret);
    auto digest = h.Final();
    secret = std::string(reinterpret_cast<const char*>(digest.data()), digest.size());
  }
  std::memcpy(keys->secret.data(), secret.data(), keys->secret.size());
  OPENSSL_cleanse(secret.data(), secret.size());
  return std::shared_ptr<const EncryptionKeys>(std::move(keys));
}

Result<std::shared_ptr<const DecryptionKeys>> ReadDecryptionKeys(const std::vector<std::string>& files) {
  auto keys = std::make_shared<DecryptionKeys>();
  for (const std::string& path : files) {
    GPUSNAP_ASSIGN_OR_RETURN(std::string pem, ReadOwnerOnlyFile(path, "--decryption-key"));
    auto key = registry::ParsePrivateKeyPem(pem, fmt::format("--decryption-key `{}`", path));
    OPENSSL_cleanse(pem.data(), pem.size());
    if (!key.ok()) return key.status();
    keys->keys.push_back(std::move(key).value());
    keys->files.push_back(path);
  }
  return std::shared_ptr<const DecryptionKeys>(std::move(keys));
}

}  // namespace gpusnap
