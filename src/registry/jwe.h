// The recipients' keys of encrypted artifacts and the JWE (RFC 7516, JSON
// serialization) that wraps each blob's key for them, as ocicrypt (skopeo,
// containerd's imgcrypt) writes and reads it (docs/DISTRIBUTION.md,
// "Encrypted snapshots"):
//
//   RSA keys           RSA-OAEP (SHA-1) written; RSA-OAEP and RSA-OAEP-256 read
//   EC P-256/384/521   ECDH-ES+A256KW written; ECDH-ES+A128KW/A192KW/A256KW read
//   content            A256GCM written; A128/192/256GCM, A128CBC-HS256,
//                      A192CBC-HS384 and A256CBC-HS512 read
//
// libjose does the JWE's content encryption and the ECDH-ES key agreement
// and wrap; RSA-OAEP is OpenSSL's, because Debian 12's libjose is built
// without it (it offers RSA only as RSA1_5, which this file never speaks).
//
// Keys are never logged nor put in an error: errors name `what` (a file, a
// Secret's key), never the bytes.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gpusnap/status.h"

struct evp_pkey_st;

namespace gpusnap::registry {

// One half of a key pair, RSA or EC on P-256, P-384 or P-521, parsed from PEM.
class Pkey {
 public:
  explicit Pkey(evp_pkey_st* key);
  evp_pkey_st* get() const { return key_.get(); }
  bool is_ec() const;

 private:
  std::shared_ptr<evp_pkey_st> key_;
};

// Pure. Every public key of a PEM text: `PUBLIC KEY` blocks
// (SubjectPublicKeyInfo) and certificates' keys, in order. kInvalidArgument
// naming `what` when there is none, a block is neither, or a key is of
// another type or curve.
Result<std::vector<Pkey>> ParsePublicKeysPem(std::string_view pem, std::string_view what);
// Pure. Every private key of a PEM text (PKCS#8, or the traditional RSA and
// EC forms; `EC PARAMETERS` blocks are skipped), in order; a
// passphrase-protected key is refused. kInvalidArgument as above.
Result<std::vector<Pkey>> ParsePrivateKeysPem(std::string_view pem, std::string_view what);

// A JWE of `payload` for each recipient (general serialization): A256GCM
// content encryption, the content key wrapped per recipient, as ocicrypt
// writes it.
Result<std::string> JweEncrypt(std::string_view payload, const std::vector<Pkey>& recipients);
// Pure. The payload of a JWE (general or flattened serialization) that one
// of `keys` opens; kFailedPrecondition when none does, kInvalidArgument when
// it is no JWE or a compressed one (`zip`: its payload could be any size).
Result<std::string> JweDecrypt(std::string_view jwe, const std::vector<Pkey>& keys);

}  // namespace gpusnap::registry
