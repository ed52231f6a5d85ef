#include "registry/sigstore.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>
#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <nlohmann/json.hpp>

#include "registry/auth.h"
#include "store/sha256.h"
#include "util/fd.h"
#include "util/files.h"

namespace gpusnap::registry {

namespace {

using nlohmann::json;

constexpr const char* kPayloadType = "cosign container image signature";
constexpr const char* kCreator = "gpusnap";

struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using Bio = std::unique_ptr<BIO, BioFree>;

Bio MemoryBio(std::string_view bytes) { return Bio(BIO_new_mem_buf(bytes.data(), int(bytes.size()))); }

// A PEM block's type and decoded body, or nullopt when `pem` holds none.
struct PemBlock {
  std::string type;
  std::string body;
};
std::optional<PemBlock> FirstPemBlock(std::string_view pem) {
  Bio bio = MemoryBio(pem);
  char* name = nullptr;
  char* header = nullptr;
  unsigned char* data = nullptr;
  long len = 0;
  if (PEM_read_bio(bio.get(), &name, &header, &data, &len) != 1) return std::nullopt;
  PemBlock out{name, std::string(reinterpret_cast<char*>(data), size_t(len))};
  OPENSSL_free(name);
  OPENSSL_free(header);
  OPENSSL_clear_free(data, size_t(len));
  return out;
}

bool IsP256(EVP_PKEY* key) {
  if (!EVP_PKEY_is_a(key, "EC")) return false;
  char group[64] = {};
  size_t len = 0;
  if (EVP_PKEY_get_utf8_string_param(key, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof(group), &len) != 1) return false;
  return std::string_view(group, len) == "prime256v1";
}

std::optional<std::string> Base64Field(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return std::nullopt;
  return Base64Decode(j[key].get<std::string>());
}

// cosign's encrypted key: {"kdf":{"name":"scrypt","params":{"N","r","p"},"salt"},
// "cipher":{"name":"nacl/secretbox","nonce"},"ciphertext"}, the byte strings
// base64; the key of the secretbox is scrypt's 32 bytes.
Result<std::string> OpenCosignKey(std::string_view body, std::string_view passphrase) {
  auto bad = [](const char* why) {
    return Status::Error(Code::kInvalidArgument, "the encrypted sigstore private key is not in cosign's format ({})", why);
  };
  json j = json::parse(body, nullptr, false);
  if (!j.is_object() || !j.contains("kdf") || !j.contains("cipher")) return bad("no kdf or cipher");
  const json& kdf = j["kdf"];
  const json& cipher = j["cipher"];
  if (!kdf.is_object() || kdf.value("name", "") != "scrypt") return bad("its kdf is not scrypt");
  if (!cipher.is_object() || cipher.value("name", "") != "nacl/secretbox") return bad("its cipher is not nacl/secretbox");
  const json& params = kdf.contains("params") ? kdf["params"] : json();
  if (!params.is_object() || !params.contains("N") || !params.contains("r") || !params.contains("p") ||
      !params["N"].is_number_unsigned() || !params["r"].is_number_unsigned() || !params["p"].is_number_unsigned())
    return bad("scrypt's parameters");
  uint64_t n = params["N"], r = params["r"], p = params["p"];
  if (n < 2 || n > (1u << 20) || r == 0 || r > 32 || p == 0 || p > 16) return bad("scrypt's parameters are out of range");
  auto salt = Base64Field(kdf, "salt");
  auto nonce = Base64Field(cipher, "nonce");
  auto sealed = Base64Field(j, "ciphertext");
  if (!salt || !nonce || !sealed) return bad("salt, nonce or ciphertext");
  if (nonce->size() != crypto_secretbox_NONCEBYTES || sealed->size() < crypto_secretbox_MACBYTES)
    return bad("the nonce or the ciphertext is too short");
  unsigned char key[crypto_secretbox_KEYBYTES];
  if (EVP_PBE_scrypt(passphrase.data(), passphrase.size(), reinterpret_cast<const unsigned char*>(salt->data()),
                     salt->size(), n, r, p, 256ull * n * r * p + (1 << 20), key, sizeof(key)) != 1)
    return bad("scrypt failed");
  std::string plain(sealed->size() - crypto_secretbox_MACBYTES, '\0');
  int opened = crypto_secretbox_open_easy(reinterpret_cast<unsigned char*>(plain.data()),
                                          reinterpret_cast<const unsigned char*>(sealed->data()), sealed->size(),
                                          reinterpret_cast<const unsigned char*>(nonce->data()), key);
  sodium_memzero(key, sizeof(key));
  if (opened != 0)
    return Status::Error(Code::kFailedPrecondition,
                         "the encrypted sigstore private key does not open with the passphrase given");
  return plain;
}

}  // namespace

std::string SignaturePayload(const SignedClaim& claim, int64_t timestamp) {
  json j = {{"critical",
             {{"identity", {{"docker-reference", claim.docker_reference}}},
              {"image", {{"docker-manifest-digest", claim.manifest_digest}}},
              {"type", kPayloadType}}},
            {"optional", {{"creator", kCreator}, {"timestamp", timestamp}}}};
  return j.dump();
}

Result<SignedClaim> ParseSignaturePayload(std::string_view payload) {
  auto bad = [](const char* why) {
    return Status::Error(Code::kInvalidArgument, "a signature's payload is not a simple-signing payload ({})", why);
  };
  json j = json::parse(payload, nullptr, false);
  if (!j.is_object() || !j.contains("critical") || !j["critical"].is_object()) return bad("no `critical` object");
  const json& c = j["critical"];
  if (!c.contains("type") || c["type"] != kPayloadType) return bad("its type is not a cosign container image signature");
  if (!c.contains("identity") || !c["identity"].is_object() || !c["identity"].contains("docker-reference") ||
      !c["identity"]["docker-reference"].is_string())
    return bad("no identity.docker-reference");
  if (!c.contains("image") || !c["image"].is_object() || !c["image"].contains("docker-manifest-digest") ||
      !c["image"]["docker-manifest-digest"].is_string())
    return bad("no image.docker-manifest-digest");
  return SignedClaim{c["identity"]["docker-reference"], c["image"]["docker-manifest-digest"]};
}

std::string SignatureAttachmentTag(std::string_view manifest_digest) {
  std::string tag(manifest_digest);
  if (auto colon = tag.find(':'); colon != std::string::npos) tag[colon] = '-';
  return tag + ".sig";
}

std::string SignatureAttachmentConfig(const std::vector<SignatureLayer>& layers) {
  json diff_ids = json::array();
  for (const SignatureLayer& l : layers) diff_ids.push_back(l.payload.digest);
  json j = {{"architecture", ""}, {"os", ""}, {"config", json::object()},
            {"rootfs", {{"type", "layers"}, {"diff_ids", std::move(diff_ids)}}}};
  return j.dump();
}

std::string SignatureAttachmentManifest(const SignatureAttachment& a) {
  json layers = json::array();
  for (const SignatureLayer& l : a.layers) {
    json d = {{"mediaType", l.media_type}, {"digest", l.payload.digest}, {"size", l.payload.size}};
    if (!l.signature_base64.empty()) d["annotations"] = {{kSignatureAnnotation, l.signature_base64}};
    layers.push_back(std::move(d));
  }
  json m = {{"schemaVersion", 2},
            {"mediaType", kManifestMediaType},
            {"config", {{"mediaType", kOciImageConfigMediaType}, {"digest", a.config.digest}, {"size", a.config.size}}},
            {"layers", std::move(layers)}};
  return m.dump();
}

Result<SignatureAttachment> ParseSignatureAttachment(std::string_view bytes) {
  auto bad = [](const char* why) {
    return Status::Error(Code::kInvalidArgument, "the signature attachment is not an OCI image manifest ({})", why);
  };
  json j = json::parse(bytes, nullptr, false);
  if (!j.is_object() || !j.contains("layers") || !j["layers"].is_array()) return bad("no layers");
  auto descriptor = [](const json& d, Blob& blob, std::string& media_type) {
    if (!d.is_object() || !d.contains("digest") || !d["digest"].is_string() || !d.contains("size") ||
        !d["size"].is_number_unsigned())
      return false;
    blob = {d["digest"], d["size"], {}};
    media_type = d.value("mediaType", "");
    return blob.digest.starts_with("sha256:") && blob.digest.size() == 71;
  };
  SignatureAttachment a;
  std::string config_type;
  if (!j.contains("config") || !descriptor(j["config"], a.config, config_type)) return bad("its config");
  for (const json& d : j["layers"]) {
    SignatureLayer l;
    if (!descriptor(d, l.payload, l.media_type)) return bad("a layer's descriptor");
    if (d.contains("annotations") && d["annotations"].is_object() && d["annotations"].contains(kSignatureAnnotation) &&
        d["annotations"][kSignatureAnnotation].is_string())
      l.signature_base64 = d["annotations"][kSignatureAnnotation];
    a.layers.push_back(std::move(l));
  }
  return a;
}

struct SigningKey::Key {
  Pkey pkey;
};
SigningKey::SigningKey(std::unique_ptr<Key> key) : key_(std::move(key)) {}
SigningKey::SigningKey(SigningKey&&) noexcept = default;
SigningKey& SigningKey::operator=(SigningKey&&) noexcept = default;
SigningKey::~SigningKey() = default;

Result<SigningKey> SigningKey::Parse(std::string_view pem, std::string_view passphrase) {
  if (sodium_init() < 0) return Status::Error(Code::kInternal, "libsodium did not initialize");
  auto block = FirstPemBlock(pem);
  if (!block)
    return Status::Error(Code::kInvalidArgument, "the sigstore private key is not a PEM file");
  Pkey pkey;
  if (block->type == "ENCRYPTED SIGSTORE PRIVATE KEY" || block->type == "ENCRYPTED COSIGN PRIVATE KEY") {
    if (passphrase.empty())
      return Status::Error(Code::kInvalidArgument,
                           "the sigstore private key is encrypted: give its passphrase with --sign-passphrase-file");
    GPUSNAP_ASSIGN_OR_RETURN(std::string der, OpenCosignKey(block->body, passphrase));
    const unsigned char* p = reinterpret_cast<const unsigned char*>(der.data());
    pkey.reset(d2i_AutoPrivateKey(nullptr, &p, long(der.size())));
    OPENSSL_cleanse(der.data(), der.size());
  } else if (block->type == "PRIVATE KEY" || block->type == "EC PRIVATE KEY") {
    Bio bio = MemoryBio(pem);
    pkey.reset(PEM_read_bio_PrivateKey(bio.get(), nullptr, [](char*, int, int, void*) { return 0; }, nullptr));
  } else {
    return Status::Error(Code::kInvalidArgument,
                         "the sigstore private key is a PEM `{}`, not a private key (cosign's encrypted format or "
                         "PKCS#8 `PRIVATE KEY`)", block->type);
  }
  OPENSSL_cleanse(block->body.data(), block->body.size());
  if (!pkey) return Status::Error(Code::kInvalidArgument, "the sigstore private key does not parse as a private key");
  if (!IsP256(pkey.get()))
    return Status::Error(Code::kNotSupported, "the sigstore private key is not an ECDSA P-256 key");
  return SigningKey(std::make_unique<Key>(Key{std::move(pkey)}));
}

Result<std::string> SigningKey::Sign(std::string_view payload) const {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  size_t len = 0;
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key_->pkey.get()) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &len, reinterpret_cast<const unsigned char*>(payload.data()),
                     payload.size()) != 1)
    return Status::Error(Code::kInternal, "signing the payload failed");
  std::string sig(len, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(sig.data()), &len,
                     reinterpret_cast<const unsigned char*>(payload.data()), payload.size()) != 1)
    return Status::Error(Code::kInternal, "signing the payload failed");
  sig.resize(len);
  return Base64Encode(sig);
}

std::string SigningKey::PublicKeyPem() const {
  Bio bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_PUBKEY(bio.get(), key_->pkey.get());
  char* data = nullptr;
  long len = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, size_t(len));
}

struct VerifyingKey::Key {
  Pkey pkey;
};
VerifyingKey::VerifyingKey(std::unique_ptr<Key> key) : key_(std::move(key)) {}
VerifyingKey::VerifyingKey(VerifyingKey&&) noexcept = default;
VerifyingKey& VerifyingKey::operator=(VerifyingKey&&) noexcept = default;
VerifyingKey::~VerifyingKey() = default;

Result<VerifyingKey> VerifyingKey::Parse(std::string_view pem) {
  Bio bio = MemoryBio(pem);
  Pkey pkey(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
  if (!pkey) return Status::Error(Code::kInvalidArgument, "not a `PUBLIC KEY` PEM");
  if (!IsP256(pkey.get())) return Status::Error(Code::kNotSupported, "the public key is not an ECDSA P-256 key");
  return VerifyingKey(std::make_unique<Key>(Key{std::move(pkey)}));
}

bool VerifyingKey::Verifies(std::string_view payload, std::string_view signature_base64) const {
  auto sig = Base64Decode(signature_base64);
  if (!sig || sig->empty()) return false;
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  return ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, EVP_sha256(), nullptr, key_->pkey.get()) == 1 &&
         EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(sig->data()), sig->size(),
                          reinterpret_cast<const unsigned char*>(payload.data()), payload.size()) == 1;
}

// A key or passphrase file is small: anything larger is not one.
constexpr uint64_t kMaxKeyFileBytes = 1 << 20;

Result<SigningKey> LoadSigningKey(const std::string& key_path, const std::string& passphrase_path) {
  GPUSNAP_ASSIGN_OR_RETURN(std::string pem,
                           ReadOwnerOnlyFile(key_path, "--sign-by-sigstore-private-key", kMaxKeyFileBytes));
  std::string passphrase;
  if (!passphrase_path.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(passphrase,
                             ReadOwnerOnlyFile(passphrase_path, "--sign-passphrase-file", kMaxKeyFileBytes));
    if (auto nl = passphrase.find('\n'); nl != std::string::npos) passphrase.resize(nl);
  }
  auto key = SigningKey::Parse(pem, passphrase);
  OPENSSL_cleanse(pem.data(), pem.size());
  OPENSSL_cleanse(passphrase.data(), passphrase.size());
  if (!key.ok()) return key.status().Wrap(fmt::format("--sign-by-sigstore-private-key `{}`", key_path));
  return key;
}

}  // namespace gpusnap::registry
