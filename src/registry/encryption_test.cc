#include "registry/encryption.h"

#include <gtest/gtest.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "registry/auth.h"

namespace gpusnap::registry {
namespace {

std::string FromHex(std::string_view hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) out.push_back(char(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  return out;
}

std::string Hex(std::string_view bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

LayerKey KeyOf(std::string_view key_hex, std::string_view nonce_hex) {
  LayerKey k;
  std::string key = FromHex(key_hex), nonce = FromHex(nonce_hex);
  std::copy(key.begin(), key.end(), k.key.begin());
  std::copy(nonce.begin(), nonce.end(), k.nonce.begin());
  return k;
}

// Three keys for the whole suite: an RSA key takes a while to make.
Pkey NewRsaKey() {
  static std::vector<Pkey> keys = [] {
    std::vector<Pkey> k;
    for (int i = 0; i < 3; ++i) k.emplace_back(EVP_RSA_gen(2048));
    return k;
  }();
  static size_t next = 0;
  return keys[next++ % keys.size()];
}

// EC keys, one per curve and name.
Pkey NewEcKey(const char* curve, int which = 0) {
  static std::map<std::pair<std::string, int>, Pkey> keys;
  auto it = keys.find({curve, which});
  if (it == keys.end()) it = keys.emplace(std::pair{std::string(curve), which}, Pkey(EVP_EC_gen(curve))).first;
  return it->second;
}

std::string PemOf(EVP_PKEY* key, bool private_part, const char* passphrase = nullptr) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (!private_part) {
    PEM_write_bio_PUBKEY(bio, key);
  } else if (passphrase) {
    PEM_write_bio_PKCS8PrivateKey(bio, key, EVP_aes_256_cbc(), passphrase, int(std::strlen(passphrase)), nullptr,
                                  nullptr);
  } else {
    PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  }
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string out(data, size_t(n));
  BIO_free(bio);
  return out;
}

// A private key and a JWE of ocicrypt's private options for it, made by another
// implementation (Python's `cryptography`): RSA-OAEP-256, flattened serialization.
constexpr const char* kOtherPrivateKeyPem = R"(-----BEGIN PRIVATE KEY-----
MIIEvwIBADANBgkqhkiG9w0BAQEFAASCBKkwggSlAgEAAoIBAQDIYyR885+Pz99b
YgOhN7EmOKRMLSjqAW05bujPSCdeGuHylZKxWtUFKSv6c2ORaVYkiS90z0rAVXL4
BGRr6CnGBugGWeWv7cgxkcDucpymz7lPmhcrs+sFeXzvyOD5dS2AoBlaatDFscRn
EJF/icVyd9sDiFQ6uiNZGmHLdTmJjTy3Tr49mZ8nggtjk12CdM9yjpFwMo+zQ7Ht
nonwtPb3FClRSjD11Mq+Bduc7Wid30rtNwR+5xUovZ/E5001642GL4HnDUwv822o
S8Me27rZ1W1gdBzJ79hgiJNNqRG1WWHWPDNrCwUDlqDFoGP25/CC5ia97gnVR/m5
bmwB2g7LAgMBAAECggEATmzGzgRG8XDImKoug30ZXr0SSCHwfkzao3ytrtotVh4t
SdSSGclTz3ZCmP1p/XH9XcU3Bn9OYSHQIhMN/lFZcAAp9LpgM09bZ1ME8A15E6v+
eZHz+Y2rsHPQmsPCkL70dP+zjHh7hrPBCxkn6INR/C++To6fcHCC/w9dMNSLFTK5
RBu2oiDiAI+Qcx8JZaafxxBEvAqZ2DeWHyTLIH/PfGmiw7qPZ9KIPjuZpf0PNfPO
BQBydBd77BstRZ1SFpIKAAV5xrWiuQLoB+9xWdNT4pRUKOKFIRQnLoc2685Fw2hc
6DU36sfpIYqHY4JpQ8pb/j5zzZ7BYsfyNJwzUKjOUQKBgQDi3dUdwXFN+kMh9hdr
MjptV0P9gG60A+kpcGI9f/J7NEZhhKdz8RlAV8mOck6XpEUfS2nlmkv8YzSfZ4Go
T+1ouAjJK1ykQvB1Ehw+VU17kXSj8MrL1gWNlWXmOV2HVCoWOVg96ND4bip5/EeM
kNWoN3M+TX/KKDqR9POyinb3EwKBgQDiHtAGLAQGdx5iTKmBEDNNcHU1UxdzBGL2
sOM017u04R/kOzX3F++65hzDUw5Pl7CCCeCb28Df0yDOnLW+aSFmjICNPAzdehNH
hvM2FdU22YxOYSwdoANSV5zT6ix7+vqnKXM+VtyJ/TeaUKPcLXQbeXdhAfdtFW3k
C0eiDXVoaQKBgQCGFlUS/DWKwCMTnI8k5ZAQ9iYSW+mSbklOG8WE0e2wkioTE0Oh
zFt/YyOXFMqM6COOppUVhsfoiX4dxSCmKW+JmFRhCkb8MzBKEYUt9l8QbN1C1FwY
dAveLfIHS9qS1NT3Q7d7B/MTEpH6fXiQhT4y6Wss5MNl6bcMc3niCeLcjwKBgQC8
TUyO1zjC6Y+z7IN7pzIR2wTAU2HDtnNzW/rZlo4KIy+bsHNQQe6xhc+OGSxhu8CR
iggxwt7rhbZcWMRAvOvDql2jP8624WIMvqTq9WOJOcFNxD4orYgWmj9PekNxO6Bg
dHQ0BcHCZ8xWBbFvOarm9lAjyK9zd9T7gyk0GmEbgQKBgQCxA70OcFfNfAQyZpEa
IeonlnqU5RZZWKyvSed5W4e5ycyQPu+l7jb8ttVdTjyydUZW4rKEjE4bK/jycU5R
p7BykbUFGtoUDPbD0g6kgC1RJShAIAF2a+Ge/X0z5bvrsMAn2exH0fwCUWU9lC8P
zrgNuHgTrWtuEKEIxGr/aategg==
-----END PRIVATE KEY-----

)";
constexpr const char* kOtherJwe = R"({"protected": "eyJlbmMiOiAiQTI1NkdDTSJ9", "header": {"alg": "RSA-OAEP-256"}, "encrypted_key": "OAl9lUxu8itWhOePL7v6v3OyKMEMlz_wsypluLwEHosL21cnlah_0f-P8zN2VXOB3zsuwxp2KsGH_yFvkw8Z4_436OVT1HFavqzJmgNm2MmNwijezXAoWcLmEQax9v5CofQRrGsaYh6pGsRYBMmBTC4HjZ6kOGaDWZCqITWwhpZZp6lRCrUVds7Y_bf9soAIe4ndv-V1d9-SBz6A17J4ElScmMDqD8LF2aiq50mBJN2R82fVzSJMgom5KNMlMUQYtbzLPyQtgMIINNzy3miRbHs0Q9PUgyNI8H87ZtoY90qGAGVChkUcWw21BPWMDqC6q9DsW2S9XFF5ZbRUwJJekg", "iv": "DX_8kPdmRuV8vKtF", "ciphertext": "LuQdXks_lLUBdBIWoM83s_qgUpyyNqhNquHvbCBndVh_TuG-x1dzJHq6zNJmhjoCQvq77R-ijKLQXG6y_QK__1jAlqLcD8522ks201z4McMKBtFrvM8BxiQ1f8hWp2PgHdpBgAu3vQrOrzKeuuhnh6NhCZabQ8paaQofQiexHf96qsNmUKEzZt1bfDtn71LJCn4Nq7zdraaHc8gAA393jroQLKsAPXWrxqfVdCzk2HmE78dVLP55S1qSD4QV8UBFZw", "tag": "DVmJCkJzZfL-s97o8QG4Ow"})";

// The same for an EC key (P-384), made with Python's `cryptography`
// primitives: ECDH-ES+A256KW (the Concat KDF over SHA-256, AES key wrap),
// general serialization, as ocicrypt writes for EC keys.
constexpr const char* kOtherEcPrivateKeyPem = R"(-----BEGIN PRIVATE KEY-----
MIG2AgEAMBAGByqGSM49AgEGBSuBBAAiBIGeMIGbAgEBBDBAkrHPN+R0CZKwM6zv
qynCCH4syg2nhU3qZeqDWdJNpODfD0G8U2/qoeS7+3Yhla6hZANiAATrKCk6Wcqb
pXW6UNVz+UZiE51RnjpzUf01tH7bYxJlwz5JDAK6aOsYRaZ9yLD/fCwOVb0HSmYS
ndjgCd5PF3mIX1IXJxTA3bBOfigH2oDjFdBV2+17j2NlDhf27VkKhEA=
-----END PRIVATE KEY-----
)";
constexpr const char* kOtherEcJwe = R"({"protected": "eyJlbmMiOiAiQTI1NkdDTSJ9", "recipients": [{"header": {"alg": "ECDH-ES+A256KW", "epk": {"kty": "EC", "crv": "P-384", "x": "TkaB4i17vmm0HWofuODyIkzepS4w9N5mMce2vna-qnyIhyzlOOAuGLm8j12lYVJb", "y": "UNbvgOrVGSDxfL7ZT5NEAo4sNmnK_wZ863CJAf-FD1u8QRoodjIFhHJpMEzthzjY"}}, "encrypted_key": "2MXpPGg0S4sQa91cswGDoJHh-9wyH2qlTZQxgHpHmKA9Da4VIoYGLg"}], "iv": "XXgAi3xmRtPe0azz", "ciphertext": "SXUTD876EM__1ocWqr_ZB2z-aPYatmQSwqn35qtakmftkkc6F7NF3w7jp0zZDY7Rk20s1iuYISTA5TCcJV8OmphWc-Ez_ayosNcxphzqLPuf6U4gOFTikBdXbAAQcMaURSXlFb3o7N34t-kl6OD7YHb9_BupnkIGiGSkNcedQqINHzNDMKsJPayllPEN2pUzFvZTmOUEa1eARi7swu6tUE_3dvZogoMVzq0IGo37lTdI0yFhFl23wG0JL0dqk5C8xs7TyS4Z2w", "tag": "nTJHJaMv12ywPSe9EVpr5Q"})";

TEST(Encryption, TheKeystreamIsAes256CtrOfNistSp80038a) {
  // SP 800-38A F.5.5, CTR-AES256.Encrypt.
  LayerKey k = KeyOf("603deb1015ca71be2b73aef0857d77811f352c073b6108d72d9810a30914dff4",
                     "f0f1f2f3f4f5f6f7f8f9fafbfcfdfeff");
  std::string data = FromHex("6bc1bee22e409f96e93d7e117393172aae2d8a571e03ac9c9eb76fac45af8e51");
  ApplyKeystream(k, 0, data.data(), data.size());
  EXPECT_EQ(Hex(data), "601ec313775789a5b7a7f504bbf3d228f443e3ca4d62b59aca84e990cacaf5c5");
  // From any offset, as an upload or a resumed download reads it.
  std::string second = FromHex("1e03ac9c9eb76fac45af8e51");
  ApplyKeystream(k, 20, second.data(), second.size());
  EXPECT_EQ(Hex(second), "4d62b59aca84e990cacaf5c5");
  ApplyKeystream(k, 20, second.data(), second.size());
  EXPECT_EQ(Hex(second), "1e03ac9c9eb76fac45af8e51");  // its own inverse
}

TEST(Encryption, TheCounterCarriesOverAll128Bits) {
  // Seeking (offset / 16 added to the nonce here) agrees with OpenSSL's own
  // increment across a carry through two bytes and across the wrap of all 128 bits.
  LayerKey low = KeyOf(std::string(64, '1'), "0000000000000000000000000000ffff");
  std::string whole(0x10000 * 16 + 64, 'x');
  ApplyKeystream(low, 0, whole.data(), whole.size());
  for (uint64_t offset : {uint64_t(16), uint64_t(0xffff * 16 - 16), uint64_t(0xffff * 16 + 5), uint64_t(0x10000 * 16)}) {
    std::string part(48, 'x');
    ApplyKeystream(low, offset, part.data(), part.size());
    EXPECT_EQ(part, whole.substr(offset, 48)) << offset;
  }
  LayerKey high = KeyOf(std::string(64, '1'), std::string(32, 'f'));
  std::string wrap(64, 'x'), tail(32, 'x');
  ApplyKeystream(high, 0, wrap.data(), wrap.size());
  ApplyKeystream(high, 32, tail.data(), tail.size());
  EXPECT_EQ(tail, wrap.substr(32));
}

TEST(Encryption, TheMacIsHmacSha256KeyedByTheBlobKey) {
  std::string key_hex;
  for (int i = 0; i < 32; ++i) key_hex += Hex(std::string(1, char(i)));
  LayerMac mac(KeyOf(key_hex, std::string(32, '0')));
  mac.Update("gpu", 3);
  mac.Update("snap", 4);
  EXPECT_EQ(Hex(mac.Final()), "757f3de36df7a91b1823e774c2e63419877f2cfd7c0ab50ac690b7890b12b8bc");
}

TEST(Encryption, BlobKeysDeriveFromTheSecretAndThePlaintextDigest) {
  std::array<unsigned char, kTenantSecretBytes> secret{};
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<unsigned char>(i);
  std::string digest = "sha256:";
  for (int i = 0; i < 32; ++i) digest += "ab";
  LayerKey k = DeriveLayerKey(secret, digest);
  // HKDF-SHA256 (RFC 5869), computed independently.
  EXPECT_EQ(Hex(std::string_view(reinterpret_cast<const char*>(k.key.data()), 32)),
            "b614efe38394695e3b071d295dc30bdbd563e336ca8cda63ebf7e205887e6ad8");
  EXPECT_EQ(Hex(std::string_view(reinterpret_cast<const char*>(k.nonce.data()), 16)),
            "d15b11912a48949044f779e56fb880c4");
  EXPECT_EQ(DeriveLayerKey(secret, digest), k);  // equal plaintexts, equal blobs
  std::string other = digest;
  other.back() = 'c';
  EXPECT_NE(DeriveLayerKey(secret, other).key, k.key);
  auto other_secret = secret;
  other_secret[0] ^= 1;
  EXPECT_NE(DeriveLayerKey(other_secret, digest).key, k.key);  // another tenant: other blobs
}

TEST(Encryption, OptionsAreOcicryptsJson) {
  LayerSecrets s{KeyOf("000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
                       "000102030405060708090a0b0c0d0e0f"),
                 "sha256:" + std::string(64, 'e')};
  auto j = nlohmann::json::parse(PrivateOptionsJson(s));
  EXPECT_EQ(j["symkey"], "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=");
  EXPECT_EQ(j["cipheroptions"]["nonce"], "AAECAwQFBgcICQoLDA0ODw==");
  EXPECT_EQ(j["digest"], s.plain_digest);
  EXPECT_EQ(*ParsePrivateOptions(PrivateOptionsJson(s)), s);
  EXPECT_FALSE(ParsePrivateOptions(R"({"symkey":"AAEC","digest":"sha256:x"})").ok());

  std::string hmac(32, '\x07');
  auto p = nlohmann::json::parse(PublicOptionsJson(hmac));
  EXPECT_EQ(p["cipher"], "AES_256_CTR_HMAC_SHA256");
  EXPECT_EQ(*ParsePublicOptions(PublicOptionsJson(hmac)), hmac);
  auto other = ParsePublicOptions(R"({"cipher":"AES_128_GCM","hmac":"AAAA"})");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("AES_128_GCM"), std::string::npos);
}

TEST(Encryption, AJweOpensForEachRecipientAndNoOtherKey) {
  Pkey alice = NewRsaKey(), bob = NewRsaKey(), eve = NewRsaKey();
  auto jwe = JweEncrypt("the payload", {alice, bob});
  ASSERT_TRUE(jwe.ok()) << jwe.status().ToString();
  auto parsed = nlohmann::json::parse(*jwe);
  EXPECT_EQ(parsed["recipients"].size(), 2u);
  EXPECT_EQ(parsed["recipients"][0]["header"]["alg"], "RSA-OAEP");
  EXPECT_EQ(*JweDecrypt(*jwe, {alice}), "the payload");
  EXPECT_EQ(*JweDecrypt(*jwe, {eve, bob}), "the payload");
  auto refused = JweDecrypt(*jwe, {eve});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);
  // The content is authenticated: a changed ciphertext opens for no one.
  std::string ct = parsed["ciphertext"];
  ct[0] = ct[0] == 'A' ? 'B' : 'A';
  parsed["ciphertext"] = ct;
  EXPECT_FALSE(JweDecrypt(parsed.dump(), {alice}).ok());
  EXPECT_EQ(JweDecrypt("not json", {alice}).status().code(), Code::kInvalidArgument);
}

TEST(Encryption, AJweOfAnotherImplementationOpens) {
  auto key = ParsePrivateKeysPem(kOtherPrivateKeyPem, "test key");
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  auto payload = JweDecrypt(kOtherJwe, *key);
  ASSERT_TRUE(payload.ok()) << payload.status().ToString();
  auto secrets = ParsePrivateOptions(*payload);
  ASSERT_TRUE(secrets.ok());
  EXPECT_EQ(secrets->plain_digest.substr(0, 11), "sha256:abab");
  EXPECT_EQ(Hex(std::string_view(reinterpret_cast<const char*>(secrets->key.nonce.data()), 16)),
            "000102030405060708090a0b0c0d0e0f");
}

TEST(Encryption, ABlobSealedOpensOnlyWithAKeyAndAnyChangeIsCaught) {
  Pkey alice = NewRsaKey(), eve = NewRsaKey();
  std::array<unsigned char, kTenantSecretBytes> secret{};
  std::string plain = "memory of a process, 64 bytes or so, that nobody else may read.";
  std::string digest = "sha256:" + Sha256Hex(plain);
  LayerSecrets s{DeriveLayerKey(secret, digest), digest};
  std::string cipher = plain;
  ApplyKeystream(s.key, 0, cipher.data(), cipher.size());
  LayerMac mac(s.key);
  mac.Update(cipher.data(), cipher.size());
  auto enc = SealAnnotations(s, mac.Final(), {alice});
  ASSERT_TRUE(enc.ok());
  EXPECT_TRUE(Base64Decode(enc->keys_jwe).has_value());

  auto none = OpenAnnotations(*enc, nullptr, "reg/x:1");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("`reg/x:1` is encrypted"), std::string::npos);
  DecryptionKeys wrong{{eve}};
  auto other = OpenAnnotations(*enc, &wrong, "reg/x:1");
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.status().message().find("encrypted for other recipients"), std::string::npos);

  DecryptionKeys right{{eve, alice}};
  auto opened = OpenAnnotations(*enc, &right, "reg/x:1");
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(*DecryptBlob(*opened, cipher, "reg/x:1", "chunk c"), plain);

  std::string flipped = cipher;
  flipped[10] ^= 1;
  auto bad = DecryptBlob(*opened, flipped, "reg/x:1", "chunk c");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kCorruption);
  EXPECT_NE(bad.status().message().find("HMAC"), std::string::npos);

  // A chunk: the same, but its plaintext is left to its name's check; a
  // flipped byte of its ciphertext is its HMAC's.
  EXPECT_EQ(*DecryptChunk(*opened, cipher, "reg/x:1", "chunk c"), plain);
  auto flipped_chunk = DecryptChunk(*opened, flipped, "reg/x:1", "chunk c");
  ASSERT_FALSE(flipped_chunk.ok());
  EXPECT_NE(flipped_chunk.status().message().find("chunk c does not match its HMAC"), std::string::npos);
  OpenedBlob other_digest = *opened;
  other_digest.secrets.plain_digest = "sha256:" + std::string(64, '0');
  EXPECT_TRUE(DecryptChunk(other_digest, cipher, "reg/x:1", "chunk c").ok());
  EXPECT_NE(DecryptBlob(other_digest, cipher, "reg/x:1", "gpusnap.json").status().message().find("decrypts to bytes of"),
            std::string::npos);
  std::string big(3 << 20, 'm');  // blocks of 1 MiB: the keystream and the MAC across them
  LayerKey big_key = DeriveLayerKey(secret, "sha256:" + Sha256Hex(big));
  std::string big_cipher = big;
  ApplyKeystream(big_key, 0, big_cipher.data(), big_cipher.size());
  LayerMac big_mac(big_key);
  big_mac.Update(big_cipher.data(), big_cipher.size());
  OpenedBlob big_opened{{big_key, "sha256:" + Sha256Hex(big)}, big_mac.Final()};
  EXPECT_EQ(*DecryptChunk(big_opened, big_cipher, "reg/x:1", "chunk big"), big);
  // As a pull streams it: pieces of odd sizes, each decrypted into one buffer as it comes.
  for (bool flip : {false, true}) {
    std::string arriving = big_cipher;
    if (flip) arriving[(2 << 20) + 5] ^= 1;
    std::string buf(arriving.size(), '\0');
    ChunkDecryption streamed(big_opened, buf.data());
    for (size_t at = 0, piece = 1; at < arriving.size(); at += piece, piece = piece * 7 % 300001 + 1)
      streamed.Take(arriving.data() + at, std::min(piece, arriving.size() - at));
    Status finished = streamed.Finish("reg/x:1", "chunk big");
    if (flip) {
      EXPECT_EQ(finished.code(), Code::kCorruption);
      EXPECT_NE(finished.message().find("chunk big does not match its HMAC"), std::string::npos);
    } else {
      EXPECT_TRUE(finished.ok()) << finished.ToString();
      EXPECT_EQ(buf, big);
    }
  }
  {
    // Given up part way (the registry went away): the thread that decrypts
    // behind stops with it, and what it had is decrypted.
    std::string buf(big_cipher.size(), '\0');
    {
      ChunkDecryption abandoned(big_opened, buf.data());
      abandoned.Take(big_cipher.data(), (2 << 20) + 17);
    }
    EXPECT_EQ(buf.substr(0, 2 << 20), big.substr(0, 2 << 20));
  }

  // Streamed in pieces, part of it replayed as a resumed download does.
  BlobDecryption d(*opened, PlainDigestCheck::kHere);
  std::string out = plain.substr(0, 20);
  std::string replay = out;
  d.Replay(0, replay.data(), replay.size());
  EXPECT_EQ(replay, cipher.substr(0, 20));
  d.Decrypt(20, cipher.data() + 20, cipher.size() - 20, out);
  EXPECT_EQ(out, plain);
  EXPECT_TRUE(d.Verify("reg/x:1", "file f").ok());

  // A file's plaintext digest in its key's options is checked here unless
  // the caller checks the plaintext itself; its HMAC is checked either way.
  for (PlainDigestCheck check : {PlainDigestCheck::kHere, PlainDigestCheck::kByCaller}) {
    BlobDecryption claimed_other(other_digest, check);
    std::string decrypted;
    claimed_other.Decrypt(0, cipher.data(), cipher.size(), decrypted);
    EXPECT_EQ(decrypted, plain);
    Status verified = claimed_other.Verify("reg/x:1", "file f");
    if (check == PlainDigestCheck::kHere) {
      EXPECT_NE(verified.message().find("file f decrypts to bytes of"), std::string::npos) << verified.ToString();
    } else {
      EXPECT_TRUE(verified.ok()) << verified.ToString();
    }
    BlobDecryption tampered(*opened, check);
    decrypted.clear();
    tampered.Decrypt(0, flipped.data(), flipped.size(), decrypted);
    EXPECT_NE(tampered.Verify("reg/x:1", "file f").message().find("file f does not match its HMAC"), std::string::npos);
  }
}

TEST(Encryption, AKeystreamAppliedPieceByPieceIsTheOneShotOneWhereverThePiecesStart) {
  LayerKey k = KeyOf(std::string(64, '7'), "00000000000000000000000000fffff0");
  std::string whole(1 << 20, 'p');
  for (size_t i = 0; i < whole.size(); ++i) whole[i] = char(i * 31 % 251);
  std::string expected = whole;
  ApplyKeystream(k, 0, expected.data(), expected.size());
  // Pieces in order, of odd sizes (as the network delivers them), then a
  // step back to a resumed offset and a jump ahead.
  Keystream stream(k);
  std::string got = whole;
  size_t at = 0;
  for (size_t piece = 1; at < 700000; at += piece, piece = piece * 5 % 40009 + 3)
    stream.Apply(at, got.data() + at, std::min(piece, got.size() - at));
  EXPECT_EQ(got.substr(0, at), expected.substr(0, at));
  std::string again = whole.substr(100003, 5000);
  stream.Apply(100003, again.data(), again.size());
  EXPECT_EQ(again, expected.substr(100003, 5000));
  std::string ahead = whole.substr(900017, 4096);
  stream.Apply(900017, ahead.data(), ahead.size());
  EXPECT_EQ(ahead, expected.substr(900017, 4096));
  std::string next = whole.substr(900017 + 4096, 17);
  stream.Apply(900017 + 4096, next.data(), next.size());
  EXPECT_EQ(next, expected.substr(900017 + 4096, 17));
}

TEST(Jwe, RsaAndEcRecipientsEachOpenItAndNoOtherKeyDoes) {
  Pkey alice = NewRsaKey(), bob = NewEcKey("P-256"), carol = NewEcKey("P-521"), dave = NewEcKey("P-384");
  Pkey eve = NewRsaKey(), mallory = NewEcKey("P-256", 1);
  auto jwe = JweEncrypt("the payload", {alice, bob, carol, dave});
  ASSERT_TRUE(jwe.ok()) << jwe.status().ToString();
  auto parsed = nlohmann::json::parse(*jwe);
  ASSERT_EQ(parsed["recipients"].size(), 4u);
  EXPECT_EQ(parsed["recipients"][0]["header"]["alg"], "RSA-OAEP");
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(parsed["recipients"][i]["header"]["alg"], "ECDH-ES+A256KW");
    EXPECT_EQ(parsed["recipients"][i]["header"]["epk"]["kty"], "EC");  // an ephemeral key per recipient
  }
  EXPECT_EQ(parsed["recipients"][2]["header"]["epk"]["crv"], "P-521");
  for (const Pkey& k : {alice, bob, carol, dave}) EXPECT_EQ(*JweDecrypt(*jwe, {k}), "the payload");
  EXPECT_EQ(*JweDecrypt(*jwe, {mallory, eve, carol}), "the payload");
  auto refused = JweDecrypt(*jwe, {eve, mallory});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kFailedPrecondition);

  // A changed wrapped key opens for no one of that recipient; the others still open it.
  nlohmann::json altered = parsed;
  std::string wrapped = altered["recipients"][1]["encrypted_key"];
  wrapped[3] = wrapped[3] == 'A' ? 'B' : 'A';
  altered["recipients"][1]["encrypted_key"] = wrapped;
  EXPECT_FALSE(JweDecrypt(altered.dump(), {bob}).ok());
  EXPECT_TRUE(JweDecrypt(altered.dump(), {carol}).ok());
  // Another ephemeral key (the same curve) derives another wrapping key.
  altered = parsed;
  altered["recipients"][1]["header"]["epk"] = parsed["recipients"][3]["header"]["epk"];
  EXPECT_FALSE(JweDecrypt(altered.dump(), {bob}).ok());
}

TEST(Jwe, AnEcJweOfAnotherImplementationOpens) {
  auto key = ParsePrivateKeysPem(kOtherEcPrivateKeyPem, "test key");
  ASSERT_TRUE(key.ok()) << key.status().ToString();
  EXPECT_TRUE(key->front().is_ec());
  auto payload = JweDecrypt(kOtherEcJwe, *key);
  ASSERT_TRUE(payload.ok()) << payload.status().ToString();
  auto secrets = ParsePrivateOptions(*payload);
  ASSERT_TRUE(secrets.ok());
  std::string cd;
  for (int i = 0; i < 32; ++i) cd += "cd";
  EXPECT_EQ(secrets->plain_digest, "sha256:" + cd);
  EXPECT_FALSE(JweDecrypt(kOtherEcJwe, {NewEcKey("P-384")}).ok());
}

TEST(Jwe, OnlyOcicryptsAlgorithmsAreSpokenAndNothingCompressed) {
  Pkey alice = NewRsaKey();
  auto parsed = nlohmann::json::parse(*JweEncrypt("the payload", {alice}));
  // The same wrapped key claimed as RSA1_5 (PKCS#1 v1.5, open to padding oracles): not tried.
  nlohmann::json v15 = parsed;
  v15["recipients"][0]["header"]["alg"] = "RSA1_5";
  EXPECT_EQ(JweDecrypt(v15.dump(), {alice}).status().code(), Code::kFailedPrecondition);
  // A compressed payload could be any size once inflated.
  nlohmann::json zipped = parsed;
  zipped["unprotected"] = {{"zip", "DEF"}};
  auto refused = JweDecrypt(zipped.dump(), {alice});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), Code::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("zip"), std::string::npos);
  nlohmann::json other_enc = parsed;
  other_enc["unprotected"] = {{"enc", "XC20P"}};
  EXPECT_EQ(JweDecrypt(other_enc.dump(), {alice}).status().code(), Code::kInvalidArgument);
}

TEST(Jwe, KeysParseFromPemTextsOfSeveralKeysAndOtherTypesAreRefused) {
  Pkey rsa = NewRsaKey(), ec = NewEcKey("P-256");
  std::string publics = PemOf(rsa.get(), false) + PemOf(ec.get(), false);
  auto pubs = ParsePublicKeysPem(publics, "Secret a/gpusnap `encryption-recipients.pem`");
  ASSERT_TRUE(pubs.ok()) << pubs.status().ToString();
  ASSERT_EQ(pubs->size(), 2u);
  EXPECT_FALSE((*pubs)[0].is_ec());
  EXPECT_TRUE((*pubs)[1].is_ec());
  // `openssl ecparam -genkey` writes the curve's parameters first: skipped.
  std::string privates = "-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n" +
                         PemOf(ec.get(), true) + PemOf(rsa.get(), true);
  auto privs = ParsePrivateKeysPem(privates, "k");
  ASSERT_TRUE(privs.ok()) << privs.status().ToString();
  ASSERT_EQ(privs->size(), 2u);
  auto jwe = JweEncrypt("x", *pubs);
  EXPECT_EQ(*JweDecrypt(*jwe, {(*privs)[0]}), "x");
  EXPECT_EQ(*JweDecrypt(*jwe, {(*privs)[1]}), "x");

  auto refused = [](const Result<std::vector<Pkey>>& r, std::string_view needle) {
    EXPECT_FALSE(r.ok());
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
      EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
      EXPECT_EQ(r.status().message().find("MII"), std::string::npos) << r.status().message();  // no key bytes
    }
  };
  refused(ParsePublicKeysPem(PemOf(rsa.get(), true), "f.pem"), "f.pem holds a PEM `PRIVATE KEY`, not a public key");
  refused(ParsePrivateKeysPem(PemOf(rsa.get(), false), "f.pem"), "not a private key");
  refused(ParsePrivateKeysPem(PemOf(ec.get(), true, "passphrase"), "f.pem"), "passphrase-protected");
  refused(ParsePublicKeysPem("no PEM here", "f.pem"), "f.pem holds no PEM key");
  Pkey ed(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
  refused(ParsePublicKeysPem(PemOf(ed.get(), false), "f.pem"), "of type ED25519");
  Pkey k1(EVP_EC_gen("secp256k1"));
  refused(ParsePrivateKeysPem(PemOf(k1.get(), true), "f.pem"), "EC secp256k1");
  std::string cut = PemOf(rsa.get(), false);
  cut.erase(cut.size() / 2, 10);
  refused(ParsePublicKeysPem(cut, "f.pem"), "does not parse");
}

TEST(Encryption, TheTenantSecretIsTheDigestOfAtLeast32Bytes) {
  auto a = TenantSecretOf(std::string(32, 's'), "s"), b = TenantSecretOf(std::string(33, 's'), "s");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(Hex(std::string_view(reinterpret_cast<const char*>(a->data()), 32)), Sha256Hex(std::string(32, 's')));
  auto short_one = TenantSecretOf("0123456789", "Secret a/gpusnap `encryption-secret`");
  ASSERT_FALSE(short_one.ok());
  EXPECT_EQ(short_one.status().message(),
            "Secret a/gpusnap `encryption-secret` holds 10 bytes; at least 32 are needed");
}

TEST(Encryption, KeysComeFromOwnerOnlyFilesAndNeverIntoErrors) {
  char dir[] = "/tmp/gpusnap-keys-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  std::string path = std::string(dir) + "/key.pem";
  std::ofstream(path) << kOtherPrivateKeyPem;
  ::chmod(path.c_str(), 0640);
  auto open_to_group = ReadDecryptionKeys({path});
  ASSERT_FALSE(open_to_group.ok());
  EXPECT_NE(open_to_group.status().message().find("mode 0640"), std::string::npos);
  ::chmod(path.c_str(), 0600);
  EXPECT_TRUE(ReadDecryptionKeys({path}).ok());
  // A public key where a private one belongs: refused, naming the file, not quoting it.
  std::string pem = std::string(kOtherPrivateKeyPem);
  std::ofstream(path) << pem.substr(0, pem.size() / 2);
  auto broken = ReadDecryptionKeys({path});
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find(path), std::string::npos);
  EXPECT_EQ(broken.status().message().find(pem.substr(40, 20)), std::string::npos);

  auto scheme = ReadEncryptionKeys({"pgp:" + path}, "");
  ASSERT_FALSE(scheme.ok());
  EXPECT_NE(scheme.status().message().find("jwe:"), std::string::npos);
  std::string secret = std::string(dir) + "/secret";
  std::ofstream(secret) << std::string(40, 's');
  ::chmod(secret.c_str(), 0604);
  std::string pub = std::string(dir) + "/pub.pem";
  {
    Pkey k = NewRsaKey();
    FILE* f = std::fopen(pub.c_str(), "w");
    PEM_write_PUBKEY(f, k.get());
    std::fclose(f);
  }
  auto readable = ReadEncryptionKeys({"jwe:" + pub}, secret);
  ASSERT_FALSE(readable.ok());
  EXPECT_NE(readable.status().message().find("mode 0604"), std::string::npos);
  ::chmod(secret.c_str(), 0600);
  auto a = ReadEncryptionKeys({"jwe:" + pub}, secret), b = ReadEncryptionKeys({"jwe:" + pub}, secret);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->secret, (*b)->secret);  // one secret file, one tenant: the same blob keys
  auto fresh1 = ReadEncryptionKeys({"jwe:" + pub}, ""), fresh2 = ReadEncryptionKeys({"jwe:" + pub}, "");
  EXPECT_NE((*fresh1)->secret, (*fresh2)->secret);
  std::system((std::string("rm -rf ") + dir).c_str());
}

}  // namespace
}  // namespace gpusnap::registry
