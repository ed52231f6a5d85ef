// The key formats, the payload and the attachment of sigstore.h. The
// encrypted key is cosign's format, made with Python's hashlib.scrypt and
// PyNaCl's SecretBox (as tests/e2e/test_registry_trust.py makes its keys),
// so that the decryption is checked against another implementation.
#include "registry/sigstore.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "util/files.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::registry {
namespace {

constexpr const char* kCosignKey = R"(-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----
eyJrZGYiOiB7Im5hbWUiOiAic2NyeXB0IiwgInBhcmFtcyI6IHsiTiI6IDMyNzY4
LCAiciI6IDgsICJwIjogMX0sICJzYWx0IjogIkNwUWVWWlJ4NFZBUkZmQVlHQ1lT
cGUySkgxZi9BbkJYN2hkYWZWME1XWnc9In0sICJjaXBoZXIiOiB7Im5hbWUiOiAi
bmFjbC9zZWNyZXRib3giLCAibm9uY2UiOiAiMk0vcm16ZWFhSjZITXkrWWRZZFd0
TWRCdjFQSFBUdDAifSwgImNpcGhlcnRleHQiOiAidkdUeUFPQ3BDMmllblRpMTJM
Q3Uvd3ZMdU1kaFhXZkc0dkk5NWVjZitKQ01Xdy9PT2gvYVgwTUZqS3FwN09Lb2Fa
YjA5Q2tDYldLVEZjWi9wb0lDdmw2Sm9xWTlKdkxHTm9lcy9oMWhpZmRpOWRTUWx6
NG84ZGxVdHZtOCtycnRuUWZzcDlkZG9ldzFnREp5TUw3OXBJZlFlVk9FSjdRL21I
aGxkdm1RdHdMTk9EZGpKM0E0MFZ6V3Fld2d5YzJjeFArSDRFK0xiTE1kOWc9PSJ9
-----END ENCRYPTED SIGSTORE PRIVATE KEY-----
)";
constexpr const char* kCosignPassphrase = "correct horse";
constexpr const char* kCosignPublicKey = R"(-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE08GXd80lP8YjeZYOQ0j1n7wDyZFl
D3gQD3Q3urKfgAB9pB9/lrC7zHa5fjPeU0xa4C+yROW2urgvSs0/Jt8dVg==
-----END PUBLIC KEY-----
)";
constexpr const char* kP384Key = R"(-----BEGIN PRIVATE KEY-----
MIG2AgEAMBAGByqGSM49AgEGBSuBBAAiBIGeMIGbAgEBBDAXmGuuwHgk7RHzSbba
BHdyJuSecI3DzLRwdi4LeFnRt6mCDEFgUoukQ6SPFlyNXF6hZANiAARbh/f99EI/
95mMjsiauWkyeHjXKj3EpEBIlszwwKWogIW5m6gh1nlc+Z3XrAFTBm+A9dJzI7qV
bVy9IleyblvEuFSkVXF2/Yue+cW0I3Tci7SPjHVEgUHYU3P38xVpvUQ=
-----END PRIVATE KEY-----
)";

constexpr const char* kPkcs8Key = R"(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgBDCwhDax59JIkJqb
wXWF65AHBOBQJCwIxixNCg0m4/KhRANCAATpFvyRaveOBb3NY+do72z9CeJ1Mdy8
rwYolu8eA5zIc/EV8Jvu51wYxRpm3lApPPQU9znX7BgOxHWjl6RvZPiM
-----END PRIVATE KEY-----
)";

constexpr const char* kDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

TEST(Sigstore, CosignsEncryptedKeyOpensWithItsPassphraseAndSignsForItsPublicKey) {
  auto key = SigningKey::Parse(kCosignKey, kCosignPassphrase);
  ASSERT_TRUE(key.ok()) << key.status().message();
  auto pub = VerifyingKey::Parse(kCosignPublicKey);
  ASSERT_TRUE(pub.ok()) << pub.status().message();
  std::string payload = SignaturePayload({"127.0.0.1:5000/team/snap:v1", kDigest}, 1700000000);
  auto sig = key->Sign(payload);
  ASSERT_TRUE(sig.ok());
  EXPECT_TRUE(pub->Verifies(payload, *sig));
  EXPECT_FALSE(pub->Verifies(payload + " ", *sig));
  EXPECT_EQ(key->PublicKeyPem(), kCosignPublicKey);
}

TEST(Sigstore, AWrongPassphraseOrNoneIsRefusedWithoutQuotingTheKey) {
  auto wrong = SigningKey::Parse(kCosignKey, "battery staple");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("does not open with the passphrase"), std::string::npos);
  auto none = SigningKey::Parse(kCosignKey, "");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("--sign-passphrase-file"), std::string::npos);
  for (const Status& s : {wrong.status(), none.status()})
    EXPECT_EQ(s.message().find("eyJrZGYi"), std::string::npos) << s.message();
}

TEST(Sigstore, APlainPkcs8KeySignsAndOnlyP256IsTaken) {
  auto plain = SigningKey::Parse(kPkcs8Key, "");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  auto pub = VerifyingKey::Parse(plain->PublicKeyPem());
  ASSERT_TRUE(pub.ok());
  auto sig = plain->Sign("payload");
  ASSERT_TRUE(sig.ok());
  EXPECT_TRUE(pub->Verifies("payload", *sig));
  auto cosign_pub = VerifyingKey::Parse(kCosignPublicKey);
  ASSERT_TRUE(cosign_pub.ok());
  EXPECT_FALSE(cosign_pub->Verifies("payload", *sig));
  auto p384 = SigningKey::Parse(kP384Key, "");
  ASSERT_FALSE(p384.ok());
  EXPECT_NE(p384.status().message().find("not an ECDSA P-256 key"), std::string::npos);
  auto garbage = SigningKey::Parse("not a key", "");
  EXPECT_FALSE(garbage.ok());
  auto pub_as_private = SigningKey::Parse(kCosignPublicKey, "");
  ASSERT_FALSE(pub_as_private.ok());
  EXPECT_NE(pub_as_private.status().message().find("PUBLIC KEY"), std::string::npos);
}

TEST(Sigstore, ThePayloadReadsBackAndOthersAreRefused) {
  SignedClaim claim{"127.0.0.1:5000/team/snap:v1", kDigest};
  auto back = ParseSignaturePayload(SignaturePayload(claim, 1));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, claim);
  // cosign's own payload: "optional": null
  auto cosign = ParseSignaturePayload(
      R"({"critical":{"identity":{"docker-reference":"r.example/a:b"},"image":{"docker-manifest-digest":"sha256:aa"},)"
      R"("type":"cosign container image signature"},"optional":null})");
  ASSERT_TRUE(cosign.ok());
  EXPECT_EQ(cosign->docker_reference, "r.example/a:b");
  EXPECT_FALSE(ParseSignaturePayload(R"({"critical":{"type":"atomic container signature"}})").ok());
  EXPECT_FALSE(ParseSignaturePayload("[]").ok());
}

TEST(Sigstore, TheAttachmentIsTaggedByTheDigestAndReadsBack) {
  EXPECT_EQ(SignatureAttachmentTag(kDigest),
            "sha256-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.sig");
  SignatureAttachment a;
  a.layers.push_back({{kDigest, 200, {}}, kSignaturePayloadMediaType, "MEUCIQ=="});
  std::string config = SignatureAttachmentConfig(a.layers);
  EXPECT_NE(config.find(kDigest), std::string::npos);
  a.config = {kDigest, config.size(), {}};
  auto back = ParseSignatureAttachment(SignatureAttachmentManifest(a));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->config, a.config);
  EXPECT_EQ(back->layers, a.layers);
}

TEST(Sigstore, AKeyFileOthersMayReadIsRefusedNamingItsMode) {
  TempDir dir("sigstore-key");
  std::string path = dir.path() + "/key.pem";
  ASSERT_TRUE(WriteFileSynced(path, kPkcs8Key).ok());
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  auto open_to_all = LoadSigningKey(path, "");
  ASSERT_FALSE(open_to_all.ok());
  EXPECT_NE(open_to_all.status().message().find("mode 0644"), std::string::npos) << open_to_all.status().message();
  EXPECT_EQ(open_to_all.status().message().find("BEGIN"), std::string::npos);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  EXPECT_TRUE(LoadSigningKey(path, "").ok());
}

}  // namespace
}  // namespace gpusnap::registry
