#include "agent/service/namespace_keys.h"

#include <gtest/gtest.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include <fstream>

#include "k8s/admission.h"
#include "util/temp_dir_testing.h"

namespace gpusnap::agent {
namespace {

using nlohmann::json;

std::string PemOf(EVP_PKEY* key, bool private_part) {
  BIO* bio = BIO_new(BIO_s_mem());
  if (private_part)
    PEM_write_bio_PrivateKey(bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  else
    PEM_write_bio_PUBKEY(bio, key);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string out(data, size_t(n));
  BIO_free(bio);
  return out;
}

// Two key pairs for the suite (an RSA key takes a while to make).
const registry::Pkey& Rsa() {
  static registry::Pkey key(EVP_RSA_gen(2048));
  return key;
}
const registry::Pkey& Ec() {
  static registry::Pkey key(EVP_EC_gen("P-256"));
  return key;
}

json SecretWith(const std::map<std::string, std::string>& data) {
  json d = json::object();
  for (const auto& [k, v] : data) d[k] = k8s::Base64Encode(v);
  return {{"kind", "Secret"}, {"type", "Opaque"}, {"data", d}};
}

constexpr std::string_view kName = "Secret team-a/gpusnap";

TEST(NamespaceKeys, TheSecretsKeysAreParsedEachOptional) {
  std::string secret_bytes(40, 'k');
  auto keys = KeysOfSecret(SecretWith({{kSecretDecryptionKeys, PemOf(Rsa().get(), true) + PemOf(Ec().get(), true)},
                                       {kSecretEncryptionRecipients, PemOf(Ec().get(), false)},
                                       {kSecretEncryptionSecret, secret_bytes},
                                       {".dockerconfigjson", "{}"}}),
                           kName);
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(keys->decryption.size(), 2u);
  ASSERT_EQ(keys->recipients.size(), 1u);
  EXPECT_TRUE(keys->recipients[0].is_ec());
  ASSERT_TRUE(keys->secret.has_value());
  EXPECT_EQ(*keys->secret, *registry::TenantSecretOf(secret_bytes, "s"));

  auto none = KeysOfSecret(SecretWith({}), kName);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->decryption.empty() && none->recipients.empty() && !none->secret);
  EXPECT_TRUE(KeysOfSecret(json{{"kind", "Secret"}, {"type", "Opaque"}}, kName).ok());  // no data at all
}

TEST(NamespaceKeys, ABadKeyNamesTheSecretAndItsDataKeyNeverTheBytes) {
  std::string private_pem = PemOf(Rsa().get(), true);
  auto refused = [](const json& secret, std::string_view needle) {
    auto r = KeysOfSecret(secret, kName);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArgument);
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find("MII"), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find("0123456789"), std::string::npos) << r.status().message();
  };
  refused(SecretWith({{kSecretEncryptionRecipients, private_pem}}),
          "Secret team-a/gpusnap `encryption-recipients.pem` holds a PEM `PRIVATE KEY`, not a public key");
  refused(SecretWith({{kSecretDecryptionKeys, PemOf(Rsa().get(), false)}}),
          "Secret team-a/gpusnap `decryption-key.pem` holds a PEM `PUBLIC KEY`, not a private key");
  refused(SecretWith({{kSecretEncryptionSecret, "0123456789"}}),
          "Secret team-a/gpusnap `encryption-secret` holds 10 bytes; at least 32 are needed");
  json not_base64 = SecretWith({});
  not_base64["data"][kSecretDecryptionKeys] = "!!" + private_pem;
  refused(not_base64, "Secret team-a/gpusnap: its `decryption-key.pem` is not base64");
}

TEST(NamespaceKeys, BothPlacesCombineAndRecipientsNeedASecret) {
  std::array<unsigned char, registry::kTenantSecretBytes> own_secret{}, admin_secret{};
  own_secret[0] = 1;
  admin_secret[0] = 2;
  KeyMaterial own{{Rsa()}, {Ec()}, own_secret};
  KeyMaterial admin{{Ec()}, {Rsa()}, admin_secret};
  auto both = CombineNamespaceKeys(own, admin, "team-a");
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(both->decryption->keys.size(), 2u);
  ASSERT_EQ(both->encryption->recipients.size(), 2u);
  EXPECT_TRUE(both->encryption->recipients[0].is_ec());  // the Secret's, then the administrator's
  EXPECT_EQ(both->encryption->secret, own_secret);       // the Secret's secret first

  auto admins_secret = CombineNamespaceKeys(KeyMaterial{{}, {Ec()}, std::nullopt}, admin, "team-a");
  ASSERT_TRUE(admins_secret.ok());
  EXPECT_EQ(admins_secret->encryption->secret, admin_secret);

  auto none = CombineNamespaceKeys({}, {}, "team-a");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->encryption, nullptr);
  // No key opens anything, and a refusal says whose keys are missing.
  EXPECT_TRUE(none->decryption->keys.empty());
  EXPECT_EQ(none->decryption->given, "decryption keys of namespace `team-a`");
  EXPECT_EQ(none->decryption->give,
            "namespace `team-a` a decryption key (`decryption-key.pem` in its Secret `gpusnap`, or decryptionKeys in "
            "the administrator's tenancy configuration)");
  // A secret alone encrypts nothing; recipients without a secret are refused.
  auto secret_only = CombineNamespaceKeys(KeyMaterial{{}, {}, own_secret}, {}, "team-a");
  ASSERT_TRUE(secret_only.ok());
  EXPECT_EQ(secret_only->encryption, nullptr);
  auto no_secret = CombineNamespaceKeys(KeyMaterial{{}, {Ec()}, std::nullopt}, {}, "team-a");
  ASSERT_FALSE(no_secret.ok());
  EXPECT_EQ(no_secret.status().message(),
            "namespace `team-a` has encryption recipients but no encryption secret, from which its blobs' keys "
            "derive: give `encryption-secret` in its Secret `gpusnap`, or encryptionSecretFile in the "
            "administrator's tenancy configuration");
}

TEST(NamespaceKeys, TheAdministratorsFilesAreReadPrivateOnesOwnerOnly) {
  TempDir tmp("namespace-keys");
  ASSERT_FALSE(tmp.path().empty());
  const std::string& dir = tmp.path();
  auto write = [&](const std::string& name, const std::string& data, mode_t mode) {
    std::string path = dir + "/" + name;
    std::ofstream(path) << data;
    ::chmod(path.c_str(), mode);
    return path;
  };
  tenancy::KeyFiles files{{write("a.pem", PemOf(Ec().get(), true), 0600)},
                          {write("a.pub", PemOf(Rsa().get(), false), 0644)},
                          write("a.secret", std::string(32, 's'), 0400)};
  auto keys = ReadKeyFiles(files, "team-a");
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  EXPECT_EQ(keys->decryption.size(), 1u);
  EXPECT_EQ(keys->recipients.size(), 1u);
  EXPECT_TRUE(keys->secret.has_value());

  ::chmod(files.decryption_keys[0].c_str(), 0640);
  auto readable = ReadKeyFiles(files, "team-a");
  ASSERT_FALSE(readable.ok());
  EXPECT_NE(readable.status().message().find("namespace `team-a`'s decryptionKeys"), std::string::npos)
      << readable.status().message();
  EXPECT_NE(readable.status().message().find("mode 0640"), std::string::npos);
  ::chmod(files.decryption_keys[0].c_str(), 0600);
  ::chmod(files.encryption_secret.c_str(), 0604);
  EXPECT_NE(ReadKeyFiles(files, "team-a").status().message().find("encryptionSecretFile"), std::string::npos);
  ::chmod(files.encryption_secret.c_str(), 0600);
  files.encryption_recipients.push_back(dir + "/gone.pub");
  auto missing = ReadKeyFiles(files, "team-a");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("namespace `team-a`'s encryptionRecipients"), std::string::npos)
      << missing.status().message();
  files.encryption_recipients.back() = write("b.pub", "not a key", 0644);
  auto broken = ReadKeyFiles(files, "team-a");
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("encryptionRecipients of namespace `team-a` in the tenancy configuration"),
            std::string::npos)
      << broken.status().message();
}

}  // namespace
}  // namespace gpusnap::agent
