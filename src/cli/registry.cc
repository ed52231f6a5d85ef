// gpusnap push / pull: snapshots to and from an OCI registry
// (docs/DISTRIBUTION.md). `gpusnap restore REF` pulls as it restores.
#include <cstdio>

#include "cli/cli.h"
#include "cli/progress.h"
#include "cli/usage.h"
#include "gpusnap/distribution.h"
#include "registry/registries_conf.h"
#include "registry/sigstore.h"
#include "registry/trust_policy.h"

namespace gpusnap::cli {

namespace {

nlohmann::json TransferJson(const TransferResult& r) {
  return {{"id", r.id},
          {"reference", r.reference},
          {"digest", r.manifest_digest},
          {"blobs", r.blobs},
          {"blobs_moved", r.blobs_moved},
          {"blobs_skipped", r.blobs_skipped},
          {"bytes_moved", r.bytes_moved},
          {"bytes_total", r.bytes_total},
          {"seconds", r.seconds},
          {"already_present", r.already_present}};
}

void PrintTransfer(const Context& ctx, const char* verb, const TransferResult& r) {
  if (ctx.json) return ctx.PrintJson(TransferJson(r));
  if (!ctx.quiet) {
    if (r.already_present)
      std::fprintf(stderr, "[%s] %s is already in the store\n", verb, r.id.c_str());
    else
      std::fprintf(stderr, "[%s] %s: %llu of %llu blobs moved (%s), %llu already there, in %.2f s\n", verb,
                   r.id.c_str(), static_cast<unsigned long long>(r.blobs_moved),
                   static_cast<unsigned long long>(r.blobs), HumanBytes(r.bytes_moved).c_str(),
                   static_cast<unsigned long long>(r.blobs_skipped), r.seconds);
  }
  // push: the digest names what was pushed for good; pull: the local id.
  std::printf("%s\n", std::string(verb) == "push" ? r.manifest_digest.c_str() : r.id.c_str());
}

// Push or pull with the store defaulted and the progress shown, then the result.
template <typename Options>
void RunTransfer(Context& ctx, const char* verb, Options o, Result<TransferResult> (*transfer)(const Options&)) {
  o.store = StoreOrDefault(o.store);
  ProgressDisplay progress(ctx, verb);
  o.progress = progress.Fn();
  auto r = transfer(o);
  progress.Finish(r.ok());
  if (!r.ok()) return ctx.Fail(r.status());
  PrintTransfer(ctx, verb, *r);
}

}  // namespace

void AddRegistryFlags(CLI::App& sub, RegistryAccess& access) {
  sub.add_option("--registry-config", access.credentials_file,
                 "Registry credentials: a docker-style config.json (default $DOCKER_CONFIG/config.json, then "
                 "~/.docker/config.json)")
      ->check(CLI::ExistingFile);
  sub.add_option("--ca-file", access.ca_file, "Verify the registry's TLS certificate against this CA only")
      ->check(CLI::ExistingFile);
  sub.add_flag("--plain-http", access.plain_http, "Speak plain HTTP to the registry (no TLS)");
  sub.add_option("--jobs", access.jobs, "Blobs moved at once")->capture_default_str()->check(CLI::Range(1, 64));
  sub.add_option("--registry-timeout", access.timeout_s, "Seconds a registry request may stall")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  sub.add_option("--registry-min-rate", access.min_rate,
                 "Bytes/s a blob must arrive at, at least, over each --registry-timeout (0: no floor)")
      ->capture_default_str();
}

namespace {

// A flag naming a file, read and parsed by `load` where it enters, into `*parsed`.
template <typename T>
void AddParsedFileFlag(CLI::App& sub, const std::string& flag, std::shared_ptr<const T>& parsed,
                       Result<T> (*load)(const std::string&), const std::string& help) {
  sub.add_option_function<std::string>(
      flag, [&parsed, load, flag](const std::string& path) {
        parsed = std::make_shared<const T>(ParsedOrUsageError(load(path), flag));
      },
      help);
}

}  // namespace

void AddTrustFlags(CLI::App& sub, RegistryAccess& access) {
  AddParsedFileFlag(sub, "--policy", access.policy, registry::LoadTrustPolicy,
                    fmt::format("Trust policy of a pull, containers-policy.json (default {}; none there: pulls are "
                                "refused)", registry::kDefaultPolicyPath));
}

void AddRegistriesConfFlag(CLI::App& sub, RegistryAccess& access) {
  AddParsedFileFlag(sub, "--registries-conf", access.registries, registry::LoadRegistriesConf,
                    fmt::format("Mirrors a pull reads from, containers-registries.conf (version 2) (default ${}, "
                                "else {} if there is one; an empty file: none); the signatures are checked for the "
                                "reference named, wherever the bytes come from",
                                registry::kRegistriesConfEnv, registry::kDefaultRegistriesConfPath));
}

// --sign-by-sigstore-private-key KEY [--sign-passphrase-file F]: the key is
// read and opened once the flags are parsed, before anything moves.
std::function<std::shared_ptr<const registry::SigningKey>()> AddSigningFlags(CLI::App& sub) {
  auto key_file = std::make_shared<std::string>();
  auto passphrase_file = std::make_shared<std::string>();
  sub.add_option("--sign-by-sigstore-private-key", *key_file,
                 "Sign the manifest with this ECDSA P-256 key: cosign's encrypted format or a PKCS#8 PEM, mode 0600");
  sub.add_option("--sign-passphrase-file", *passphrase_file,
                 "The passphrase of an encrypted --sign-by-sigstore-private-key (its first line), mode 0600");
  return [key_file, passphrase_file]() -> std::shared_ptr<const registry::SigningKey> {
    if (key_file->empty()) {
      if (!passphrase_file->empty())
        throw CLI::ValidationError("--sign-passphrase-file", "needs --sign-by-sigstore-private-key");
      return nullptr;
    }
    return std::make_shared<const registry::SigningKey>(
        ParsedOrUsageError(registry::LoadSigningKey(*key_file, *passphrase_file), "--sign-by-sigstore-private-key"));
  };
}

void AddDecryptionKeyFlag(CLI::App& sub, RegistryAccess& access) {
  sub.add_option_function<std::vector<std::string>>(
      "--decryption-key",
      [&access](const std::vector<std::string>& files) {
        access.decryption_keys = ParsedOrUsageError(ReadDecryptionKeys(files), "--decryption-key");
      },
      "Open encrypted artifacts with this private key (PEM, RSA, mode 0600; repeatable: any that opens one does)");
}

std::function<Result<std::shared_ptr<const EncryptionKeys>>()> AddEncryptionFlags(CLI::App& sub) {
  auto recipients = std::make_shared<std::vector<std::string>>();
  auto secret_file = std::make_shared<std::string>();
  sub.add_option("--encryption-key", *recipients,
                 "Encrypt every blob for this recipient: jwe:PUBLIC-KEY.pem (RSA, or EC on P-256, P-384 or P-521; "
                 "repeatable), as skopeo does");
  sub.add_option("--encryption-secret-file", *secret_file,
                 "The tenant secret blob keys derive from (mode 0600, at least 32 bytes): pushes under one secret "
                 "share their equal blobs (default: a fresh secret, nothing shared)");
  return [recipients, secret_file]() -> Result<std::shared_ptr<const EncryptionKeys>> {
    if (recipients->empty() && secret_file->empty()) return std::shared_ptr<const EncryptionKeys>();
    return ReadEncryptionKeys(*recipients, *secret_file);
  };
}

void AddRegistry(CLI::App& app, Context& ctx) {
  auto* push = app.add_subcommand("push", "Push a snapshot of the store to an OCI registry");
  auto popts = std::make_shared<PushOptions>();
  push->add_option("id", popts->id, "Snapshot id (see `gpusnap ls`)")->required();
  push->add_option_function<std::string>(
          "reference",
          [popts](const std::string& text) {
            popts->reference = ParsedOrUsageError(ParseRegistryReference(text), "reference");
          },
          "Where to: host[:port]/repository[:tag] (tag default: latest)")
      ->required();
  push->add_option("--store", popts->store, "Snapshot store (default $GPUSNAP_STORE or /var/lib/gpusnap)");
  push->add_option("--mount-from", popts->mount_from,
                   "Another repository of the same registry that may hold the blobs: mounted, not uploaded");
  AddRegistryFlags(*push, popts->access);
  auto encryption = AddEncryptionFlags(*push);
  auto push_key = AddSigningFlags(*push);
  push->footer("Uploads only the blobs the registry lacks, then the manifest (and its signature, when asked). Prints "
               "the manifest's digest.");
  push->callback([&ctx, popts, push_key, encryption] {
    popts->signing_key = push_key();
    auto keys = encryption();
    if (!keys.ok()) return ctx.Fail(keys.status());
    popts->encryption = std::move(keys).value();
    RunTransfer(ctx, "push", *popts, Push);
  });

  auto* sign = app.add_subcommand("sign", "Sign a snapshot already in an OCI registry (a sigstore signature)");
  auto sign_ref = std::make_shared<RegistryReference>();
  auto sign_access = std::make_shared<RegistryAccess>();
  sign->add_option_function<std::string>(
          "reference",
          [sign_ref](const std::string& text) {
            *sign_ref = ParsedOrUsageError(ParseRegistryReference(text), "reference");
          },
          "host[:port]/repository[:tag|@sha256:digest]: the identity the signature names")
      ->required();
  AddRegistryFlags(*sign, *sign_access);
  auto sign_key = AddSigningFlags(*sign);
  sign->footer("Adds a signature of the manifest's digest to its sigstore attachment (sha256-<hex>.sig). Prints the "
               "digest.");
  sign->callback([&ctx, sign_ref, sign_access, sign_key] {
    auto key = sign_key();
    if (!key) throw CLI::RequiredError("--sign-by-sigstore-private-key");
    auto digest = Sign(*sign_ref, *key, *sign_access);
    if (!digest.ok()) return ctx.Fail(digest.status());
    if (ctx.json) return ctx.PrintJson({{"reference", sign_ref->ToString()}, {"digest", *digest}});
    std::printf("%s\n", digest->c_str());
  });

  auto* pull = app.add_subcommand("pull", "Pull a snapshot from an OCI registry into the store");
  auto qopts = std::make_shared<PullOptions>();
  pull->add_option_function<std::string>(
          "reference",
          [qopts](const std::string& text) {
            qopts->reference = ParsedOrUsageError(ParseRegistryReference(text), "reference");
          },
          "host[:port]/repository[:tag|@sha256:digest]")
      ->required();
  pull->add_option("--as", qopts->as_id, "Its id in the store (default: the snapshot's own)");
  pull->add_option("--store", qopts->store, "Snapshot store (default $GPUSNAP_STORE or /var/lib/gpusnap)");
  AddRegistryFlags(*pull, qopts->access);
  AddTrustFlags(*pull, qopts->access);
  AddRegistriesConfFlag(*pull, qopts->access);
  AddDecryptionKeyFlag(*pull, qopts->access);
  pull->footer(
      "Fetches only what the store lacks, checks every digest, and publishes the snapshot at once; an interrupted "
      "pull goes on where it stopped. Prints the snapshot id.");
  pull->callback([&ctx, qopts] { RunTransfer(ctx, "pull", *qopts, Pull); });
}

}  // namespace gpusnap::cli
