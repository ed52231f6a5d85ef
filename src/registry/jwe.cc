#include "registry/jwe.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>

#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

// libjose's headers declare C functions without extern "C".
extern "C" {
#include <jose/b64.h>
#include <jose/jwe.h>
#include <jose/jwk.h>
#include <jose/openssl.h>
}

#include "util/c_ptr.h"

namespace gpusnap::registry {

namespace {

using nlohmann::json;

using PkeyCtx = CPtr<EVP_PKEY_CTX, EVP_PKEY_CTX_free>;
using Bio = CPtr<BIO, BIO_free_all>;
using Jansson = CPtr<json_t, json_decref>;
using JoseCfg = CPtr<jose_cfg_t, jose_cfg_decref>;

constexpr const char* kContentEncryption = "A256GCM";
constexpr const char* kRsaWrap = "RSA-OAEP";
constexpr const char* kEcWrap = "ECDH-ES+A256KW";
// What ocicrypt reads (RFC 7518's key wrapping for these key types, and its
// content encryptions): nothing else is handed to libjose.
const std::set<std::string> kEcWraps = {"ECDH-ES+A128KW", "ECDH-ES+A192KW", "ECDH-ES+A256KW"};
const std::set<std::string> kContentEncryptions = {"A128GCM",       "A192GCM",       "A256GCM",
                                                   "A128CBC-HS256", "A192CBC-HS384", "A256CBC-HS512"};

// A libjose configuration whose errors go nowhere: a refusal is ours to word.
JoseCfg QuietJose() {
  JoseCfg cfg(jose_cfg());
  if (!cfg) std::abort();  // out of memory
  jose_cfg_set_err_func(cfg.get(), [](void*, const char*, int, uint64_t, const char*, va_list) {}, nullptr);
  return cfg;
}

Jansson ToJansson(const json& j) { return Jansson(json_loads(j.dump().c_str(), 0, nullptr)); }

json FromJansson(const json_t* j) {
  char* text = json_dumps(j, JSON_COMPACT);
  json out = json::parse(text ? text : "null", nullptr, false);
  std::free(text);
  return out;
}

std::string Str(const json& o, const char* key) {
  auto it = o.is_object() ? o.find(key) : o.end();
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// The key of a JWK's "k" (a content key), and back.
std::optional<std::string> OctetsOf(const json_t* jwk) {
  const json_t* k = json_object_get(jwk, "k");
  size_t n = k ? jose_b64_dec(k, nullptr, 0) : SIZE_MAX;
  if (n == SIZE_MAX) return std::nullopt;
  std::string out(n, '\0');
  if (jose_b64_dec(k, out.data(), n) != n) return std::nullopt;
  return out;
}

Jansson OctetJwk(const std::string& bytes) {
  Jansson k(jose_b64_enc(bytes.data(), bytes.size()));
  return Jansson(k ? json_pack("{s:s,s:O}", "kty", "oct", "k", k.get()) : nullptr);
}

std::string B64(std::string_view bytes) {
  Jansson j(jose_b64_enc(bytes.data(), bytes.size()));
  return j ? json_string_value(j.get()) : "";
}

std::optional<std::string> FromB64(const std::string& text) {
  Jansson j(json_string(text.c_str()));
  size_t n = j ? jose_b64_dec(j.get(), nullptr, 0) : SIZE_MAX;
  if (n == SIZE_MAX) return std::nullopt;
  std::string out(n, '\0');
  if (jose_b64_dec(j.get(), out.data(), n) != n) return std::nullopt;
  return out;
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

// The JWK of a key (its private part too, when it has one).
Jansson JwkOf(const Pkey& key, bool public_only) {
  JoseCfg cfg = QuietJose();
  Jansson jwk(jose_openssl_jwk_from_EVP_PKEY(cfg.get(), key.get()));
  if (jwk && public_only && !jose_jwk_pub(cfg.get(), jwk.get())) return nullptr;
  return jwk;
}

// One recipient of a JWE: the content key wrapped for `key`.
Result<json> Wrap(const Pkey& key, const json_t* cek) {
  auto fail = [] { return Status::Error(Code::kFailedPrecondition, "wrapping a blob's key failed"); };
  if (!key.is_ec()) {
    auto octets = OctetsOf(cek);
    if (!octets) return fail();
    auto wrapped = RsaOaep(true, key.get(), EVP_sha1(), *octets);
    OPENSSL_cleanse(octets->data(), octets->size());
    if (!wrapped.ok()) return wrapped.status();
    return json{{"header", {{"alg", kRsaWrap}}}, {"encrypted_key", B64(*wrapped)}};
  }
  // libjose writes the recipient (the ephemeral key, the wrapped key) into a
  // JWE of its own; it is taken from there.
  JoseCfg cfg = QuietJose();
  Jansson one(json_pack("{s:{s:s}}", "protected", "enc", kContentEncryption));
  Jansson rcp(json_pack("{s:{s:s}}", "header", "alg", kEcWrap));
  Jansson jwk = JwkOf(key, true);
  if (!one || !rcp || !jwk || !jose_jwe_enc_jwk(cfg.get(), one.get(), rcp.get(), jwk.get(), const_cast<json_t*>(cek)))
    return fail();
  json made = FromJansson(one.get());
  if (!made.contains("header") || Str(made, "encrypted_key").empty()) return fail();
  return json{{"header", made["header"]}, {"encrypted_key", made["encrypted_key"]}};
}

// The content key that `key` unwraps from recipient `r` (of a JWE whose
// protected header is `protected_b64` and shared header `unprotected`), or
// none: another key type, another algorithm, another recipient.
Jansson Unwrap(const Pkey& key, const std::string& alg, const json& r, const std::string& protected_b64,
               const json& unprotected) {
  if (!key.is_ec()) {
    const EVP_MD* md = alg == "RSA-OAEP" ? EVP_sha1() : alg == "RSA-OAEP-256" ? EVP_sha256() : nullptr;
    auto wrapped = FromB64(Str(r, "encrypted_key"));
    if (!md || !wrapped) return nullptr;
    auto cek = RsaOaep(false, key.get(), md, *wrapped);
    if (!cek.ok()) return nullptr;
    Jansson jwk = OctetJwk(*cek);
    OPENSSL_cleanse(cek->data(), cek->size());
    return jwk;
  }
  if (!kEcWraps.count(alg)) return nullptr;
  json one = {{"protected", protected_b64}, {"encrypted_key", Str(r, "encrypted_key")}};
  if (r.contains("header")) one["header"] = r["header"];
  if (unprotected.is_object()) one["unprotected"] = unprotected;
  Jansson jwe = ToJansson(one);
  Jansson jwk = JwkOf(key, false);
  JoseCfg cfg = QuietJose();
  return Jansson(jwe && jwk ? jose_jwe_dec_jwk(cfg.get(), jwe.get(), nullptr, jwk.get()) : nullptr);
}

bool SupportedKey(EVP_PKEY* key, std::string* type) {
  if (EVP_PKEY_is_a(key, "RSA") == 1) return true;
  if (EVP_PKEY_is_a(key, "EC") != 1) {
    *type = EVP_PKEY_get0_type_name(key) ? EVP_PKEY_get0_type_name(key) : "unknown";
    return false;
  }
  char group[64] = {};
  size_t n = 0;
  if (EVP_PKEY_get_group_name(key, group, sizeof group, &n) != 1) n = 0;
  std::string curve(group, n);
  if (curve == "prime256v1" || curve == "secp384r1" || curve == "secp521r1") return true;
  *type = "EC " + (curve.empty() ? std::string("on an unknown curve") : curve);
  return false;
}

// Each PEM block of `pem`, by its name, handed to `take` (false: stop);
// kInvalidArgument naming `what` when there is none.
template <typename Take>
Status EachPemBlock(std::string_view pem, std::string_view what, Take take) {
  Bio bio(BIO_new_mem_buf(pem.data(), int(pem.size())));
  if (!bio) std::abort();  // out of memory
  int blocks = 0;
  ERR_clear_error();
  for (;;) {
    char *name = nullptr, *header = nullptr;
    unsigned char* data = nullptr;
    long len = 0;
    if (PEM_read_bio(bio.get(), &name, &header, &data, &len) != 1) {
      // The end of the text, or a block cut or garbled.
      unsigned long e = ERR_peek_last_error();
      ERR_clear_error();
      if (ERR_GET_LIB(e) == ERR_LIB_PEM && ERR_GET_REASON(e) == PEM_R_NO_START_LINE) break;
      return Status::Error(Code::kInvalidArgument, "{} holds a PEM block that does not parse", what);
    }
    ++blocks;
    Status st = take(std::string_view(name), std::string_view(header), data, len);
    OPENSSL_cleanse(data, size_t(len));
    OPENSSL_free(name);
    OPENSSL_free(header);
    OPENSSL_free(data);
    if (!st.ok()) return st;
  }
  if (blocks == 0) return Status::Error(Code::kInvalidArgument, "{} holds no PEM key", what);
  return Status::Ok();
}

// A key of block `name` (none: it did not parse) into `keys`, if gpusnap speaks its type.
Status Keep(EVP_PKEY* key, std::string_view name, std::string_view what, std::vector<Pkey>& keys) {
  if (!key) return Status::Error(Code::kInvalidArgument, "{} holds a PEM `{}` that does not parse", what, name);
  Pkey k(key);
  std::string type;
  if (!SupportedKey(key, &type))
    return Status::Error(Code::kInvalidArgument,
                         "{} is a key of type {}: gpusnap wraps keys for RSA and for EC on P-256, P-384 or P-521", what,
                         type);
  keys.push_back(std::move(k));
  return Status::Ok();
}

}  // namespace

Pkey::Pkey(evp_pkey_st* key) : key_(key, EVP_PKEY_free) {}

bool Pkey::is_ec() const { return EVP_PKEY_is_a(key_.get(), "EC") == 1; }

Result<std::vector<Pkey>> ParsePublicKeysPem(std::string_view pem, std::string_view what) {
  std::vector<Pkey> keys;
  GPUSNAP_RETURN_IF_ERROR(EachPemBlock(pem, what, [&](std::string_view name, std::string_view, unsigned char* data,
                                                      long len) -> Status {
    const unsigned char* p = data;
    EVP_PKEY* key = nullptr;
    if (name == PEM_STRING_PUBLIC) {
      key = d2i_PUBKEY(nullptr, &p, len);
    } else if (name == PEM_STRING_X509) {
      if (X509* cert = d2i_X509(nullptr, &p, len)) {
        key = X509_get_pubkey(cert);
        X509_free(cert);
      }
    } else {
      return Status::Error(Code::kInvalidArgument, "{} holds a PEM `{}`, not a public key or certificate", what,
                           name.substr(0, 40));
    }
    return Keep(key, name, what, keys);
  }));
  return keys;
}

Result<std::vector<Pkey>> ParsePrivateKeysPem(std::string_view pem, std::string_view what) {
  std::vector<Pkey> keys;
  GPUSNAP_RETURN_IF_ERROR(EachPemBlock(pem, what, [&](std::string_view name, std::string_view header,
                                                      unsigned char* data, long len) -> Status {
    if (name == PEM_STRING_ECPARAMETERS) return Status::Ok();
    bool private_block = name == PEM_STRING_PKCS8INF || name == PEM_STRING_RSA || name == PEM_STRING_ECPRIVATEKEY;
    if (name == PEM_STRING_PKCS8 || (private_block && !header.empty()))
      return Status::Error(Code::kInvalidArgument, "{} holds a passphrase-protected key: give it without one", what);
    if (!private_block)
      return Status::Error(Code::kInvalidArgument, "{} holds a PEM `{}`, not a private key", what, name.substr(0, 40));
    const unsigned char* p = data;
    return Keep(d2i_AutoPrivateKey(nullptr, &p, len), name, what, keys);
  }));
  if (keys.empty()) return Status::Error(Code::kInvalidArgument, "{} holds no PEM private key", what);
  return keys;
}

Result<std::string> JweEncrypt(std::string_view payload, const std::vector<Pkey>& recipients) {
  auto fail = [] { return Status::Error(Code::kFailedPrecondition, "encrypting a blob's key failed"); };
  JoseCfg cfg = QuietJose();
  Jansson cek(json_pack("{s:s}", "alg", kContentEncryption));
  if (!cek || !jose_jwk_gen(cfg.get(), cek.get())) return fail();
  json list = json::array();
  for (const Pkey& r : recipients) {
    GPUSNAP_ASSIGN_OR_RETURN(json wrapped, Wrap(r, cek.get()));
    list.push_back(std::move(wrapped));
  }
  Jansson content(json_pack("{s:{s:s}}", "protected", "enc", kContentEncryption));
  if (!content || !jose_jwe_enc_cek(cfg.get(), content.get(), cek.get(), payload.data(), payload.size()))
    return fail();
  json out = FromJansson(content.get());
  out["recipients"] = std::move(list);
  return out.dump();
}

Result<std::string> JweDecrypt(std::string_view text, const std::vector<Pkey>& keys) {
  auto bad = [](std::string_view why) { return Status::Error(Code::kInvalidArgument, "its key is no JWE: {}", why); };
  json jwe = json::parse(text, nullptr, false);
  if (!jwe.is_object()) return bad("not a JSON object");
  std::string protected_b64 = Str(jwe, "protected");
  json header = json::parse(FromB64(protected_b64).value_or(""), nullptr, false);
  if (!header.is_object()) return bad("no protected header");
  json unprotected = jwe.contains("unprotected") && jwe["unprotected"].is_object() ? jwe["unprotected"] : json();
  json shared = header;
  if (unprotected.is_object()) shared.update(unprotected);
  if (shared.contains("zip")) return bad("it is compressed (`zip`), which ocicrypt never writes");
  if (!kContentEncryptions.count(Str(shared, "enc")))
    return bad(fmt::format("its content encryption `{}` is none of RFC 7518's", Str(shared, "enc").substr(0, 40)));
  if (Str(jwe, "iv").empty() || Str(jwe, "ciphertext").empty() || Str(jwe, "tag").empty())
    return bad("no iv, ciphertext or tag");
  json recipients = jwe.contains("recipients") && jwe["recipients"].is_array()
                        ? jwe["recipients"]
                        : json::array({{{"header", jwe.value("header", json::object())},
                                        {"encrypted_key", Str(jwe, "encrypted_key")}}});
  Jansson whole = ToJansson(jwe);
  if (!whole) return bad("not a JSON object");
  JoseCfg cfg = QuietJose();
  for (const json& r : recipients) {
    // The header of a recipient: the protected one, the shared one, its own.
    json h = shared;
    if (r.is_object() && r.contains("header") && r["header"].is_object()) h.update(r["header"]);
    if (!r.is_object() || h.contains("zip")) continue;
    std::string alg = Str(h, "alg");
    for (const Pkey& k : keys) {
      Jansson cek = Unwrap(k, alg, r, protected_b64, unprotected);
      if (!cek) continue;
      size_t n = 0;
      void* plain = jose_jwe_dec_cek(cfg.get(), whole.get(), cek.get(), &n);
      if (!plain) continue;
      std::string out(static_cast<const char*>(plain), n);
      OPENSSL_cleanse(plain, n);
      std::free(plain);
      return out;
    }
  }
  return Status::Error(Code::kFailedPrecondition, "none of the keys opens its JWE");
}

}  // namespace gpusnap::registry
