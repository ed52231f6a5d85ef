#include "agent/service/namespace_keys.h"

#include <fmt/format.h>
#include <openssl/crypto.h>

#include "k8s/kubeconfig.h"
#include "util/files.h"

namespace gpusnap::agent {

namespace {

using nlohmann::json;

// A private key file or a secret file is small: a bound keeps a wrong path
// (a device, a log) from being read whole.
constexpr uint64_t kMaxKeyFileBytes = 1 << 20;

// A Secret's data value, decoded; none when the Secret lacks the key.
Result<std::optional<std::string>> SecretData(const json& secret, const char* key, std::string_view name) {
  auto data = secret.is_object() ? secret.find("data") : secret.end();
  if (data == secret.end() || !data->is_object() || !data->contains(key)) return std::optional<std::string>();
  const json& value = (*data)[key];
  auto bytes = value.is_string() ? k8s::Base64Decode(value.get<std::string>()) : Result<std::string>(Status::Ok());
  if (!value.is_string() || !bytes.ok())
    return Status::Error(Code::kInvalidArgument, "{}: its `{}` is not base64", name, key);
  return std::optional<std::string>(std::move(bytes).value());
}

// `text` given to `parse`, then wiped.
template <typename Parse>
auto ParseAndWipe(std::string& text, Parse parse) {
  auto parsed = parse(text);
  OPENSSL_cleanse(text.data(), text.size());
  return parsed;
}

}  // namespace

Result<KeyMaterial> KeysOfSecret(const json& secret, std::string_view name) {
  KeyMaterial keys;
  auto what = [name](const char* key) { return fmt::format("{} `{}`", name, key); };
  GPUSNAP_ASSIGN_OR_RETURN(auto decryption, SecretData(secret, kSecretDecryptionKeys, name));
  if (decryption) {
    GPUSNAP_ASSIGN_OR_RETURN(keys.decryption, ParseAndWipe(*decryption, [&](const std::string& pem) {
                               return registry::ParsePrivateKeysPem(pem, what(kSecretDecryptionKeys));
                             }));
  }
  GPUSNAP_ASSIGN_OR_RETURN(auto recipients, SecretData(secret, kSecretEncryptionRecipients, name));
  if (recipients) {
    GPUSNAP_ASSIGN_OR_RETURN(keys.recipients,
                             registry::ParsePublicKeysPem(*recipients, what(kSecretEncryptionRecipients)));
  }
  GPUSNAP_ASSIGN_OR_RETURN(auto tenant_secret, SecretData(secret, kSecretEncryptionSecret, name));
  if (tenant_secret) {
    GPUSNAP_ASSIGN_OR_RETURN(keys.secret, ParseAndWipe(*tenant_secret, [&](const std::string& bytes) {
                               return registry::TenantSecretOf(bytes, what(kSecretEncryptionSecret));
                             }));
  }
  return keys;
}

Result<KeyMaterial> ReadKeyFiles(const tenancy::KeyFiles& files, std::string_view ns) {
  KeyMaterial keys;
  auto what = [ns](const char* member, const std::string& path) {
    return fmt::format("`{}` ({} of namespace `{}` in the tenancy configuration)", path, member, ns);
  };
  for (const std::string& path : files.decryption_keys) {
    GPUSNAP_ASSIGN_OR_RETURN(std::string pem, ReadOwnerOnlyFile(path, fmt::format("namespace `{}`'s decryptionKeys", ns), kMaxKeyFileBytes));
    GPUSNAP_ASSIGN_OR_RETURN(auto parsed, ParseAndWipe(pem, [&](const std::string& text) {
                               return registry::ParsePrivateKeysPem(text, what("decryptionKeys", path));
                             }));
    keys.decryption.insert(keys.decryption.end(), parsed.begin(), parsed.end());
  }
  for (const std::string& path : files.encryption_recipients) {
    auto pem = ReadFile(path);
    if (!pem.ok()) return pem.status().Wrap(fmt::format("namespace `{}`'s encryptionRecipients", ns));
    GPUSNAP_ASSIGN_OR_RETURN(auto parsed, registry::ParsePublicKeysPem(*pem, what("encryptionRecipients", path)));
    keys.recipients.insert(keys.recipients.end(), parsed.begin(), parsed.end());
  }
  if (!files.encryption_secret.empty()) {
    GPUSNAP_ASSIGN_OR_RETURN(std::string bytes, ReadOwnerOnlyFile(files.encryption_secret,
                                                                  fmt::format("namespace `{}`'s encryptionSecretFile", ns),
                                                                  kMaxKeyFileBytes));
    GPUSNAP_ASSIGN_OR_RETURN(keys.secret, ParseAndWipe(bytes, [&](const std::string& text) {
                               return registry::TenantSecretOf(text,
                                                               what("encryptionSecretFile", files.encryption_secret));
                             }));
  }
  return keys;
}

Result<NamespaceKeys> CombineNamespaceKeys(const KeyMaterial& own, const KeyMaterial& administrators,
                                           std::string_view ns) {
  NamespaceKeys out;
  auto decryption = std::make_shared<DecryptionKeys>();
  decryption->keys = own.decryption;
  decryption->keys.insert(decryption->keys.end(), administrators.decryption.begin(), administrators.decryption.end());
  decryption->given = fmt::format("decryption keys of namespace `{}`", ns);
  decryption->give = fmt::format("namespace `{}` a decryption key (`{}` in its Secret `gpusnap`, or decryptionKeys in "
                                 "the administrator's tenancy configuration)",
                                 ns, kSecretDecryptionKeys);
  out.decryption = std::move(decryption);
  if (own.recipients.empty() && administrators.recipients.empty()) return out;
  const auto& secret = own.secret ? own.secret : administrators.secret;
  if (!secret)
    return Status::Error(Code::kInvalidArgument,
                         "namespace `{}` has encryption recipients but no encryption secret, from which its blobs' "
                         "keys derive: give `{}` in its Secret `gpusnap`, or encryptionSecretFile in the "
                         "administrator's tenancy configuration",
                         ns, kSecretEncryptionSecret);
  auto encryption = std::make_shared<EncryptionKeys>();
  encryption->recipients = own.recipients;
  encryption->recipients.insert(encryption->recipients.end(), administrators.recipients.begin(),
                                administrators.recipients.end());
  encryption->secret = *secret;
  out.encryption = std::move(encryption);
  return out;
}

}  // namespace gpusnap::agent
