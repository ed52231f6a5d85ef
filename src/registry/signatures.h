// Sigstore signatures in a registry (sigstore.h's formats): reading a
// manifest's signatures (which a pull judges by the trust policy before it
// fetches anything else: sources.h), and adding a signature to a manifest
// pushed.
#pragma once

#include <string>

#include "gpusnap/status.h"
#include "registry/client.h"
#include "registry/sigstore.h"
#include "registry/trust_policy.h"

namespace gpusnap::registry {

// Every signature the attachment of `manifest_digest` in `repo` carries
// (none when it has no attachment), each payload checked against its digest.
Result<std::vector<FetchedSignature>> FetchSignatures(RegistryClient& client, const std::string& repo,
                                                      const std::string& manifest_digest);

// Signs `manifest_digest` as `ref` (its tag or digest as the identity) and
// adds the signature to its attachment (kept: the signatures already there).
Status SignManifest(RegistryClient& client, const Reference& ref, const std::string& manifest_digest,
                    const SigningKey& key);

}  // namespace gpusnap::registry
